"""``memengine export``: write every episode and summary of a tenant (or a prefix, or a session) as JSON lines.

The store is opened read-only (nothing is created, migrated or written) and
read a page at a time (memengine/privacy/export.py), so a tenant of any size
is exported in bounded memory. With ``-o FILE`` the lines go to FILE.partial,
renamed to FILE once complete: a failed export leaves no file that looks
whole. A line per record: ``{"type": "session", ...}`` for each session, then
``{"type": "episode", ...}`` for each of its episodes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

import anyio

from ..privacy.export import ExportStream, write_json_lines
from ..scope import Scope
from ..store.open import open_store
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, first_failure, report
from .scope_arguments import add_scope_options, scope_and_store

DESCRIPTION = (
    "Write every stored episode and the latest summary of each session of one tenant (the sessions 'T/...'), "
    "prefix or session as JSON lines: one session line, then its episodes in order. Read-only."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser("export", help="export a tenant's sessions as JSON lines", description=DESCRIPTION)
    parser.add_argument("db", metavar="STORE", help="a memengine SQLite file, or a postgresql:// URL")
    add_scope_options(parser, "export")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE (must not exist) instead of stdout")
    parser.set_defaults(run=run)


async def export(db: str, scope: Scope, out: TextIO) -> tuple[int, int]:
    """Write the scope's records to ``out``; return how many sessions and episodes were written."""
    async with open_store(db, read_only=True) as store:
        return await write_json_lines(ExportStream(store, scope), out)


def run(options: argparse.Namespace) -> int:
    db: str = options.db
    scope = scope_and_store("export", options)
    if not isinstance(scope, Scope):
        return scope
    target = None if options.output is None else Path(options.output)
    if target is not None and target.exists():
        print(f"memengine export: {target} already exists (export never overwrites a file)", file=sys.stderr)
        return exit_status.USAGE
    partial = None if target is None else target.with_name(target.name + ".partial")
    failure: BaseException | None = None
    written: tuple[int, int] | None = None
    try:
        if partial is None:
            written = anyio.run(export, db, scope, sys.stdout)
        else:
            with open(partial, "w", encoding="utf-8") as out:
                written = anyio.run(export, db, scope, out)
            os.replace(partial, target)  # type: ignore[arg-type]
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or written is None:
        if partial is not None:
            partial.unlink(missing_ok=True)
        return report("export", failure or RuntimeError("nothing was exported"), f"exporting {scope}")
    sessions, episodes = written
    where = "stdout" if target is None else str(target)
    print(
        f"exported {scope} from {redacted(db)}: {sessions} session{'s' if sessions != 1 else ''}, "
        f"{episodes} episode{'s' if episodes != 1 else ''}, to {where}",
        file=sys.stderr,
    )
    return exit_status.OK
