"""Idle hand-off: a session another process asks for moves to it once its owner has nothing in flight for it.

A call for a session that a live process owns used to wait for the lease
(``lease_wait``) and fail, although the owner was only keeping an idle
session in memory (``passivate_after`` is 300 s by default). Now the asker
marks the lease row *wanted* (in the transaction that found it busy, never
waiting for a row another transaction holds), and keeps trying within
``lease_wait``. The owner looks for marks on its leases every quarter second
(``Engine._hand_over_wanted``) and tells those sessions to passivate as soon
as they have no work in flight (no append, summary, waiting read or retain
flush), as an idle session does: its partial retain batch goes to the outbox,
its lease is released, and the asker takes it on its next try. A session
with work in flight keeps it until the work is done; a client call to it
meanwhile keeps it too (the mark is seen again and again, so it moves once
quiet). Taking a lease clears the mark.
"""

from __future__ import annotations

from .dialect import Db

WANTED_COLUMN = "ALTER TABLE session_leases ADD COLUMN wanted_at double precision"


def mark_wanted(db: Db, session_id: str) -> None:
    """Ask the session's owner to let it go when idle (a row another transaction holds is left alone)."""
    db.execute(
        "UPDATE session_leases SET wanted_at = {now} WHERE session_id IN ("
        "  SELECT session_id FROM session_leases WHERE session_id = ? AND owner IS NOT NULL{skip_locked})",
        (session_id,),
    )


def wanted(db: Db, owner: str) -> list[str]:
    """The sessions ``owner`` holds that another process asked for."""
    rows = db.execute(
        "SELECT session_id FROM session_leases WHERE owner = ? AND wanted_at IS NOT NULL AND expires_at > {now}",
        (owner,),
    ).fetchall()
    return [row[0] for row in rows]
