"""The retain outbox: batches recorded with the watermark, removed once delivered.

Every function runs inside a store transaction, on either backend (see
dialect.py). A batch is written in the same transaction that advances the
session's ``retained_through`` watermark (read under a row lock), so an
episode enters the outbox exactly once; a row leaves the outbox only after
the sink accepted it. Where several processes share the store, a batch is
sent only by the process holding its claim, and only while it is the
oldest batch of its session (so each session's batches go out in order).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Literal

from ..episode import Episode
from ..retain.batch import RetainMode, retain_key
from . import leases, unfinished
from .base import OutboxEntry, OutboxState
from .dialect import Db

EpisodeFromRow = Callable[[tuple], Episode]
_COLUMNS = "seq, id, role, content, created_at, metadata"


def _live_episodes(db: Db, session_id: str, after: int, through: int, limit: int | None = None) -> list[tuple]:
    bound = "" if limit is None else f" LIMIT {int(limit)}"
    return db.execute(  # type: ignore[no-any-return]
        f"SELECT {_COLUMNS} FROM episodes WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq{bound}",
        (session_id, after, through),
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
    db: Db,
    session_id: str,
    token: int | None,
    mode: RetainMode,
    through_seq: int | None = None,
    limit: int | None = None,
) -> int:
    """Put the session's un-retained episodes (up to ``through_seq``, at most ``limit``) in the outbox.

    Returns the session's watermark afterwards (unchanged if there was nothing).
    With a ``token``, only under that live lease; without, the caller has made
    sure no other process owns the session.
    """
    if token is not None:
        leases.require(db, session_id, token)
    row = db.execute(
        "SELECT retained_through, seq_floor FROM sessions WHERE session_id = ?{for_update}", (session_id,)
    ).fetchone()
    if row is None:
        return 0
    retained_through, seq_floor = row
    if through_seq is None:
        # Every seq the session ever assigned: deleted ones count, they have nothing left to hand on.
        (through_seq,) = db.execute(
            "SELECT {greatest}(?, coalesce(max(seq), 0)) FROM episodes WHERE session_id = ?", (seq_floor, session_id)
        ).fetchone()
    new = _live_episodes(db, session_id, retained_through, through_seq, limit)
    if not new:
        if through_seq > retained_through:
            # The range holds no live episode (all deleted): nothing to send, but it is done with.
            db.execute("UPDATE sessions SET retained_through = ? WHERE session_id = ?", (through_seq, session_id))
            return int(through_seq)
        return int(retained_through)
    last_seq = new[-1][0]
    rows = new if mode == "append" else _live_episodes(db, session_id, 0, last_seq)
    first_seq = rows[0][0]
    now = time.time()
    db.execute(
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
    db.execute("UPDATE sessions SET retained_through = ? WHERE session_id = ?", (last_seq, session_id))
    return last_seq


def enqueue_all(db: Db, owner: str, mode: RetainMode, orphaned_only: bool = False) -> list[str]:
    """Enqueue the un-retained tail of every session no other live process owns; return those sessions.

    At engine start (tails a crashed run left) and exit (this process's own);
    ``orphaned_only`` while running (sessions whose owner died).
    """
    condition, params = leases.unowned(owner, orphaned_only)
    sessions = [
        session_id
        for (session_id,) in db.execute(
            "SELECT s.session_id FROM sessions AS s WHERE EXISTS "
            "(SELECT 1 FROM episodes AS e WHERE e.session_id = s.session_id AND e.seq > s.retained_through) "
            f"AND {condition} ORDER BY s.session_id",
            params,
        ).fetchall()
    ]
    for session_id in sessions:
        # Its owner is gone: an add it left half stored was never acknowledged, and is not handed on.
        unfinished.undo_all(db, session_id)
        enqueue(db, session_id, None, mode)
    return sessions


def drop_session(db: Db, session_id: str) -> None:
    """After a clear: nothing of the session may still be delivered."""
    db.execute("DELETE FROM retain_outbox WHERE session_id = ?", (session_id,))
    db.execute(
        "UPDATE sessions SET retained_through = {greatest}(retained_through, seq_floor) WHERE session_id = ?",
        (session_id,),
    )


def revise_after_delete(db: Db, session_id: str, deleted: Sequence[int]) -> None:
    """Rewrite undelivered batches that held deleted episodes; drop those left empty."""
    first_deleted = min(deleted)
    for entry_id, first_seq, last_seq, mode, episodes in db.execute(
        "SELECT id, first_seq, last_seq, mode, episodes FROM retain_outbox WHERE session_id = ? AND last_seq >= ?",
        (session_id, first_deleted),
    ).fetchall():
        held = {episode["seq"] for episode in json.loads(episodes)}
        if held.isdisjoint(deleted):
            continue
        rows = _live_episodes(db, session_id, first_seq - 1 if mode == "append" else 0, last_seq)
        if rows:
            db.execute("UPDATE retain_outbox SET episodes = ? WHERE id = ?", (_payload(rows), entry_id))
        else:
            db.execute("DELETE FROM retain_outbox WHERE id = ?", (entry_id,))


def pending(db: Db, limit: int, episode_from_row: EpisodeFromRow) -> list[OutboxEntry]:
    """Undelivered batches, oldest first (so each session's come in order)."""
    return [
        _entry(row, episode_from_row)
        for row in db.execute(f"SELECT {_OUTBOX_COLUMNS} FROM retain_outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
    ]


#: Why a batch cannot be sent now: it is gone (delivered, or dropped by a
#: clear/delete), or another process holds it or an earlier batch of its session.
Unclaimable = Literal["gone", "busy"]


def claim(
    db: Db, entry_id: int, key: str, owner: str, ttl: float, episode_from_row: EpisodeFromRow
) -> OutboxEntry | Unclaimable:
    """Claim the batch for ``ttl`` seconds and return it as it stands now (a clear or delete may have revised it).

    Only the oldest batch of its session can be claimed, and only if no other
    live process holds it; claiming it again extends our own claim.
    """
    row = db.execute(
        "UPDATE retain_outbox SET claimed_by = ?, claim_until = {now} + ? "
        "WHERE id = ? AND key = ? "
        "  AND (claimed_by IS NULL OR claimed_by = ? OR claim_until <= {now}) "
        "  AND id = (SELECT min(o.id) FROM retain_outbox AS o WHERE o.session_id = retain_outbox.session_id) "
        f"RETURNING {_OUTBOX_COLUMNS}",
        (owner, ttl, entry_id, key, owner),
    ).fetchone()
    if row is not None:
        return _entry(row, episode_from_row)
    exists = db.execute("SELECT 1 FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key)).fetchone()
    return "busy" if exists is not None else "gone"


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


def mark_delivered(db: Db, entry_id: int, key: str) -> None:
    db.execute("DELETE FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key))


def mark_failed(db: Db, entry_id: int, key: str, error: str) -> None:
    """Count the attempt and let the claim go, so another process may try."""
    db.execute(
        "UPDATE retain_outbox SET attempts = attempts + 1, last_error = ?, claimed_by = NULL, claim_until = NULL "
        "WHERE id = ? AND key = ?",
        (error[:2000], entry_id, key),
    )


def state(db: Db) -> OutboxState:
    depth, oldest = db.execute("SELECT count(*), min(created_at) FROM retain_outbox").fetchone()
    return OutboxState(depth, oldest)
