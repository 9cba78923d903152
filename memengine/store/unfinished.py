"""Adds too large for one transaction: stored in several, undone as one unless all of them commit.

One ``add`` of many episodes is split into bounded transactions, so that no
transaction holds the store (and every other writer, and the lease renewals)
for long. The first part records a marker ``(session_id, first_seq)``; every
later part checks it is still there; the last part removes it. A part that
fails makes the store undo the earlier ones. If the process dies in between,
the marker stays, and whoever next takes the session on (activation, the
retain tail of a dead owner's session) undoes the parts first: an add is
stored whole or not at all, as one caller sees it.

Only the session's owner adds to it, one add at a time, so every episode at or
after an unfinished add's first seq belongs to that add. Readers that see the
journal directly (recall) leave those rows out with :data:`VISIBLE`.
"""

from __future__ import annotations

from ..errors import StoreError
from .dialect import Db

#: SQL condition: the episode aliased ``e`` is not part of an add still being stored.
VISIBLE = (
    "NOT EXISTS (SELECT 1 FROM unfinished_appends AS u WHERE u.session_id = e.session_id AND e.seq >= u.first_seq)"
)


def begin(db: Db, session_id: str, first_seq: int) -> None:
    db.execute("INSERT INTO unfinished_appends (session_id, first_seq) VALUES (?, ?)", (session_id, first_seq))


def require(db: Db, session_id: str, first_seq: int) -> None:
    """Refuse a later part of an add that was undone meanwhile (by a takeover or an engine exit)."""
    row = db.execute(
        "SELECT 1 FROM unfinished_appends WHERE session_id = ? AND first_seq = ?", (session_id, first_seq)
    ).fetchone()
    if row is None:
        raise StoreError(f"session {session_id!r}: the add starting at seq {first_seq} was undone before it finished")


def finish(db: Db, session_id: str, first_seq: int) -> None:
    db.execute("DELETE FROM unfinished_appends WHERE session_id = ? AND first_seq = ?", (session_id, first_seq))


def undo(db: Db, session_id: str, first_seq: int) -> None:
    """Remove the stored parts of the unfinished add starting at ``first_seq`` (nothing if it finished)."""
    row = db.execute(
        "SELECT 1 FROM unfinished_appends WHERE session_id = ? AND first_seq = ?", (session_id, first_seq)
    ).fetchone()
    if row is None:
        return
    db.execute("DELETE FROM episodes WHERE session_id = ? AND seq >= ?", (session_id, first_seq))
    finish(db, session_id, first_seq)


def undo_all(db: Db, session_id: str) -> None:
    """Undo every unfinished add of the session (its former owner stopped in the middle)."""
    for (first_seq,) in db.execute(
        "SELECT first_seq FROM unfinished_appends WHERE session_id = ? ORDER BY first_seq", (session_id,)
    ).fetchall():
        undo(db, session_id, first_seq)
