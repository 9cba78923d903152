"""The ``memengine`` command line: ``demo``, ``inspect``, ``replay``, ``reindex``, ``migrate`` and ``set-aside``.

Each subcommand lives in its own module, which adds its parser and the
function that runs it; this module only builds the top-level parser and
dispatches.
"""

from __future__ import annotations

import argparse
import os
import sys

from .._version import installed_version
from . import demo, exit_status, inspect, migrate, reindex, replay, set_aside
from .output import reader_may_leave

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``memengine`` argument parser, with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="memengine",
        description="memengine: an actor-based memory engine for LLM agents (window + rolling summary).",
        epilog=exit_status.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memengine {installed_version()}")
    subcommands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    demo.add_parser(subcommands)
    inspect.add_parser(subcommands)
    replay.add_parser(subcommands)
    reindex.add_parser(subcommands)
    migrate.add_parser(subcommands)
    set_aside.add_parser(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``memengine`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    The statuses are listed in exit_status.py (and by ``memengine --help``);
    bad arguments exit with status 2, as argparse does. When the reader of
    stdout goes away (``memengine demo | head -3``), the command still does
    all of its work, quietly (see output.py).
    """
    options = build_parser().parse_args(argv)
    try:
        with reader_may_leave():
            return int(options.run(options))
    except KeyboardInterrupt:
        return exit_status.INTERRUPTED
    except BrokenPipeError:  # pragma: no cover - output.py keeps it from reaching here
        # As the Python docs recommend (signal, "Note on SIGPIPE"): no second error when stdout is flushed at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_status.OK
