"""The PostgreSQL schema and its migrations.

Migrations only add. They run when an engine opens the store, in one
transaction that first takes a transaction-scoped advisory lock, so any number
of processes booting against a fresh database at once migrate it exactly once
(the others wait, then find it done). ``memengine_schema`` records how far a
database has come; a database newer than this code is refused rather than
guessed at. Tables live in the connection's ``search_path`` schema.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StoreError

#: The advisory lock key every memengine process takes while migrating ("memengine" in ASCII, truncated).
MIGRATION_LOCK = 0x6D656D656E67696E & 0x7FFFFFFFFFFFFFFF

_JOURNAL = (
    "CREATE TABLE sessions ("
    "  session_id text PRIMARY KEY,"
    "  generation bigint NOT NULL DEFAULT 0,"  # changes on every clear/delete; fences stale summaries
    "  seq_floor bigint NOT NULL DEFAULT 0,"  # highest seq ever assigned, kept across clear
    "  retained_through bigint NOT NULL DEFAULT 0)",  # retain watermark
    "CREATE TABLE episodes ("
    "  session_id text NOT NULL, seq bigint NOT NULL, id text NOT NULL, role text NOT NULL,"
    "  content text NOT NULL, created_at text NOT NULL, metadata text NOT NULL,"
    "  PRIMARY KEY (session_id, seq))",
    # Idempotency of add, per session (the id leads: default ids are time-ordered).
    "CREATE UNIQUE INDEX episodes_by_id ON episodes (id, session_id)",
    # Full-text recall; GIN's pending list keeps inserts cheap.
    "CREATE INDEX episodes_text ON episodes USING gin (to_tsvector('simple', content))",
    "CREATE TABLE summaries ("
    "  session_id text NOT NULL, through_seq bigint NOT NULL, generation bigint NOT NULL,"
    "  summary text NOT NULL, created_at text NOT NULL,"
    "  PRIMARY KEY (session_id, through_seq))",
    "CREATE TABLE retain_outbox ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  session_id text NOT NULL, first_seq bigint NOT NULL, last_seq bigint NOT NULL,"
    "  mode text NOT NULL, key text NOT NULL, episodes text NOT NULL,"
    "  created_at double precision NOT NULL, attempts integer NOT NULL DEFAULT 0, last_error text,"
    "  claimed_by text, claim_until double precision)",
    "CREATE INDEX retain_outbox_by_session ON retain_outbox (session_id, id)",
    "CREATE TABLE session_leases ("
    "  session_id text PRIMARY KEY, owner text, token bigint NOT NULL, expires_at double precision NOT NULL)",
    "CREATE INDEX session_leases_by_owner ON session_leases (owner)",
    # The leases still held (not released), by expiry: where the orphan sweep looks.
    "CREATE INDEX session_leases_held ON session_leases (expires_at) WHERE owner IS NOT NULL",
)


def _statements(*statements: str) -> Callable[[Any], None]:
    def migration(conn: Any) -> None:
        for statement in statements:
            conn.execute(statement)

    return migration


_UNFINISHED_APPENDS = (
    # Adds too large for one transaction, while their parts are being stored (see store/unfinished.py).
    "CREATE TABLE unfinished_appends (session_id text NOT NULL, first_seq bigint NOT NULL,"
    "  PRIMARY KEY (session_id, first_seq))",
)

_RETAIN_RETRY_TIMES = (
    # When a refused batch may be tried again (unix seconds, the database's clock;
    # NULL: at once). Every process sharing the store leaves it alone until then.
    "ALTER TABLE retain_outbox ADD COLUMN retry_at double precision",
)

_EVICTION_BOUNDARIES = (
    # The newest seq evicted from each session's raw window (session/window.py): a reload shows the same window.
    "ALTER TABLE sessions ADD COLUMN evicted_through bigint NOT NULL DEFAULT 0",
)

MIGRATIONS: list[Callable[[Any], None]] = [
    _statements(*_JOURNAL),
    _statements(*_UNFINISHED_APPENDS),
    _statements(*_RETAIN_RETRY_TIMES),
    _statements(*_EVICTION_BOUNDARIES),
]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: Any) -> None:
    """Bring the database up to :data:`SCHEMA_VERSION` (``conn`` is a psycopg connection in autocommit mode)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS memengine_schema "
            "(id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL)"
        )
        row = conn.execute("SELECT version FROM memengine_schema WHERE id = 1").fetchone()
        version = 0 if row is None else row[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"database schema version {version} is newer than this memengine understands "
                f"({SCHEMA_VERSION}); upgrade memengine"
            )
        for migration in MIGRATIONS[version:]:
            migration(conn)
        conn.execute(
            "INSERT INTO memengine_schema (id, version) VALUES (1, %s) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (SCHEMA_VERSION,),
        )
