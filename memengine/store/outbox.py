"""The retain outbox: batches recorded with the watermark, removed once delivered.

Every function runs inside a store transaction, on either backend (see
dialect.py). A batch is written in the same transaction that advances the
session's ``retained_through`` watermark (read under a row lock), so an
episode enters the outbox exactly once; a row leaves the outbox only after
the sink accepted it. Where several processes share the store, a batch is
sent only by the process holding its claim, and only while it is the
oldest batch of its session (so each session's batches go out in order). A
refused batch carries a retry time, before which no process picks it up.

Forgets go through the same outbox, as rows of mode ``'forget'``. Claiming a
retain batch moves the session's ``handed_through`` to the batch's last seq:
from then on its episodes may be at the sink. A delete or clear of episodes
up to ``handed_through`` records a forget of them in its own transaction,
after every batch already recorded (so after the batch it cancels) and
before every batch recorded later (which holds none of them). Undelivered
batches lose the deleted episodes; one that was claimed keeps its place even
when nothing is left in it, so that a forget never overtakes a batch still
being sent: emptied, it is removed without a sink call once its turn comes.

A batch set aside (set_aside.py) is not in flight, and never will be until
it is retried: a delete or clear drops it once nothing is left in it, and
while it heads its session, the session's forgets go out ahead of it (it
holds none of the episodes they name, and the batches waiting behind it were
never claimed). A delete or clear also erases the error text of the
session's rows: a sink's message may quote what it was handed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Literal

from ..episode import Episode
from ..retain.batch import RetainMode, forget_key, retain_key
from . import leases, unfinished
from .base import DueBatch, DueRetains, OutboxEntry, OutboxState
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
    batch_size: int | None = None,
) -> int:
    """Put the session's un-retained episodes (up to ``through_seq``, at most ``limit``) in the outbox.

    As one batch; or, with ``batch_size`` (and no ``limit``), as batches of at
    most that many episodes in append mode (a replace batch holds the whole
    session up to its last episode anyway: one, the newest, is enough).
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
    if batch_size is None or limit is not None or mode != "append":
        return _record(db, session_id, token, mode, retained_through, through_seq, limit)
    return _record_in_batches(db, session_id, token, retained_through, through_seq, batch_size)


_INSERT_BATCH = (
    "INSERT INTO retain_outbox (session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, 0)"
)


def _record(
    db: Db,
    session_id: str,
    token: int | None,
    mode: RetainMode,
    retained_through: int,
    through_seq: int,
    limit: int | None,
) -> int:
    """Record one batch: the live episodes after ``retained_through`` up to ``through_seq`` (at most ``limit``)."""
    new = _live_episodes(db, session_id, retained_through, through_seq, limit)
    if not new:
        return _nothing_live(db, session_id, retained_through, through_seq)
    last_seq = new[-1][0]
    rows = new if mode == "append" else _live_episodes(db, session_id, 0, last_seq)
    db.execute(_INSERT_BATCH, _batch_row(session_id, mode, rows, _lease_token(db, session_id, token), time.time()))
    # Read to the end of the range (fewer than ``limit``): the seqs after the batch's last are all deleted,
    # so the range is done with, as it is when nothing in it is live.
    return _set_watermark(db, session_id, through_seq if limit is None or len(new) < limit else last_seq)


def _record_in_batches(
    db: Db, session_id: str, token: int | None, retained_through: int, through_seq: int, batch_size: int
) -> int:
    """Record the live episodes after ``retained_through`` up to ``through_seq`` as append batches of ``batch_size``.

    Read once and written with one statement, in order (the outbox's ids
    follow it): a long tail costs about what one batch of it did.
    """
    new = _live_episodes(db, session_id, retained_through, through_seq)
    if not new:
        return _nothing_live(db, session_id, retained_through, through_seq)
    lease_token, now = _lease_token(db, session_id, token), time.time()
    db.executemany(
        _INSERT_BATCH,
        [
            _batch_row(session_id, "append", new[start : start + batch_size], lease_token, now)
            for start in range(0, len(new), batch_size)
        ],
    )
    return _set_watermark(db, session_id, through_seq)


