"""The SQLite schema, in one place, and its migrations.

Migrations only add. They run once, when the engine opens the store, inside
one transaction; ``PRAGMA user_version`` records how far a database has come.
A database newer than this code is refused rather than guessed at.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import sqlite_utils

from ..errors import StoreError


def _create_journal(db: sqlite_utils.Database) -> None:
    db["sessions"].create(  # type: ignore[union-attr]
        {
            "session_id": str,
            # Changes on every clear/delete; fences summaries computed before it.
            "generation": int,
            # Highest seq ever assigned, kept across clear so seqs are never reused.
            "seq_floor": int,
        },
        pk="session_id",
        not_null={"generation", "seq_floor"},
        defaults={"generation": 0, "seq_floor": 0},
    )
    db["episodes"].create(  # type: ignore[union-attr]
        {
            "session_id": str,
            "seq": int,
            "id": str,
            "role": str,
            "content": str,
            "created_at": str,
            "metadata": str,
        },
        pk=("session_id", "seq"),
        not_null={"id", "role", "content", "created_at", "metadata"},
    )
    # Idempotency of add, per session. The id leads: default ids are time-ordered,
    # so new entries land at the index's right edge rather than on random pages.
    db["episodes"].create_index(["id", "session_id"], index_name="episodes_by_id", unique=True)  # type: ignore[union-attr]
    db["summaries"].create(  # type: ignore[union-attr]
        {
            "session_id": str,
            "through_seq": int,
            "generation": int,
            "summary": str,
            "created_at": str,
        },
        pk=("session_id", "through_seq"),
        not_null={"generation", "summary", "created_at"},
    )


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_create_journal]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database up to :data:`SCHEMA_VERSION`, in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database schema version {version} is newer than this memengine understands "
                f"({SCHEMA_VERSION}); upgrade memengine"
            )
        db = sqlite_utils.Database(conn)
        for migration in MIGRATIONS[version:]:
            migration(db)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
