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
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from ..errors import StoreError
from ..store.open import is_postgres_url
from ..store.open_errors import driver_error, postgres_open_failed, redacted
from ..store.sqlite_schema import migrate as migrate_sqlite
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


def migrate_postgres(url: str) -> tuple[str, int, int]:
    """Migrate the schema ``url`` leads to; return the schema's name and its version before and after."""
    import psycopg

    from ..store import postgres_connection as connection
    from ..store.postgres_schema import migrate

    try:
        conn = connection.connect(connection.pinned_to_tables(_without_statement_timeout(url)))
    except (psycopg.Error, StoreError) as exc:
        connecting = isinstance(exc, psycopg.OperationalError)
        raise postgres_open_failed(url, exc, connecting=connecting) from driver_error(exc)
    with closing(conn):
        before, after = migrate(conn)
        (schema,) = conn.execute("SELECT current_schema()").fetchone()
    return str(schema), before, after


def migrate_sqlite_file(path: Path) -> tuple[int, int]:
    """Migrate (creating if missing) the SQLite store at ``path``; return its version before and after."""
    with closing(sqlite3.connect(path, isolation_level=None, timeout=10.0)) as conn:
        return migrate_sqlite(conn)


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
    if before == after and after > _understood(db):
        print(f"{where} is at version {after}, newer than this memengine ({_understood(db)}) but compatible with it")
    elif before == after:
        print(f"{where} is already at version {after}")
    else:
        print(f"migrated {where} from version {before} to {after}")
    return exit_status.OK


def _understood(db: str) -> int:
    if is_postgres_url(db):
        from ..store.postgres_schema import SCHEMA_VERSION as postgres_version

        return postgres_version
    from ..store.sqlite_schema import SCHEMA_VERSION as sqlite_version

    return sqlite_version


def _sqlite_problem(path: Path) -> str | None:
    # A missing or empty file becomes a store; an existing database that is not one is left alone.
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return None
    return store_file_problem(path)


def _without_statement_timeout(url: str) -> str:
    from ..store.postgres_connection import with_url_settings

    return with_url_settings(url, {"statement_timeout": "0"})
