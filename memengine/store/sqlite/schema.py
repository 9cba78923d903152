"""The SQLite schema, in one place, and its migrations.

Migrations only add. They run once, when the engine opens the store, inside
one transaction that holds SQLite's write lock, so processes opening a new
file at once migrate it once; ``PRAGMA user_version`` records how far a
database has come, and the table ``memengine_schema`` the lowest code
version that may run against it (as ``compatible_back``, how many versions
older that code may be; see schema_window.py). A database newer than this code is refused, unless its
window reaches back to this code.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import sqlite_utils

from ..handover import WANTED_COLUMN
from ..leases import TOKEN_FLOOR_TABLE
from ..owners import OWNERS_INDEX, OWNERS_TABLE
from ..schema_window import check_newer, compatible_from
from ..segments import SEGMENTS_SCHEMA

# Full-text recall over the journal (see store/sqlite/recall.py, which also
# recreates these when it rebuilds a damaged index). Rows are indexed in
# batches up to a rowid watermark: every live row at or below it is indexed,
# none above it. A deleted row leaves the index in the same transaction that
# deletes it, and lowers the watermark so a reused rowid is indexed again.
RECALL_INDEX = "CREATE VIRTUAL TABLE episodes_fts USING fts5(content, content='episodes', content_rowid='rowid')"
RECALL_WATERMARK = "CREATE TABLE IF NOT EXISTS fts_state (id INTEGER PRIMARY KEY, indexed_through INTEGER NOT NULL)"
RECALL_DELETE_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS episodes_fts_delete AFTER DELETE ON episodes BEGIN "
    "INSERT INTO episodes_fts (episodes_fts, rowid, content) SELECT 'delete', old.rowid, old.content "
    "  WHERE old.rowid <= (SELECT indexed_through FROM fts_state WHERE id = 1); "
    "UPDATE fts_state SET indexed_through = "
    "  min(indexed_through, coalesce((SELECT max(rowid) FROM episodes), 0)) WHERE id = 1; "
    "END"
)


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


def _add_retain_and_recall(db: sqlite_utils.Database) -> None:
    # Retain watermark: episodes up to here are in the outbox or delivered.
    db["sessions"].add_column("retained_through", int, not_null_default=0)  # type: ignore[union-attr]
    # The outbox: batches recorded in the same transaction as the watermark,
    # deleted only after the sink accepted them.
    db["retain_outbox"].create(  # type: ignore[union-attr]
        {
            "id": int,
            "session_id": str,
            "first_seq": int,
            "last_seq": int,
            "mode": str,
            "key": str,
            "episodes": str,  # JSON list of episodes, as delivered
            "created_at": float,  # unix time
            "attempts": int,
            "last_error": str,
        },
        pk="id",
        not_null={"session_id", "first_seq", "last_seq", "mode", "key", "episodes", "created_at", "attempts"},
        defaults={"attempts": 0},
    )
    db["retain_outbox"].create_index(["session_id", "id"], index_name="retain_outbox_by_session")  # type: ignore[union-attr]
    db.execute(RECALL_INDEX)
    db.execute(RECALL_WATERMARK)
    db.execute("INSERT INTO fts_state (id, indexed_through) VALUES (1, 0)")
    db.execute(RECALL_DELETE_TRIGGER)


def _add_leases(db: sqlite_utils.Database) -> None:
    # One row per session ever activated: its owner (NULL once released), the
    # fencing token (only ever grows) and the expiry, in unix seconds.
    db["session_leases"].create(  # type: ignore[union-attr]
        {"session_id": str, "owner": str, "token": int, "expires_at": float},
        pk="session_id",
        not_null={"token", "expires_at"},
    )
    db["session_leases"].create_index(["owner"], index_name="session_leases_by_owner")  # type: ignore[union-attr]
    # The leases still held (not released), by expiry: where the orphan sweep looks.
    db.execute("CREATE INDEX session_leases_held ON session_leases (expires_at) WHERE owner IS NOT NULL")
    # A batch being sent is claimed by one process at a time.
    db["retain_outbox"].add_column("claimed_by", str)  # type: ignore[union-attr]
    db["retain_outbox"].add_column("claim_until", float)  # type: ignore[union-attr]


def _add_unfinished_appends(db: sqlite_utils.Database) -> None:
    # Adds too large for one transaction, while their parts are being stored (see store/unfinished.py).
    db["unfinished_appends"].create(  # type: ignore[union-attr]
        {"session_id": str, "first_seq": int}, pk=("session_id", "first_seq")
    )


def _add_retain_retry_times(db: sqlite_utils.Database) -> None:
    # When a refused batch may be tried again (unix seconds, the database's clock;
    # NULL: at once). Every process sharing the store leaves it alone until then.
    db["retain_outbox"].add_column("retry_at", float)  # type: ignore[union-attr]


def _add_eviction_boundaries(db: sqlite_utils.Database) -> None:
    # The newest seq evicted from each session's raw window (session/window.py): a reload shows the same window.
    db["sessions"].add_column("evicted_through", int, not_null_default=0)  # type: ignore[union-attr]


def _add_engine_owners(db: sqlite_utils.Database) -> None:
    # The running engines, each with the key of the lock that says it is alive (store/owners.py),
    # and the mark a process puts on a lease it waits for (store/handover.py).
    db.execute(OWNERS_TABLE)
    db.execute(OWNERS_INDEX)
    db.execute(WANTED_COLUMN)


def _add_set_aside(db: sqlite_utils.Database) -> None:
    # Work given up on after too many failed rounds (store/set_aside.py): a session's summary batch
    # (valid for one generation of the session), and a retain batch (set_aside_at: unix seconds).
    db["summaries_set_aside"].create(  # type: ignore[union-attr]
        {
            "session_id": str,
            "generation": int,
            "through_seq": int,
            "attempts": int,
            "error": str,
            "set_aside_at": float,
        },
        pk="session_id",
        not_null={"generation", "through_seq", "attempts", "error", "set_aside_at"},
    )
    db["retain_outbox"].add_column("set_aside_at", float)  # type: ignore[union-attr]


def _add_lease_token_floor(db: sqlite_utils.Database) -> None:
    # Erasing a session (Engine.forget) deletes its lease row; new lease rows start above the tokens it held.
    db.execute(TOKEN_FLOOR_TABLE)


def _add_forgets(db: sqlite_utils.Database) -> None:
    # How far the session's episodes may have reached the sink: the newest seq of a batch ever claimed
    # for sending. A delete or clear of an episode up to here records a forget (store/outbox.py).
    # Existing sessions count every recorded episode as handed on: a forget too many does no harm.
    db["sessions"].add_column("handed_through", int, not_null_default=0)  # type: ignore[union-attr]
    db.execute("UPDATE sessions SET handed_through = retained_through")
    # A forget's seqs (JSON list; NULL: the whole session), on rows whose mode is 'forget'.
    db["retain_outbox"].add_column("forget_seqs", str)  # type: ignore[union-attr]


def _add_summary_segments(db: sqlite_utils.Database) -> None:
    # Segment summaries (store/segments.py): a segmented session's summarized past as a tree of summaries;
    # where a set-aside summary batch starts when it is a repair of one of them (NULL: after the summary).
    for statement in SEGMENTS_SCHEMA:
        db.execute(statement)
    db["summaries_set_aside"].add_column("first_seq", int)  # type: ignore[union-attr]


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _create_journal,
    _add_retain_and_recall,
    _add_leases,
    _add_unfinished_appends,
    _add_retain_retry_times,
    _add_eviction_boundaries,
    _add_engine_owners,
    _add_set_aside,
    _add_lease_token_floor,
    _add_forgets,
    _add_summary_segments,
]
SCHEMA_VERSION = len(MIGRATIONS)
#: For each migration, whether code from before it keeps working against the schema it leaves
#: (see schema_window.py). The first five add what older code would ignore and get wrong; the eviction
#: boundary is only a hint that older code leaves at its default (the window's rules apply again on load).
#: The engine owners table is ignored by older code, whose owners are never found dead (their leases expire).
#: Older code ignores the set-aside marks: it retries set-aside work for ever, as it always did.
#: Older code ignores the token floor: a session that newer code erased and older code then takes starts its
#: tokens at 1 again, which matters only to a process paused with an old token across the erasure.
#: Older code would hand a forget to the sink as an empty retain batch, and keep no track of what was handed on.
#: Older code would leave a segmented session's segments behind on a delete, a clear or an erasure.
ADDITIVE: list[bool] = [False, False, False, False, False, True, True, True, True, False, False]

_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS memengine_schema"
    " (id INTEGER PRIMARY KEY CHECK (id = 1), compatible_back INTEGER NOT NULL)"
)


def migrate(conn: sqlite3.Connection) -> tuple[int, int]:
    """Bring the database up to :data:`SCHEMA_VERSION`, in one transaction; return the version before and after.

    A newer database is left as it is (and refused unless its window reaches this code).
    """
    lowest = compatible_from(ADDITIVE, SCHEMA_VERSION)
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            check_newer(version, recorded_compatible_from(conn, version), SCHEMA_VERSION)
            conn.execute("COMMIT")
            return version, version
        if version < SCHEMA_VERSION or recorded_compatible_from(conn, version) != lowest:
            db = sqlite_utils.Database(conn)
            for migration in MIGRATIONS[version:]:
                migration(db)
            conn.execute(_SCHEMA_TABLE)
            conn.execute(
                "INSERT INTO memengine_schema (id, compatible_back) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET compatible_back = excluded.compatible_back",
                (SCHEMA_VERSION - lowest,),
            )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return version, SCHEMA_VERSION


def recorded_compatible_from(conn: sqlite3.Connection, version: int) -> int | None:
    """The ``compatible_from`` the database records (None: not recorded, so only code of its version)."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memengine_schema'").fetchone()
    if exists is None:
        return None
    row = conn.execute("SELECT compatible_back FROM memengine_schema WHERE id = 1").fetchone()
    return None if row is None else version - int(row[0])
