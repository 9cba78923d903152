"""Sessions whose owner died: released once nothing is left to do for them.

A process that dies leaves its leases held, and they expire. Every engine
sweeps such orphaned sessions every ``lease_ttl`` (engine/owner_watch.py): their
un-retained tails go to the outbox and their overflowing windows are
summarized (by activating them, which takes and later releases the lease).
What needs nothing more is released here, so each dead lease is visited a few
times, not at every sweep for ever; a session with work left stays orphaned,
and so stays found, until it got it.
"""

from __future__ import annotations

from . import set_aside
from .dialect import Db

#: Leases one step looks at (one transaction each; renewals and writes go in between).
STEP = 500


def release_handled(
    db: Db, max_episodes: int, max_chars: int, retaining: bool, after: str | None
) -> tuple[int, str | None]:
    """Release the orphaned leases after ``after`` (in id order) that need no summary, nor a retain if ``retaining``.

    Returns how many were released, and where the next step starts (``None`` when none are left).
    Leases another transaction holds locked are skipped (PostgreSQL).
    """
    rows = db.execute(
        "SELECT session_id FROM session_leases WHERE owner IS NOT NULL AND expires_at <= {now} AND session_id > ? "
        "ORDER BY session_id LIMIT ?{skip_locked}",
        (after or "", STEP),
    ).fetchall()
    if not rows:
        return 0, None
    released = 0
    untold = (
        "AND NOT EXISTS (SELECT 1 FROM sessions AS s JOIN episodes AS e ON e.session_id = s.session_id "
        "  AND e.seq > s.retained_through WHERE s.session_id = l.session_id) "
        if retaining
        else ""
    )
    summary_set_aside = set_aside.SUMMARY_SET_ASIDE.format(session="l")
    for start in range(0, len(rows), 100):
        chunk = [row[0] for row in rows[start : start + 100]]
        marks = ", ".join("?" * len(chunk))
        cursor = db.execute(
            "UPDATE session_leases AS l SET owner = NULL, expires_at = 0 "
            f"WHERE l.session_id IN ({marks}) AND l.owner IS NOT NULL AND l.expires_at <= {{now}} {untold}"
            f"AND ({summary_set_aside} OR "  # set aside: no summary is made for it until a retry
            "(NOT (SELECT count(*) > ? OR coalesce(sum(length(e.content)), 0) > ? FROM episodes AS e "
            "  WHERE e.session_id = l.session_id AND e.seq > coalesce("
            "    (SELECT max(m.through_seq) FROM summaries AS m WHERE m.session_id = l.session_id), 0)) "
            "AND NOT EXISTS (SELECT 1 FROM sessions AS s WHERE s.session_id = l.session_id AND s.evicted_through > "
            "  coalesce((SELECT max(m.through_seq) FROM summaries AS m WHERE m.session_id = l.session_id), 0)) "
            # nor a segmented summary's hole, left by a delete (store/segments.py)
            "AND NOT EXISTS (SELECT 1 FROM summary_segments AS g WHERE g.session_id = l.session_id AND g.level = 0 "
            "  AND g.summary IS NULL)))",
            (*chunk, max_episodes, max_chars),
        )
        released += max(cursor.rowcount, 0)
    return released, (rows[-1][0] if len(rows) == STEP else None)
