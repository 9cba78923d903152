"""The session journal, written once for every backend (see dialect.py).

A session is event-sourced: episodes keyed by ``(session_id, seq)``, summary
snapshots keyed by ``(session_id, through_seq)`` and written by upsert, and a
``sessions`` row holding the generation (which fences stale summaries), the
seq floor (seqs are never reused) and the retain watermark. Every function
runs inside a store transaction; those that write check the session's lease
first (see leases.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import attrs

from ..episode import Episode, encode_json, with_seq
from ..errors import SessionBusyError, StoreError
from . import leases, outbox, segments, set_aside, unfinished
from .base import AppendResult, Composed, SegmentRepair, SessionRow, SessionSnapshot
from .dialect import Db, placeholders
from .rows import EPISODE_COLUMNS, episode_from_row

INSERT_SESSION = "INSERT INTO sessions (session_id) VALUES (?) ON CONFLICT DO NOTHING"
INSERT_EPISODE = (
    "INSERT INTO episodes (session_id, seq, id, role, content, created_at, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


def episode_row(
    session_id: str, seq: int, episode: Episode, metadata_json: str | None = None
) -> tuple[str, int, str, str, str, str, str]:
    """The row of an episode; ``metadata_json``, if given, is its metadata as ``encode_json`` writes it."""
    if metadata_json is not None:
        metadata = metadata_json
    else:
        metadata = encode_json(episode.metadata) if episode.metadata else "{}"
    return (session_id, seq, episode.id, episode.role, episode.content, episode.created_at.isoformat(), metadata)


def appended(first_seq: int, episodes: Sequence[Episode]) -> AppendResult:
    """The result of an append that found none of its ids already stored."""
    return tuple([(with_seq(episode, seq), True) for seq, episode in enumerate(episodes, first_seq)])


def append(db: Db, session_id: str, token: int, first_seq: int, episodes: Sequence[Episode]) -> AppendResult:
    """Store episodes one by one, skipping (and returning) those whose id is already stored."""
    leases.require(db, session_id, token)
    return _append_rows(db, session_id, first_seq, episodes)


def append_part(
    db: Db,
    session_id: str,
    token: int,
    first_seq: int,
    episodes: Sequence[Episode],
    add_first_seq: int,
    first_part: bool,
    last_part: bool,
    ttl: float = 0.0,
) -> AppendResult:
    """Store one part of an add too large for one transaction (see unfinished.py).

    The part extends the session's lease by ``ttl`` from its last statement:
    it holds the lease's row locked meanwhile (PostgreSQL), so a renewal
    cannot do it then, and an import of parts back to back would otherwise
    outlive its own lease (store/postgres/renewals.py).
    """
    leases.require(db, session_id, token)
    if first_part:
        unfinished.begin(db, session_id, add_first_seq)
    else:
        unfinished.require(db, session_id, add_first_seq)
    results = _append_rows(db, session_id, first_seq, episodes)
    if last_part:
        unfinished.finish(db, session_id, add_first_seq)
    if ttl > 0:
        # No expiry check needed (leases.renew revives no expired lease): require() above holds the row (FOR SHARE
        # on PostgreSQL, the write lock on SQLite) since it found the lease unexpired, so nobody took it meanwhile.
        leases.extend(db, session_id, token, ttl)
    return results


def undo_append(db: Db, session_id: str, token: int, add_first_seq: int) -> None:
    """Undo the stored parts of an add that could not finish."""
    leases.require(db, session_id, token)
    unfinished.undo(db, session_id, add_first_seq)


def _append_rows(db: Db, session_id: str, first_seq: int, episodes: Sequence[Episode]) -> AppendResult:
    if first_seq == 1:
        # A session's row exists once it has stored anything (or was cleared).
        db.execute(INSERT_SESSION, (session_id,))
    results: list[tuple[Episode, bool]] = []
    seq = first_seq
    for episode in episodes:
        if db.execute(INSERT_EPISODE, episode_row(session_id, seq, episode)).rowcount:
            results.append((with_seq(episode, seq), True))
            seq += 1
            continue
        existing = db.execute(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND id = ?", (session_id, episode.id)
        ).fetchone()
        if existing is None:
            # The id is new, so the seq itself was taken: the caller's idea of
            # the session is stale (only possible if another writer shares it).
            raise StoreError(f"seq {seq} of session {session_id!r} is already taken")
        results.append((episode_from_row(existing), False))
    return tuple(results)


def episodes_between(db: Db, session_id: str, first_seq: int, last_seq: int) -> tuple[Episode, ...]:
    """The session's live episodes with ``first_seq <= seq <= last_seq``, in order."""
    return tuple(
        episode_from_row(row)
        for row in db.execute(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
            (session_id, first_seq, last_seq),
        ).fetchall()
    )


