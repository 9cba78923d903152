"""Erasing a session and everything stored about it: ``Engine.forget``, one session at a time.

A session is erased by its owner, under its lease (the engine activates it
first, so a session another process holds is handed over, store/handover.py),
in bounded steps, each its own transaction:

- while the session has more than ``limit`` episodes: its summaries (and segments) go, its
  generation changes (a summary computed before can never land), and its
  ``limit`` newest episodes go, out of the undelivered retain batches too
  (the recall index loses them in the same transaction: a trigger on
  SQLite, the GIN index on PostgreSQL);
- the last step takes the path of ``clear()`` (journal.clear_session: the
  rest of the episodes and summaries, and the session's undelivered retain
  batches), then the session's last traces: its row in ``sessions``, an add
  left unfinished, and its lease. If the clear left something in the retain
  outbox for the sink (what a clear hands on), the row and the lease stay,
  without content, until it is delivered: a later forget removes them.

Each step is idempotent and the erasure resumable: a process that dies in
between leaves a session with fewer episodes, which the next ``forget``
erases further. No step is bigger than one add's transaction, so other
sessions' writers go in between.

Deleting the lease row would let the session's fencing tokens start again at
1 if its id is used again; a process paused across the erasure, holding an
old token, could then pass a new lease's check. So the erased lease's token
raises a store-wide floor (``lease_token_floor``, leases.py), and a lease
row created afterwards starts above it: a token is never handed out twice.
"""

from __future__ import annotations

import attrs

from . import journal, leases, outbox, segments
from .base import Erased
from .dialect import Db


def erase_step(db: Db, session_id: str, token: int, limit: int) -> Erased:
    """One step of erasing the session (see the module docstring); ``complete`` once nothing of it is left."""
    leases.require(db, session_id, token)
    if db.dialect.name != "sqlite":
        return _erase_step(db, session_id, token, limit)
    # SQLite keeps deleted bytes in the file's pages until they are reused: overwritten here, for these deletes.
    db.execute("PRAGMA secure_delete = ON")
    try:
        return _erase_step(db, session_id, token, limit)
    finally:
        db.execute("PRAGMA secure_delete = OFF")


def _erase_step(db: Db, session_id: str, token: int, limit: int) -> Erased:
    summaries = db.execute("DELETE FROM summaries WHERE session_id = ?", (session_id,)).rowcount
    summaries += segments.drop(db, session_id)
    newest = db.execute(
        "SELECT seq FROM episodes WHERE session_id = ? ORDER BY seq DESC LIMIT ?", (session_id, limit + 1)
    ).fetchall()
    if len(newest) > limit:
        # The newest go first: the oldest, which a retain sink may hold, stay for the last step's clear,
        # which tells the sink about the whole session (as clear() does) if it may hold any of it.
        journal.bump_generation(db, session_id)
        deleted = [seq for (seq,) in newest[:limit]]
        db.execute("DELETE FROM episodes WHERE session_id = ? AND seq >= ?", (session_id, deleted[-1]))
        outbox.revise_after_delete(db, session_id, deleted)
        return Erased(episodes=len(deleted), summaries=summaries, outbox_batches=0, complete=False)
    batches = _outbox_rows(db, session_id)
    journal.clear_session(db, session_id, token)  # the path of clear(): whatever it hands on, forget does too
    db.execute("DELETE FROM unfinished_appends WHERE session_id = ?", (session_id,))
    waiting = _outbox_rows(db, session_id)
    erased = Erased(episodes=len(newest), summaries=summaries, outbox_batches=len(batches - waiting))
    if waiting:
        # What clear() left for the retain sink to deliver still needs the session's row: the row (no content)
        # and the lease stay until it is delivered, and a later forget removes them.
        return attrs.evolve(erased, traces_left=True)
    db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
    _raise_token_floor(db, token)
    db.execute("DELETE FROM session_leases WHERE session_id = ?", (session_id,))
    return erased


def _outbox_rows(db: Db, session_id: str) -> set[int]:
    return {row[0] for row in db.execute("SELECT id FROM retain_outbox WHERE session_id = ?", (session_id,)).fetchall()}


def _raise_token_floor(db: Db, token: int) -> None:
    db.execute(
        "INSERT INTO lease_token_floor (id, token) VALUES (1, ?) "
        "ON CONFLICT (id) DO UPDATE SET token = {greatest}(lease_token_floor.token, excluded.token)",
        (token,),
    )
