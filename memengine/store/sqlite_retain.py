"""The retain outbox in SQLite: batches recorded with the watermark, removed once delivered.

Every function runs inside a store transaction (see sqlite.py). A batch is
written in the same transaction that advances the session's
``retained_through`` watermark, so an episode enters the outbox exactly once;
a row leaves the outbox only after the sink accepted it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence

from ..episode import Episode
from ..retain.batch import RetainMode, retain_key
from .base import OutboxEntry, OutboxState

EpisodeFromRow = Callable[[tuple], Episode]
_COLUMNS = "seq, id, role, content, created_at, metadata"


def _live_episodes(conn: sqlite3.Connection, session_id: str, after: int, through: int, limit: int = -1) -> list[tuple]:
    return conn.execute(
        f"SELECT {_COLUMNS} FROM episodes WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
        (session_id, after, through, limit),
    ).fetchall()


def _payload(rows: Sequence[tuple]) -> str:
    return json.dumps(
        [
            {"seq": r[0], "id": r[1], "role": r[2], "content": r[3], "created_at": r[4], "metadata": json.loads(r[5])}
            for r in rows
        ],
        ensure_ascii=False,
    )


def enqueue(
    conn: sqlite3.Connection,
    session_id: str,
    mode: RetainMode,
    through_seq: int | None = None,
    limit: int | None = None,
) -> int:
    """Put the session's un-retained episodes (up to ``through_seq``, at most ``limit``) in the outbox.

    Returns the session's watermark afterwards (unchanged if there was nothing).
    """
    row = conn.execute("SELECT retained_through FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    if row is None:
        return 0
    (retained_through,) = row
    if through_seq is None:
        (through_seq,) = conn.execute(
            "SELECT coalesce(max(seq), 0) FROM episodes WHERE session_id = ?", (session_id,)
        ).fetchone()
    new = _live_episodes(conn, session_id, retained_through, through_seq, -1 if limit is None else limit)
    if not new:
        return retained_through
    last_seq = new[-1][0]
    rows = new if mode == "append" else _live_episodes(conn, session_id, 0, last_seq)
    first_seq = rows[0][0]
    now = time.time()
    conn.execute(
        "INSERT INTO retain_outbox (session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, 0)",
        (
            session_id,
            first_seq,
            last_seq,
            mode,
            retain_key(session_id, first_seq, last_seq, mode),
            _payload(rows),
            now,
        ),
    )
    conn.execute("UPDATE sessions SET retained_through = ? WHERE session_id = ?", (last_seq, session_id))
    return last_seq


def enqueue_all(conn: sqlite3.Connection, mode: RetainMode) -> list[str]:
    """Enqueue every session's un-retained tail (engine start and exit); return those sessions."""
    sessions = [
        session_id
        for (session_id,) in conn.execute(
            "SELECT s.session_id FROM sessions AS s WHERE EXISTS "
            "(SELECT 1 FROM episodes AS e WHERE e.session_id = s.session_id AND e.seq > s.retained_through)"
        ).fetchall()
    ]
    for session_id in sessions:
        enqueue(conn, session_id, mode)
    return sessions


def drop_session(conn: sqlite3.Connection, session_id: str) -> None:
    """After a clear: nothing of the session may still be delivered."""
    conn.execute("DELETE FROM retain_outbox WHERE session_id = ?", (session_id,))
    conn.execute(
        "UPDATE sessions SET retained_through = max(retained_through, seq_floor) WHERE session_id = ?", (session_id,)
    )


def revise_after_delete(conn: sqlite3.Connection, session_id: str, deleted: Sequence[int]) -> None:
    """Rewrite undelivered batches that held deleted episodes; drop those left empty."""
    first_deleted = min(deleted)
    for entry_id, first_seq, last_seq, mode, episodes in conn.execute(
        "SELECT id, first_seq, last_seq, mode, episodes FROM retain_outbox WHERE session_id = ? AND last_seq >= ?",
        (session_id, first_deleted),
    ).fetchall():
        held = {episode["seq"] for episode in json.loads(episodes)}
        if held.isdisjoint(deleted):
            continue
        rows = _live_episodes(conn, session_id, first_seq - 1 if mode == "append" else 0, last_seq)
        if rows:
            conn.execute("UPDATE retain_outbox SET episodes = ? WHERE id = ?", (_payload(rows), entry_id))
        else:
            conn.execute("DELETE FROM retain_outbox WHERE id = ?", (entry_id,))


def pending(conn: sqlite3.Connection, limit: int, episode_from_row: EpisodeFromRow) -> list[OutboxEntry]:
    """Undelivered batches, oldest first (so each session's come in order)."""
    return [
        _entry(row, episode_from_row)
        for row in conn.execute(f"SELECT {_OUTBOX_COLUMNS} FROM retain_outbox ORDER BY id LIMIT ?", (limit,))
    ]


def entry(conn: sqlite3.Connection, entry_id: int, key: str, episode_from_row: EpisodeFromRow) -> OutboxEntry | None:
    """The batch as it stands now (a clear or delete may have revised or dropped it)."""
    row = conn.execute(
        f"SELECT {_OUTBOX_COLUMNS} FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key)
    ).fetchone()
    return None if row is None else _entry(row, episode_from_row)


_OUTBOX_COLUMNS = "id, session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts"


def _entry(row: tuple, episode_from_row: EpisodeFromRow) -> OutboxEntry:
    entry_id, session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts = row
    decoded = tuple(
        episode_from_row((e["seq"], e["id"], e["role"], e["content"], e["created_at"], json.dumps(e["metadata"])))
        for e in json.loads(episodes)
    )
    return OutboxEntry(entry_id, session_id, first_seq, last_seq, mode, key, decoded, created_at, attempts)


# Rows are addressed by id *and* key: an id freed by a clear can be reused by a
# later batch, which a delivery still in flight for the old row must not touch.


def mark_delivered(conn: sqlite3.Connection, entry_id: int, key: str) -> None:
    conn.execute("DELETE FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key))


def mark_failed(conn: sqlite3.Connection, entry_id: int, key: str, error: str) -> None:
    conn.execute(
        "UPDATE retain_outbox SET attempts = attempts + 1, last_error = ? WHERE id = ? AND key = ?",
        (error[:2000], entry_id, key),
    )


def state(conn: sqlite3.Connection) -> OutboxState:
    depth, oldest = conn.execute("SELECT count(*), min(created_at) FROM retain_outbox").fetchone()
    return OutboxState(depth, oldest)