def segment_repair(db: Db, session_id: str) -> SegmentRepair | Composed | None:
    """:func:`segments.next_repair`, a leaf with its live episodes."""
    found = segments.next_repair(db, session_id)
    if isinstance(found, SegmentRepair) and found.parts is None:
        found = attrs.evolve(found, episodes=episodes_between(db, session_id, found.first_seq, found.through_seq))
    return found


def store_summary(db: Db, session_id: str, token: int, generation: int, through_seq: int, summary: str) -> bool:
    leases.require(db, session_id, token)
    cursor = db.execute(
        "INSERT INTO summaries (session_id, through_seq, generation, summary, created_at) "
        "SELECT ?, ?, ?, ?, ? "
        "WHERE coalesce((SELECT generation FROM sessions WHERE session_id = ?), 0) = ? "
        "ON CONFLICT (session_id, through_seq) DO UPDATE SET "
        "generation = excluded.generation, summary = excluded.summary, created_at = excluded.created_at",
        (session_id, through_seq, generation, summary, datetime.now(UTC).isoformat(), session_id, generation),
    )
    if cursor.rowcount != 1:
        return False
    _thin_summaries(db, session_id)
    return True


#: Of each scale (``2**level`` seqs), the summaries kept: the newest in each of this many latest slots of that size.
_SLOTS_PER_LEVEL = 3
_NEWEST_KEPT = 2


def most_kept(newest: int) -> int:
    """The most summaries a session keeps while its newest summary is through ``newest``: logarithmic in it."""
    return _NEWEST_KEPT + _SLOTS_PER_LEVEL * (max(newest, 1).bit_length() + 1)


def kept_summaries(through_seqs: Sequence[int]) -> list[int]:
    """Which summaries (by ``through_seq``, any order) a session keeps, newest first.

    Only the newest is read; older ones are what a delete falls back on: a
    delete of seq ``s`` drops every summary reaching ``s`` and re-summarizes
    from the newest one before it. So the newest two are kept, and for every
    scale ``2**level`` the newest summary of each of the last three slots of
    that size (``through_seq >> level``) up to the newest summary. A summary
    dropped once is never wanted again as more are stored (its slots only
    fall further back), so thinning after every store keeps what thinning
    everything at the end would. For a delete ``d`` seqs back from the newest
    summary, a kept summary lies at most about ``5 * d`` back (plus the
    spacing of the summaries), whatever the session's length; at most
    :func:`most_kept` rows (about 3 per doubling of the session's length).
    """
    ordered = sorted(set(through_seqs), reverse=True)
    if not ordered:
        return []
    newest = ordered[0]
    kept = set(ordered[:_NEWEST_KEPT])
    for level in range(newest.bit_length() + 1):
        oldest_slot = (newest >> level) - (_SLOTS_PER_LEVEL - 1)
        last_slot = None
        for through_seq in ordered:  # newest first: the first one seen in a slot is its newest
            slot = through_seq >> level
            if slot < oldest_slot:
                break
            if slot != last_slot:
                kept.add(through_seq)
                last_slot = slot
    return sorted(kept, reverse=True)


def _thin_summaries(db: Db, session_id: str) -> None:
    through_seqs = [
        row[0] for row in db.execute("SELECT through_seq FROM summaries WHERE session_id = ?", (session_id,)).fetchall()
    ]
    if len(through_seqs) <= _NEWEST_KEPT:
        return
    dropped = sorted(set(through_seqs) - set(kept_summaries(through_seqs)))
    for start in range(0, len(dropped), 500):
        chunk = dropped[start : start + 500]
        db.execute(
            f"DELETE FROM summaries WHERE session_id = ? AND through_seq IN ({placeholders(len(chunk))})",
            (session_id, *chunk),
        )


_SEQS_PER_STATEMENT = 1000  # one parameter each: far below the drivers' limits (PostgreSQL's is 65,535)


