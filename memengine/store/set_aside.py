"""Work set aside: summary and retain batches given up on after too many failed rounds.

Every function runs inside a store transaction, on either backend (see
dialect.py). A session's summary batch is set aside with a row in
``summaries_set_aside`` that holds the session's generation: a clear or
delete (a new generation) removes it in its own transaction (its error text
may quote removed episodes), so the session's new content gets fresh tries;
a row of an older generation (left by code that did not know the marks)
counts nowhere. While the row is current, no
engine summarizes the session (its episodes stay stored and shown raw) and
the orphan sweep leaves the session alone. A retain batch is set aside in
place (``retain_outbox.set_aside_at``): it stays in the outbox, and as the
oldest batch of its session it keeps the session's later batches behind it
(outbox.py), so they never overtake it.
"""

from __future__ import annotations

import time

from . import leases
from .base import SetAside, SetAsideCounts
from .dialect import Db

#: The condition, on a session ``s``, that its summary batch is set aside (a current mark).
SUMMARY_SET_ASIDE = (
    "EXISTS (SELECT 1 FROM summaries_set_aside AS a JOIN sessions AS g ON g.session_id = a.session_id "
    "WHERE a.session_id = {session}.session_id AND a.generation = g.generation)"
)


def set_summary_aside(
    db: Db,
    session_id: str,
    token: int,
    generation: int,
    through_seq: int,
    attempts: int,
    error: str,
    first_seq: int | None = None,
) -> bool:
    """Record that the session's summary batch up to ``through_seq`` is set aside; False if ``generation`` is stale.

    ``first_seq`` is kept only for a batch that does not start right after the session's summary (a
    segmented session's repair); the listing otherwise reads it from the summary.
    """
    leases.require(db, session_id, token)
    row = db.execute("SELECT generation FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    if (row[0] if row is not None else 0) != generation:
        return False
    db.execute(
        "INSERT INTO summaries_set_aside (session_id, generation, first_seq, through_seq, attempts, error, "
        "set_aside_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
        "generation = excluded.generation, first_seq = excluded.first_seq, through_seq = excluded.through_seq, "
        "attempts = excluded.attempts, error = excluded.error, set_aside_at = excluded.set_aside_at",
        (session_id, generation, first_seq, through_seq, attempts, error[:2000], time.time()),
    )
    return True


def clear_summary_mark(db: Db, session_id: str, token: int | None) -> bool:
    """Lift the session's summary mark (under its live lease if ``token``); True if a current one was lifted."""
    if token is not None:
        leases.require(db, session_id, token)
    current = db.execute(
        "SELECT 1 FROM summaries_set_aside AS s WHERE s.session_id = ? AND " + SUMMARY_SET_ASIDE.format(session="s"),
        (session_id,),
    ).fetchone()
    db.execute("DELETE FROM summaries_set_aside WHERE session_id = ?", (session_id,))
    return current is not None


def drop_summary_mark(db: Db, session_id: str) -> None:
    """After a clear or delete: the mark's error text may quote removed episodes (and the mark no longer holds)."""
    db.execute("DELETE FROM summaries_set_aside WHERE session_id = ?", (session_id,))


def summary_of(db: Db, session_id: str) -> SetAside | None:
    """The session's current summary mark, if its summary batch is set aside."""
    found = _summaries(db, session_id, 1)
    return found[0] if found else None


def listing(db: Db, session_id: str | None, limit: int) -> list[SetAside]:
    """Set-aside work (of one session, or all), summaries first, then retain batches oldest first."""
    summaries = _summaries(db, session_id, limit)
    where, params = _retain_filter(session_id)
    retains = [
        SetAside("retain", session_id_, first_seq, last_seq, attempts, error or "", set_aside_at)
        for session_id_, first_seq, last_seq, attempts, error, set_aside_at in db.execute(
            "SELECT session_id, first_seq, last_seq, attempts, last_error, set_aside_at FROM retain_outbox "
            f"WHERE {where} ORDER BY id LIMIT ?",
            (*params, limit),
        ).fetchall()
    ]
    return [*summaries, *retains][:limit]


def counts(db: Db) -> SetAsideCounts:
    (summaries,) = db.execute(
        "SELECT count(*) FROM summaries_set_aside AS s WHERE " + SUMMARY_SET_ASIDE.format(session="s")
    ).fetchone()
    (retains,) = db.execute("SELECT count(*) FROM retain_outbox WHERE set_aside_at IS NOT NULL").fetchone()
    return SetAsideCounts(int(summaries), int(retains))


def retry_retains(db: Db, session_id: str | None) -> int:
    """Put set-aside retain batches back into delivery, due at once, with their attempts counted afresh."""
    where, params = _retain_filter(session_id)
    cursor = db.execute(
        f"UPDATE retain_outbox SET set_aside_at = NULL, retry_at = NULL, attempts = 0 WHERE {where}", params
    )
    return max(int(cursor.rowcount), 0)


def discard_retains(db: Db, session_id: str | None) -> list[SetAside]:
    """Drop set-aside retain batches from the outbox (the sink never gets them); return what was dropped."""
    where, params = _retain_filter(session_id)
    dropped = [
        SetAside("retain", row[0], row[1], row[2], row[3], row[4] or "", row[5])
        for row in db.execute(
            "SELECT session_id, first_seq, last_seq, attempts, last_error, set_aside_at, id FROM retain_outbox "
            f"WHERE {where} ORDER BY id",
            params,
        ).fetchall()
    ]
    db.execute(f"DELETE FROM retain_outbox WHERE {where}", params)
    return dropped


def _retain_filter(session_id: str | None) -> tuple[str, tuple[str, ...]]:
    if session_id is None:
        return "set_aside_at IS NOT NULL", ()
    return "set_aside_at IS NOT NULL AND session_id = ?", (session_id,)


def _summaries(db: Db, session_id: str | None, limit: int) -> list[SetAside]:
    one = "" if session_id is None else " AND s.session_id = ?"
    rows = db.execute(
        "SELECT s.session_id, coalesce(s.first_seq, coalesce((SELECT max(m.through_seq) FROM summaries AS m "
        "  WHERE m.session_id = s.session_id), 0) + 1), s.through_seq, s.attempts, s.error, s.set_aside_at "
        "FROM summaries_set_aside AS s WHERE " + SUMMARY_SET_ASIDE.format(session="s") + one + " "
        "ORDER BY s.session_id LIMIT ?",
        (*(() if session_id is None else (session_id,)), limit),
    ).fetchall()
    return [SetAside("summary", *row) for row in rows]
