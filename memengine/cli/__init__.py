"""The ``memengine`` command line: ``memengine demo``, ``inspect``, ``replay``, ``reindex`` and ``migrate``.

Each subcommand lives in its own module, which adds its parser and the
function that runs it; this module only builds the top-level parser and
dispatches.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import demo, inspect, migrate, reindex, replay

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``memengine`` argument parser, with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="memengine",
        description="memengine: an actor-based memory engine for LLM agents (window + rolling summary).",
    )
    subcommands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    demo.add_parser(subcommands)
    inspect.add_parser(subcommands)
    replay.add_parser(subcommands)
    reindex.add_parser(subcommands)
    migrate.add_parser(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``memengine`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Bad arguments exit with status 2, as argparse does.
    """
    options = build_parser().parse_args(argv)
    try:
        return int(options.run(options))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