def _nothing_live(db: Db, session_id: str, retained_through: int, through_seq: int) -> int:
    if through_seq > retained_through:
        # The range holds no live episode (all deleted): nothing to send, but it is done with.
        return _set_watermark(db, session_id, through_seq)
    return int(retained_through)


def _set_watermark(db: Db, session_id: str, retained_through: int) -> int:
    db.execute("UPDATE sessions SET retained_through = ? WHERE session_id = ?", (retained_through, session_id))
    return int(retained_through)


def _batch_row(
    session_id: str, mode: RetainMode, rows: Sequence[tuple], lease_token: int, now: float
) -> tuple[str, int, int, RetainMode, str, str, float]:
    first_seq, last_seq = rows[0][0], rows[-1][0]
    key = retain_key(session_id, first_seq, last_seq, mode, lease_token)
    return (session_id, first_seq, last_seq, mode, key, _payload(rows), now)


def enqueue_all(
    db: Db,
    owner: str,
    mode: RetainMode,
    orphaned_only: bool = False,
    after: str | None = None,
    limit: int = 100,
    batch_size: int | None = None,
) -> tuple[list[str], str | None]:
    """Enqueue the un-retained tail of sessions no other live process owns, at most ``limit`` of them.

    Each tail goes as batches of at most ``batch_size`` episodes (see :func:`enqueue`).

    At engine start (tails a crashed run left) and exit (this process's own);
    ``orphaned_only`` while running (sessions whose owner died). Sessions are
    taken in id order after ``after``; returns those handled, and where the
    next step starts (``None`` when none are left). Each session's lease is
    locked and checked again before its tail is touched: another process may
    have taken it over since the sessions were listed.
    """
    condition, params = leases.unowned(owner, orphaned_only)
    rows = db.execute(
        "SELECT s.session_id FROM sessions AS s WHERE EXISTS "
        "(SELECT 1 FROM episodes AS e WHERE e.session_id = s.session_id AND e.seq > s.retained_through) "
        f"AND {condition} AND s.session_id > ? ORDER BY s.session_id LIMIT ?",
        (*params, after or "", limit),
    ).fetchall()
    handled = []
    for (session_id,) in rows:
        if not leases.still_unowned(db, session_id, owner, orphaned_only):
            continue
        # Its owner is gone: an add it left half stored was never acknowledged, and is not handed on.
        unfinished.undo_all(db, session_id)
        enqueue(db, session_id, None, mode, batch_size=batch_size)
        handled.append(session_id)
    return handled, (rows[-1][0] if len(rows) == limit else None)


