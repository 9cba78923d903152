"""``memengine reindex``: rebuild a store's recall index from its journal.

On SQLite, the FTS5 index is dropped and built again from the episodes, with
its watermark (and its delete trigger, if it was lost): the repair for an
index damaged in a way recall cannot see (rows taken out of its middle).
Recall rebuilds by itself an index it finds damaged, and so does opening a
store; this command is for the rest. On PostgreSQL, the GIN text index is
rebuilt with ``REINDEX``; PostgreSQL keeps that index in the transaction
that writes each row, so it is only needed after a fault of the database
itself. Writers wait while the index is rebuilt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from ..errors import StoreError
from ..store.open import is_postgres_url, open_store
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, first_failure, report
from .progress import Progress, add_option, stream_for
from .store_file import foreign_url, store_file_problem

DESCRIPTION = (
    "Rebuild the recall (full-text) index of a memengine store from its stored episodes: FTS5 on SQLite, "
    "REINDEX of the text index on PostgreSQL. Episodes, summaries and sessions are left as they are."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "reindex", help="rebuild a store's recall index from its episodes", description=DESCRIPTION
    )
    parser.add_argument(
        "db", metavar="DB", help="a memengine SQLite file (never created by reindex), or a postgresql:// URL"
    )
    add_option(parser)
    parser.set_defaults(run=run)


async def rebuild(db: str, progress: Progress | None = None) -> int:
    """Rebuild the recall index of the store at ``db``; return how many episodes it holds.

    The store is looked at read-only first: a place without memengine's tables
    is refused rather than given them (opening a store to write creates them).
    The rebuild is one statement: ``progress`` says every second that it still runs.
    """
    async with open_store(db, read_only=True):
        pass
    async with open_store(db) as store, anyio.create_task_group() as ticks:
        if progress is not None:
            ticks.start_soon(progress.ticking)
        indexed = await store.rebuild_recall_index()
        ticks.cancel_scope.cancel()
    if progress is not None:
        progress.finish(indexed)
    return indexed


def run(options: argparse.Namespace) -> int:
    """Rebuild and say so in one line; 2 if DB is not a store, 1 if the rebuild failed."""
    db: str = options.db
    if (foreign := foreign_url(db)) is not None:
        return report("reindex", foreign)
    problem = None if is_postgres_url(db) else store_file_problem(Path(db))
    if problem is not None:
        print(f"memengine reindex: cannot read {db}: {problem}", file=sys.stderr)
        return exit_status.STORE_UNUSABLE
    failure: BaseException | None = None
    indexed: int | None = None
    try:
        progress = Progress("memengine reindex", "episodes indexed", stream_for(options.progress))
        indexed = anyio.run(rebuild, db, progress)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or indexed is None:
        # An error about opening the store names it already.
        doing = "" if isinstance(failure, StoreError) else f"could not rebuild the recall index of {redacted(db)}"
        return report("reindex", failure or RuntimeError("nothing was indexed"), doing)
    print(f"rebuilt the recall index of {redacted(db)}: {indexed} episode{'s' if indexed != 1 else ''} indexed")
    return exit_status.OK
