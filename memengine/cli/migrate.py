"""``memengine migrate``: bring a store's schema up to this memengine's version.

For the usual PostgreSQL split: an owner role runs ``memengine migrate URL``
(at deploy time, before the new code starts), and the engine's own roles only
read and write, since opening a store whose schema is current runs no DDL at
all. The schema is found as the engine finds it: the first schema of the
URL's ``search_path`` that holds memengine's tables, else
``current_schema()``. The migration runs in one transaction under the
migration advisory lock, with the connection's ``lock_timeout`` (5 s unless
the URL says otherwise), so it fails (run it again) rather than queueing
the replicas behind a lock it waits for; ``statement_timeout`` is off for it
unless the URL sets one. A SQLite path works too (created if missing), for
symmetry.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import StoreError
from ..store.migration import migrate_postgres, migrate_sqlite_file, understood_version
from ..store.open import is_postgres_url
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, report
from .store_file import foreign_url, store_file_problem

DESCRIPTION = (
    "Create or migrate a memengine store's schema to this version of memengine, in one transaction. "
    "Run it as a role that owns the schema; the engine can then run as a role that only reads and writes."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser("migrate", help="create or migrate a store's schema", description=DESCRIPTION)
    parser.add_argument("db", metavar="DB", help="a postgresql:// URL, or a SQLite file (created if missing)")
    parser.set_defaults(run=run)


def run(options: argparse.Namespace) -> int:
    """Migrate and say from which version to which; 2 if DB is not a store, 1 if the migration failed."""
    db: str = options.db
    if (foreign := foreign_url(db)) is not None:
        return report("migrate", foreign)
    shown = db
    where = db
    try:
        if is_postgres_url(db):
            shown = redacted(db)
            schema, before, after = migrate_postgres(db)
            where = f"{shown} (schema {schema})"
        else:
            path = Path(db)
            problem = _sqlite_problem(path)
            if problem is not None:
                print(f"memengine migrate: will not migrate {db}: {problem}", file=sys.stderr)
                return exit_status.STORE_UNUSABLE
            before, after = migrate_sqlite_file(path)
    except EXPECTED_FAILURES as failure:
        # An error about opening the store names it already.
        return report("migrate", failure, "" if isinstance(failure, StoreError) else f"could not migrate {shown}")
    understood = understood_version(db)
    if before == after and after > understood:
        print(f"{where} is at version {after}, newer than this memengine ({understood}) but compatible with it")
    elif before == after:
        print(f"{where} is already at version {after}")
    else:
        print(f"migrated {where} from version {before} to {after}")
    return exit_status.OK


def _sqlite_problem(path: Path) -> str | None:
    # A missing or empty file becomes a store; an existing database that is not one is left alone.
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return None
    return store_file_problem(path)
