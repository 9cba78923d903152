"""Bringing a store's schema up to this memengine's version from outside the engine (``memengine migrate``).

Like :func:`~memengine.store.open.open_store`, it chooses the backend from
what it is given, so that the command line imports no backend module. The
PostgreSQL migration runs on a connection of the store's settings with
``statement_timeout`` off unless the URL sets one; the SQLite one creates the
file if it is missing.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .open import is_postgres_url
from .open_errors import driver_error, postgres_open_failed


def migrate_postgres(url: str) -> tuple[str, int, int]:
    """Migrate the schema ``url`` leads to; return the schema's name and its version before and after."""
    import psycopg

    from .postgres import connection
    from .postgres.schema import migrate

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
    from .sqlite.schema import migrate

    with closing(sqlite3.connect(path, isolation_level=None, timeout=10.0)) as conn:
        return migrate(conn)


def understood_version(db: str) -> int:
    """The newest schema version this memengine knows for the backend of ``db``."""
    if is_postgres_url(db):
        from .postgres.schema import SCHEMA_VERSION as postgres_version

        return postgres_version
    from .sqlite.schema import SCHEMA_VERSION as sqlite_version

    return sqlite_version


def connect_postgres(url: str) -> Any:
    """A new autocommit connection for ``url`` with the store's settings (bounded waits), for tools."""
    from .postgres.connection import connect

    return connect(url)


def _without_statement_timeout(url: str) -> str:
    from .postgres.connection import with_url_settings

    return with_url_settings(url, {"statement_timeout": "0"})