def delete_episodes(db: Db, session_id: str, token: int, seqs: Sequence[int]) -> tuple[int, SessionSnapshot]:
    """Delete the episodes among ``seqs`` (any number of them), all in the caller's one transaction."""
    leases.require(db, session_id, token)
    existing = [
        seq
        for chunk in _chunks(sorted(set(seqs)))
        for (seq,) in db.execute(
            f"SELECT seq FROM episodes WHERE session_id = ? AND seq IN ({placeholders(len(chunk))})",
            (session_id, *chunk),
        ).fetchall()
    ]
    if not existing:
        return 0, load(db, session_id)
    # Before deleting: the seq floor must include the rows about to go. This locks the
    # session's row, as a claim does before it marks a batch handed on.
    bump_generation(db, session_id)
    handed_through = outbox.handed_through(db, session_id)
    for chunk in _chunks(existing):
        db.execute(
            f"DELETE FROM episodes WHERE session_id = ? AND seq IN ({placeholders(len(chunk))})", (session_id, *chunk)
        )
    # A summary through k covers every live episode up to k.
    db.execute("DELETE FROM summaries WHERE session_id = ? AND through_seq >= ?", (session_id, min(existing)))
    if segments.invalidate(db, session_id, existing):
        # Segmented: the leaves that held them lose their text, and the summary is composed again at once
        # from the rest, the holes marked (store/segments.py).
        (generation,) = db.execute("SELECT generation FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        segments.compose(db, session_id, generation)
    # Deleted means deleted: undelivered retain batches lose them too, and the sink
    # forgets those it may hold, after the batches that carried them.
    outbox.revise_after_delete(db, session_id, existing)
    set_aside.drop_summary_mark(db, session_id)
    handed = [seq for seq in existing if seq <= handed_through]
    if handed:
        outbox.record_forget(db, session_id, handed, handed_through)
    return len(existing), load(db, session_id)


def _chunks(seqs: Sequence[int]) -> list[Sequence[int]]:
    return [seqs[start : start + _SEQS_PER_STATEMENT] for start in range(0, len(seqs), _SEQS_PER_STATEMENT)]


def clear_session(db: Db, session_id: str, token: int) -> SessionSnapshot:
    leases.require(db, session_id, token)
    bump_generation(db, session_id)
    handed_through = outbox.handed_through(db, session_id)
    # The sink forgets the session if it may hold a live episode of it.
    handed = db.execute(
        "SELECT 1 FROM episodes WHERE session_id = ? AND seq <= ? LIMIT 1", (session_id, handed_through)
    ).fetchone()
    db.execute("DELETE FROM episodes WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM summaries WHERE session_id = ?", (session_id,))
    segments.drop(db, session_id)
    outbox.drop_session(db, session_id)
    set_aside.drop_summary_mark(db, session_id)
    if handed is not None:
        outbox.record_forget(db, session_id, None, handed_through)
    return load(db, session_id)


def sessions_needing_summary(
    db: Db, owner: str, max_episodes: int, max_chars: int, orphaned_only: bool = False
) -> list[str]:
    """Sessions (not owned by another live process) with episodes evicted but not summarized, or holes.

    Evicted: up to the stored boundary, or overflowing the window's episode and
    character bounds (a token bound is the activated session's to apply).
    A session whose summary batch is set aside is left alone until retried.
    """
    condition, params = leases.unowned(owner, orphaned_only)
    condition += " AND NOT " + set_aside.SUMMARY_SET_ASIDE.format(session="s")
    rows = db.execute(
        "WITH latest AS ("
        "  SELECT s.session_id, s.evicted_through, coalesce("
        "    (SELECT max(through_seq) FROM summaries AS m WHERE m.session_id = s.session_id), 0) AS through"
        f"  FROM sessions AS s WHERE {condition}) "
        "SELECT latest.session_id FROM latest "
        "JOIN episodes AS e ON e.session_id = latest.session_id AND e.seq > latest.through "
        "GROUP BY latest.session_id "
        "HAVING count(*) > ? OR sum(length(e.content)) > ? OR max(latest.evicted_through) > max(latest.through) "
        "ORDER BY latest.session_id",
        (*params, max_episodes, max_chars),
    ).fetchall()
    # And segmented sessions with a leaf a delete erased (store/segments.py): left by a process that stopped.
    holes = db.execute(
        "SELECT DISTINCT s.session_id FROM sessions AS s JOIN summary_segments AS g "
        f"ON g.session_id = s.session_id AND g.level = 0 AND g.summary IS NULL WHERE {condition}",
        params,
    ).fetchall()
    return sorted({row[0] for row in rows} | {row[0] for row in holes})


def list_sessions(db: Db) -> list[SessionRow]:
    rows = db.execute(
        "SELECT s.session_id, s.generation, "
        "  (SELECT count(*) FROM episodes AS e WHERE e.session_id = s.session_id), "
        "  coalesce((SELECT max(through_seq) FROM summaries AS m WHERE m.session_id = s.session_id), 0), "
        "  {greatest}(s.seq_floor, coalesce("
        "    (SELECT max(seq) FROM episodes AS e WHERE e.session_id = s.session_id), 0)) "
        "FROM sessions AS s ORDER BY s.session_id"
    ).fetchall()
    return [SessionRow(*row) for row in rows]


def bump_generation(db: Db, session_id: str) -> None:
    """Fence whatever was computed from the session's episodes so far (summaries in flight are refused)."""
    db.execute(
        "INSERT INTO sessions (session_id, generation, seq_floor) VALUES (?, 1, "
        "  coalesce((SELECT max(seq) FROM episodes WHERE session_id = ?), 0)) "
        "ON CONFLICT (session_id) DO UPDATE SET generation = sessions.generation + 1, "
        "  seq_floor = {greatest}(sessions.seq_floor, excluded.seq_floor)",
        (session_id, session_id),
    )


def load(db: Db, session_id: str) -> SessionSnapshot:
    """The session's latest summary and the live episodes after it."""
    session = db.execute(
        "SELECT generation, seq_floor, retained_through, evicted_through FROM sessions WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    generation, seq_floor, retained_through, evicted_through = session if session is not None else (0, 0, 0, 0)
    latest = db.execute(
        "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    summarized_through, summary = latest if latest is not None else (0, None)
    summary = summary or None  # (a segmented session whose every summarized episode was deleted: "")
    episodes = tuple(
        episode_from_row(row)
        for row in db.execute(
            f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, summarized_through),
        ).fetchall()
    )
    (max_seq,) = db.execute("SELECT max(seq) FROM episodes WHERE session_id = ?", (session_id,)).fetchone()
    return SessionSnapshot(
        session_id=session_id,
        generation=generation,
        last_seq=max(seq_floor, max_seq or 0),
        summary=summary,
        summarized_through=summarized_through,
        episodes=episodes,
        retained_through=retained_through,
        evicted_through=evicted_through,
        summary_set_aside=set_aside.summary_of(db, session_id),
        segments=segments.state(db, session_id),
    )


_RECORD_EVICTION = "UPDATE sessions SET evicted_through = {greatest}(evicted_through, ?) WHERE session_id = ?"


def record_eviction(db: Db, session_id: str, token: int, through_seq: int) -> None:
    """Store how far the session's raw window has evicted (it only moves forward)."""
    leases.require(db, session_id, token)
    db.execute(_RECORD_EVICTION, (through_seq, session_id))


def record_evictions(db: Db, evictions: Sequence[tuple[str, int, int]]) -> None:
    """:func:`record_eviction` for several ``(session_id, token, through_seq)``, their leases checked by the caller."""
    db.executemany(
        _RECORD_EVICTION,
        # In session order, as leases are locked: concurrent writers on PostgreSQL take the rows in one order.
        sorted([(through_seq, session_id) for session_id, _, through_seq in evictions], key=lambda row: row[1]),
    )


def activate(db: Db, session_id: str, owner: str, ttl: float) -> tuple[int, SessionSnapshot] | SessionBusyError:
    """Take the session's lease and load its state, in one transaction (or say who holds it)."""
    token = leases.acquire(db, session_id, owner, ttl)
    if isinstance(token, SessionBusyError):
        return token
    # The former owner may have stopped in the middle of a large add: nothing of it was acknowledged.
    unfinished.undo_all(db, session_id)
    snapshot = load(db, session_id)
    # Counted again from now: loading a large session can take longer than the lease (its row is locked
    # by this transaction since it was taken, so nobody else took it meanwhile).
    leases.extend(db, session_id, token, ttl)
    return token, snapshot