def handed_through(db: Db, session_id: str) -> int:
    """The newest seq that may have reached the sink (of a batch claimed for sending at some point)."""
    row = db.execute("SELECT handed_through FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return 0 if row is None else int(row[0])


def record_forget(db: Db, session_id: str, seqs: Sequence[int] | None, through_seq: int) -> None:
    """Record a forget of ``seqs`` (``None``: the whole session), after every batch recorded so far.

    Called in the transaction of the delete or clear, after it moved the
    session's generation: its key names that generation. The row's
    ``last_seq`` is ``through_seq``, how far the session was handed on at the
    delete (the delivery reads how far it is when it sends the forget: see
    :func:`handed_on`).
    """
    (generation,) = db.execute("SELECT generation FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    db.execute(
        "INSERT INTO retain_outbox (session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts, "
        "forget_seqs) VALUES (?, ?, ?, 'forget', ?, '[]', ?, 0, ?)",
        (
            session_id,
            0 if seqs is None else min(seqs),
            through_seq,
            forget_key(session_id, generation, _lease_token(db, session_id, None)),
            time.time(),
            None if seqs is None else json.dumps(sorted(seqs)),
        ),
    )


def _lease_token(db: Db, session_id: str, token: int | None) -> int:
    """The session's lease token (``token`` if the caller holds it): part of the keys recorded now.

    Tokens only grow for a session id, across its erasure too (the token floor,
    store/leases.py), while its seqs and generation start again: with the token,
    the keys of a session id used again differ from those of its earlier life.
    """
    if token is not None:
        return token
    row = db.execute("SELECT token FROM session_leases WHERE session_id = ?", (session_id,)).fetchone()
    return 0 if row is None else int(row[0])


#: What a row's error text becomes when a delete or clear of its session erases it.
ERASED_ERROR = "(the error's text was erased with the session's deleted episodes)"


def drop_session(db: Db, session_id: str) -> None:
    """After a clear: nothing of the session may still be delivered.

    Batches never claimed go, and so do set-aside ones (not in flight); a
    claimed one stays, emptied, so the clear's forget cannot overtake it while
    it may still be in flight. Forgets stay.
    """
    through = handed_through(db, session_id)
    db.execute(
        "DELETE FROM retain_outbox WHERE session_id = ? AND mode <> 'forget' "
        "AND (last_seq > ? OR set_aside_at IS NOT NULL)",
        (session_id, through),
    )
    db.execute("UPDATE retain_outbox SET episodes = '[]' WHERE session_id = ? AND mode <> 'forget'", (session_id,))
    erase_errors(db, session_id)
    db.execute(
        "UPDATE sessions SET retained_through = {greatest}(retained_through, seq_floor) WHERE session_id = ?",
        (session_id,),
    )


def erase_errors(db: Db, session_id: str) -> None:
    """Erase the error text of the session's rows: a sink's message may quote episodes a delete or clear removed."""
    db.execute(
        "UPDATE retain_outbox SET last_error = ? WHERE session_id = ? AND last_error IS NOT NULL",
        (ERASED_ERROR, session_id),
    )


def revise_after_delete(db: Db, session_id: str, deleted: Sequence[int]) -> None:
    """Rewrite undelivered batches that held deleted episodes; drop those left empty, unless possibly in flight.

    A batch claimed once (its last seq is handed on) may be in flight: it
    keeps its place, emptied, ahead of the forget that follows it; one set
    aside is not in flight. The session's error texts are erased.
    """
    first_deleted = min(deleted)
    through = handed_through(db, session_id)
    for entry_id, first_seq, last_seq, mode, episodes, set_aside_at in db.execute(
        "SELECT id, first_seq, last_seq, mode, episodes, set_aside_at FROM retain_outbox "
        "WHERE session_id = ? AND last_seq >= ? AND mode <> 'forget'",
        (session_id, first_deleted),
    ).fetchall():
        held = {episode["seq"] for episode in json.loads(episodes)}
        if held.isdisjoint(deleted):
            continue
        rows = _live_episodes(db, session_id, first_seq - 1 if mode == "append" else 0, last_seq)
        if rows or (last_seq <= through and set_aside_at is None):
            db.execute("UPDATE retain_outbox SET episodes = ? WHERE id = ?", (_payload(rows), entry_id))
        else:
            db.execute("DELETE FROM retain_outbox WHERE id = ?", (entry_id,))
    erase_errors(db, session_id)


def pending(db: Db, limit: int, episode_from_row: EpisodeFromRow) -> list[OutboxEntry]:
    """Undelivered batches and forgets, oldest first (so each session's come in order)."""
    return [
        _entry(row, episode_from_row)
        for row in db.execute(f"SELECT {_OUTBOX_COLUMNS} FROM retain_outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
    ]


# Conditions on outbox rows ``o``. Only the head of a session may be sent (see claim): its oldest row,
# unless that is set aside (set_aside.py), when its oldest forget goes ahead (a set-aside batch is not in
# flight, and a delete or clear emptied it of what the forget names); its later batches wait behind it.
# One list of ids, so that it drives the reads (rows by id), as the oldest rows alone did: the outbox's
# rows are not scanned, nor their payloads read.
_OLDEST = "SELECT min(id) FROM retain_outbox GROUP BY session_id"
_HEAD_OF_SESSION = (
    "o.id IN (SELECT CASE WHEN s.set_aside_at IS NULL THEN s.id ELSE (SELECT min(f.id) FROM retain_outbox AS f "
    f"WHERE f.session_id = s.session_id AND f.mode = 'forget') END FROM retain_outbox AS s WHERE s.id IN ({_OLDEST})) "
    "AND o.set_aside_at IS NULL"
)
#: The same, for the row ``retain_outbox`` an UPDATE claims: index seeks in its session only.
_OLDEST_OF_ITS_SESSION = "(SELECT min(h.id) FROM retain_outbox AS h WHERE h.session_id = retain_outbox.session_id)"
_CLAIMED_IS_HEAD = (
    f"set_aside_at IS NULL AND (id = {_OLDEST_OF_ITS_SESSION} OR (mode = 'forget' "
    f"AND (SELECT a.set_aside_at FROM retain_outbox AS a WHERE a.id = {_OLDEST_OF_ITS_SESSION}) IS NOT NULL "
    "AND id = (SELECT min(f.id) FROM retain_outbox AS f "
    "WHERE f.session_id = retain_outbox.session_id AND f.mode = 'forget')))"
)
#: No other process holds a live claim on it (``?``: this process, then the database's clock read once).
_NOT_HELD_ELSEWHERE = "(o.claimed_by IS NULL OR o.claimed_by = ? OR o.claim_until <= ?)"
#: Its retry time has come (``?``: the database's clock read once).
_RETRY_TIME_CAME = "(o.retry_at IS NULL OR o.retry_at <= ?)"
#: When another process's claim on it lapses (``?``: this process); 0 if none holds it.
_OTHER_CLAIM_UNTIL = "CASE WHEN o.claimed_by <> ? THEN o.claim_until ELSE 0 END"


def due(db: Db, owner: str, limit: int, ignore_backoff: bool) -> DueRetains:
    """The head batch of each session ``owner`` may send now, oldest first, and when the next falls due.

    Reads only. A batch is due when it is the head of its session, no other
    live process holds its claim, and (unless ``ignore_backoff``) its retry
    time has come. ``next_due_in`` is the time until the earliest such head
    batch that is not due now becomes due.

    Both are judged at one reading of the database's clock: read twice, a retry
    time falling between the readings would be neither due at the first nor
    still to come at the second, and the batch would wait for the next look.
    """
    (now,) = db.execute("SELECT {now}").fetchone()
    ready, ready_params = _NOT_HELD_ELSEWHERE, [owner, now]
    if not ignore_backoff:
        ready, ready_params = ready + " AND " + _RETRY_TIME_CAME, [*ready_params, now]
    batches = tuple(
        DueBatch(entry_id, session_id, key)
        for entry_id, session_id, key in db.execute(
            "SELECT o.id, o.session_id, o.key FROM retain_outbox AS o "
            "WHERE " + _HEAD_OF_SESSION + " AND " + ready + " ORDER BY o.id LIMIT ?",
            (*ready_params, limit),
        ).fetchall()
    )
    due_at = _OTHER_CLAIM_UNTIL if ignore_backoff else "{greatest}(coalesce(o.retry_at, 0), " + _OTHER_CLAIM_UNTIL + ")"
    later = "SELECT min(" + due_at + ") - ? FROM retain_outbox AS o WHERE " + _HEAD_OF_SESSION
    (next_due_in,) = db.execute(later + " AND " + due_at + " > ?", (owner, now, owner, now)).fetchone()
    return DueRetains(batches, None if next_due_in is None else float(next_due_in))


#: Why a batch cannot be sent now: it is gone (delivered, or dropped by a
#: clear/delete), or another process holds it or an earlier batch of its session.
Unclaimable = Literal["gone", "busy"]


def claim(
    db: Db, entry_id: int, key: str, owner: str, ttl: float, episode_from_row: EpisodeFromRow
) -> OutboxEntry | Unclaimable:
    """Claim the batch for ``ttl`` seconds and return it as it stands now (a clear or delete may have revised it).

    Only the head of its session can be claimed (its oldest row, or its oldest
    forget when that is set aside), and only if no other live process holds
    it; claiming it again extends our own claim. A claimed batch's episodes
    count as handed on from now (``handed_through``).
    """
    # The session's row first, as a delete or clear locks it: then the outbox row.
    db.execute(
        "SELECT handed_through FROM sessions "
        "WHERE session_id = (SELECT session_id FROM retain_outbox WHERE id = ? AND key = ?){for_update}",
        (entry_id, key),
    )
    row = db.execute(
        "UPDATE retain_outbox SET claimed_by = ?, claim_until = {now} + ? "
        "WHERE id = ? AND key = ? "
        "  AND (claimed_by IS NULL OR claimed_by = ? OR claim_until <= {now}) "
        f"  AND {_CLAIMED_IS_HEAD} "
        f"RETURNING {_OUTBOX_COLUMNS}",
        (owner, ttl, entry_id, key, owner),
    ).fetchone()
    if row is not None:
        entry = _entry(row, episode_from_row)
        if entry.mode != "forget":
            db.execute(
                "UPDATE sessions SET handed_through = {greatest}(handed_through, ?) WHERE session_id = ?",
                (entry.last_seq, entry.session_id),
            )
        return entry
    exists = db.execute("SELECT 1 FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key)).fetchone()
    return "busy" if exists is not None else "gone"


_OUTBOX_COLUMNS = "id, session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts, forget_seqs"


def _entry(row: tuple, episode_from_row: EpisodeFromRow) -> OutboxEntry:
    entry_id, session_id, first_seq, last_seq, mode, key, episodes, created_at, attempts, forget_seqs = row
    if mode == "forget":
        seqs = None if forget_seqs is None else tuple(json.loads(forget_seqs))
        return OutboxEntry(entry_id, session_id, first_seq, last_seq, mode, key, (), created_at, attempts, seqs)
    decoded = tuple(
        episode_from_row((e["seq"], e["id"], e["role"], e["content"], e["created_at"], json.dumps(e["metadata"])))
        for e in json.loads(episodes)
    )
    return OutboxEntry(entry_id, session_id, first_seq, last_seq, mode, key, decoded, created_at, attempts)


def handed_on(db: Db, session_id: str, episode_from_row: EpisodeFromRow) -> tuple[int, tuple[Episode, ...]]:
    """How far the session has been handed on, and its live episodes up to there (what a sink holds of it).

    Less the episodes of set-aside append batches: the sink refused them, and gets them only on a retry.
    """
    through = handed_through(db, session_id)
    refused = {
        episode["seq"]
        for (episodes,) in db.execute(
            "SELECT episodes FROM retain_outbox WHERE session_id = ? AND set_aside_at IS NOT NULL AND mode = 'append'",
            (session_id,),
        ).fetchall()
        for episode in json.loads(episodes)
    }
    return through, tuple(
        episode_from_row(row) for row in _live_episodes(db, session_id, 0, through) if row[0] not in refused
    )


# Rows are addressed by id *and* key: an id freed by a clear can be reused by a
# later batch, which a delivery still in flight for the old row must not touch.


def extend_claim(db: Db, entry_id: int, key: str, owner: str, ttl: float) -> bool:
    """Extend ``owner``'s live claim on the batch to ``ttl`` seconds from now; False if it lapsed or is gone.

    Never takes a claim: after the sink call it guards has ended, it can only fail.
    """
    cursor = db.execute(
        "UPDATE retain_outbox SET claim_until = {now} + ? "
        "WHERE id = ? AND key = ? AND claimed_by = ? AND claim_until > {now}",
        (ttl, entry_id, key, owner),
    )
    return bool(cursor.rowcount == 1)


def mark_delivered(db: Db, entry_id: int, key: str) -> None:
    """The sink has the batch: remove it, whoever holds its claim now."""
    db.execute("DELETE FROM retain_outbox WHERE id = ? AND key = ?", (entry_id, key))


def mark_failed(
    db: Db, entry_id: int, key: str, owner: str, error: str, retry_in: float, set_aside: bool = False
) -> None:
    """Count the attempt, keep the batch out of delivery for ``retry_in`` seconds, and let ``owner``'s claim go.

    With ``set_aside``, out of delivery until it is retried (set_aside.py).

    Unless another process holds a live claim on it: then ``owner``'s claim
    lapsed and the batch is being sent by that process, which a late failure
    must not release (a third process could send it at the same time).
    """
    db.execute(
        "UPDATE retain_outbox SET attempts = attempts + 1, last_error = ?, retry_at = {now} + ?, "
        "claimed_by = NULL, claim_until = NULL, set_aside_at = CASE WHEN ? THEN {now} ELSE NULL END "
        "WHERE id = ? AND key = ? AND (claimed_by IS NULL OR claimed_by = ? OR claim_until <= {now})",
        (error[:2000], retry_in, set_aside, entry_id, key, owner),
    )


def state(db: Db) -> OutboxState:
    depth, oldest = db.execute("SELECT count(*), min(created_at) FROM retain_outbox").fetchone()
    return OutboxState(depth, oldest)
