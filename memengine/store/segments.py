"""Segment summaries: the summarized past as a tree, so that a delete re-summarizes a few nodes, not the session.

With ``SessionConfig.segment_summaries`` a session's summarized episodes are
kept as *leaves*, one per summarizer batch, each summarized on its own
(``summarize(None, batch)``), and *folds* above them: node ``(level, index)``
covers leaves ``index * 2**level`` to ``(index + 1) * 2**level - 1`` and is
made from its two children by one summarizer call. The rows are in
``summary_segments``; a leaf's range of seqs runs from the seq after the
previous leaf's through its batch's last, so the leaves tile the summarized
seqs with no gap.

The summary a read gets is *composed*: the texts of the largest nodes that
tile the leaves, oldest first (one per set bit of the leaf count once every
fold is made; a backlog of evicted episodes goes ahead of folds only while
there are at most two parts more), joined by
:data:`PART_SEPARATOR`. It is stored in ``summaries`` as the session's summary
through the last leaf, so whatever reads a session's summary reads it as before.

A delete of seq ``s`` erases, in its own transaction, the text of the leaf that
holds ``s`` (the row stays, its summary NULL: a *hole*, to be summarized
again) and deletes every node above it; the composed summary is made again at
once, with :data:`HOLE_MARKER` where the leaf was (a read reports its range
as ``Context.resummarizing``: its live episodes are neither summarized nor
shown meanwhile). The summarizer child then makes that leaf again (one
call) and the folds above it (one per level): about ``log2(leaves)`` calls,
however old the deleted episode. The work, in the order the session
dispatches it: a hole; new episodes evicted from the window (a new leaf);
a fold (two sibling nodes of the composed summary whose parent is missing).

A session that had a rolling summary when it was first segmented keeps it as
its first leaf (a delete in it costs a re-summary of its range, in calls of
the usual size). Once segmented, a session stays so.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime

from . import leases
from .base import Composed, SegmentRepair, SegmentState
from .dialect import Db

#: Between the texts of the nodes a composed summary is made of.
PART_SEPARATOR = "\n\n"
#: Where a composed summary leaves out a leaf being summarized again after a delete.
HOLE_MARKER = (
    "[memengine: episodes {first}..{last} are being summarized again after a delete; "
    "they are not in this summary yet, nor shown]"
)


#: Parts a composed summary may have beyond its folded shape before folds go ahead of new leaves.
_SPARE_PARTS = 2

_Node = tuple[int, int, bool]  # first_seq, through_seq, stale (a leaf whose text a delete erased)


def _nodes(db: Db, session_id: str) -> dict[tuple[int, int], _Node]:
    rows = db.execute(
        "SELECT level, idx, first_seq, through_seq, summary IS NULL FROM summary_segments WHERE session_id = ?",
        (session_id,),
    ).fetchall()
    return {(level, index): (first, through, bool(stale)) for level, index, first, through, stale in rows}


def _tiling(nodes: dict[tuple[int, int], _Node]) -> list[tuple[int, int]]:
    """The largest whole nodes that tile the leaves, oldest first; a stale leaf stands for itself."""
    leaves = 1 + max((index for level, index in nodes if level == 0), default=-1)
    parts: list[tuple[int, int]] = []
    position = 0
    while position < leaves:
        level = 0
        while position % (2 ** (level + 1)) == 0 and (level + 1, position >> (level + 1)) in nodes:
            level += 1
        parts.append((level, position >> level))
        position += 2**level
    return parts


def _state(nodes: dict[tuple[int, int], _Node], parts: list[tuple[int, int]]) -> SegmentState:
    holes: list[tuple[int, int]] = []
    for level, index in parts:
        first, through, stale = nodes[(level, index)]
        if not stale:
            continue
        if holes and holes[-1][1] + 1 == first:
            holes[-1] = (holes[-1][0], through)  # neighbouring holes read as one range
        else:
            holes.append((first, through))
    due = _fold_due(nodes, parts) is not None
    # Folded as far as it goes, the summary has a part per set bit of the leaf count. A backlog of
    # evicted episodes goes first, but not so long that the summary grows a part per leaf.
    leaves = 1 + max(index for level, index in nodes if level == 0)
    folds_first = due and len(parts) > leaves.bit_length() + _SPARE_PARTS
    return SegmentState(holes=tuple(holes), folds_due=due, folds_first=folds_first)


def _fold_due(nodes: dict[tuple[int, int], _Node], parts: list[tuple[int, int]]) -> tuple[int, int] | None:
    """Two neighbouring parts that are siblings (neither stale): their parent, to make."""
    for (level, index), (next_level, next_index) in itertools.pairwise(parts):
        if level == next_level and index % 2 == 0 and next_index == index + 1:
            if not nodes[(level, index)][2] and not nodes[(level, index + 1)][2]:
                return level + 1, index // 2
    return None


def state(db: Db, session_id: str) -> SegmentState | None:
    """The session's holes and whether folds are due; None if it is not segmented."""
    nodes = _nodes(db, session_id)
    if not nodes:
        return None
    return _state(nodes, _tiling(nodes))


def compose(db: Db, session_id: str, generation: int) -> Composed | None:
    """Make the composed summary again and store it as the session's summary; None if it is not segmented."""
    nodes = _nodes(db, session_id)
    if not nodes:
        return None
    parts = _tiling(nodes)
    texts = _texts(db, session_id, [part for part in parts if not nodes[part][2]])
    pieces: list[str] = []
    for part in parts:
        first, through, stale = nodes[part]
        if stale:
            pieces.append(HOLE_MARKER.format(first=first, last=through))
        elif texts[part]:
            pieces.append(texts[part])
    text = PART_SEPARATOR.join(pieces) or None
    through_seq = nodes[parts[-1]][1]
    # Only the newest summary is kept: a delete goes through the segments, not back to an older summary.
    db.execute("DELETE FROM summaries WHERE session_id = ? AND through_seq <> ?", (session_id, through_seq))
    if text is None:
        db.execute("DELETE FROM summaries WHERE session_id = ?", (session_id,))
    else:
        db.execute(
            "INSERT INTO summaries (session_id, through_seq, generation, summary, created_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (session_id, through_seq) DO UPDATE SET "
            "generation = excluded.generation, summary = excluded.summary, created_at = excluded.created_at",
            (session_id, through_seq, generation, text, _now()),
        )
    return Composed(through_seq, text, _state(nodes, parts))


def _texts(db: Db, session_id: str, parts: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
    found: dict[tuple[int, int], str] = {}
    for start in range(0, len(parts), 100):
        chunk = parts[start : start + 100]
        condition = " OR ".join(["(level = ? AND idx = ?)"] * len(chunk))
        rows = db.execute(
            f"SELECT level, idx, summary FROM summary_segments WHERE session_id = ? AND ({condition})",
            (session_id, *[value for part in chunk for value in part]),
        ).fetchall()
        found.update({(level, index): summary for level, index, summary in rows})
    return found


def _generation_is(db: Db, session_id: str, generation: int) -> bool:
    row = db.execute("SELECT generation FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return (row[0] if row is not None else 0) == generation


def store_leaf(db: Db, session_id: str, token: int, generation: int, through_seq: int, summary: str) -> Composed | None:
    """Store a new leaf, the summary of the evicted episodes up to ``through_seq``; None if refused.

    Refused (nothing written) when ``generation`` is no longer the session's,
    or ``through_seq`` is not past the last leaf. A session with a rolling
    summary and no leaves yet keeps that summary as its first leaf.
    """
    leases.require(db, session_id, token)
    if not _generation_is(db, session_id, generation):
        return None
    last = db.execute(
        "SELECT idx, through_seq FROM summary_segments WHERE session_id = ? AND level = 0 ORDER BY idx DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    if last is None:
        rolling = db.execute(
            "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq DESC LIMIT 1",
            (session_id,),
        ).fetchone()
        if rolling is not None:
            _insert(db, session_id, 0, 0, 1, rolling[0], generation, rolling[1])
            last = (0, rolling[0])
    index, first_seq = (0, 1) if last is None else (last[0] + 1, last[1] + 1)
    if through_seq < first_seq:
        return None
    _insert(db, session_id, 0, index, first_seq, through_seq, generation, summary)
    return compose(db, session_id, generation)


def store_node(
    db: Db, session_id: str, token: int, generation: int, level: int, index: int, summary: str
) -> Composed | None:
    """Store a node the repair made: a stale leaf's new text, or a fold of two children; None if refused.

    Refused (nothing written) when ``generation`` is no longer the session's,
    the leaf is not stale, or the fold's children are not both there.
    """
    leases.require(db, session_id, token)
    if not _generation_is(db, session_id, generation):
        return None
    if level == 0:
        updated = db.execute(
            "UPDATE summary_segments SET summary = ?, generation = ?, created_at = ? "
            "WHERE session_id = ? AND level = 0 AND idx = ? AND summary IS NULL",
            (summary, generation, _now(), session_id, index),
        ).rowcount
        if updated != 1:
            return None
    else:
        children = db.execute(
            "SELECT idx, first_seq, through_seq FROM summary_segments "
            "WHERE session_id = ? AND level = ? AND idx IN (?, ?) AND summary IS NOT NULL ORDER BY idx",
            (session_id, level - 1, 2 * index, 2 * index + 1),
        ).fetchall()
        if len(children) != 2:
            return None
        _insert(db, session_id, level, index, children[0][1], children[1][2], generation, summary, upsert=True)
    return compose(db, session_id, generation)


def _insert(
    db: Db,
    session_id: str,
    level: int,
    index: int,
    first_seq: int,
    through_seq: int,
    generation: int,
    summary: str,
    upsert: bool = False,
) -> None:
    conflict = (
        "ON CONFLICT (session_id, level, idx) DO UPDATE SET first_seq = excluded.first_seq, "
        "through_seq = excluded.through_seq, generation = excluded.generation, summary = excluded.summary, "
        "created_at = excluded.created_at"
        if upsert
        else ""
    )
    db.execute(
        "INSERT INTO summary_segments (session_id, level, idx, first_seq, through_seq, generation, summary, "
        f"created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) {conflict}",
        (session_id, level, index, first_seq, through_seq, generation, summary, _now()),
    )


def next_repair(db: Db, session_id: str) -> SegmentRepair | Composed | None:
    """The next node to make (a hole first, then a fold), or the composed summary if none is due.

    A leaf comes without its episodes: the caller reads them (journal.py
    imports this module).

    None if the session is not segmented. A read: the write that stores the
    node checks that it is still wanted.
    """
    nodes = _nodes(db, session_id)
    if not nodes:
        return None
    parts = _tiling(nodes)
    for part in parts:
        first, through, stale = nodes[part]
        if stale:  # (its live episodes are read by the caller: journal.episodes_between)
            return SegmentRepair(part[0], part[1], first, through)
    due = _fold_due(nodes, parts)
    if due is not None:
        level, index = due
        texts = _texts(db, session_id, [(level - 1, 2 * index), (level - 1, 2 * index + 1)])
        left, right = nodes[(level - 1, 2 * index)], nodes[(level - 1, 2 * index + 1)]
        pair = (texts[(level - 1, 2 * index)], texts[(level - 1, 2 * index + 1)])
        return SegmentRepair(level, index, left[0], right[1], parts=pair)
    row = db.execute(
        "SELECT summary FROM summaries WHERE session_id = ? AND through_seq = ?", (session_id, nodes[parts[-1]][1])
    ).fetchone()
    return Composed(nodes[parts[-1]][1], row[0] if row is not None else None, _state(nodes, parts))


def invalidate(db: Db, session_id: str, deleted: Sequence[int]) -> bool:
    """After a delete of the seqs ``deleted``: erase the leaves holding any of them and every node above.

    Returns whether the session is segmented (then the caller composes its
    summary again rather than dropping summaries back to before the delete).
    """
    leaves = db.execute(
        "SELECT idx, first_seq, through_seq FROM summary_segments WHERE session_id = ? AND level = 0 ORDER BY idx",
        (session_id,),
    ).fetchall()
    if not leaves:
        return False
    hit: set[int] = set()
    position = 0
    for seq in sorted(deleted):  # both in order: one walk
        while position < len(leaves) and leaves[position][2] < seq:
            position += 1
        if position == len(leaves):
            break
        if leaves[position][1] <= seq:
            hit.add(leaves[position][0])
    if not hit:
        return True
    top = max(len(leaves) - 1, 1).bit_length()
    db.executemany(
        "UPDATE summary_segments SET summary = NULL WHERE session_id = ? AND level = 0 AND idx = ?",
        [(session_id, index) for index in sorted(hit)],
    )
    above = sorted({(level, index >> level) for index in hit for level in range(1, top + 1)})
    db.executemany(
        "DELETE FROM summary_segments WHERE session_id = ? AND level = ? AND idx = ?",
        [(session_id, level, index) for level, index in above],
    )
    return True


def drop(db: Db, session_id: str) -> int:
    """Delete every segment of the session (clear, erasure); how many there were."""
    return int(db.execute("DELETE FROM summary_segments WHERE session_id = ?", (session_id,)).rowcount)


def _now() -> str:
    return datetime.now(UTC).isoformat()


#: The table (both backends: the same SQL). ``summary`` is NULL for a leaf whose text a delete erased.
SEGMENTS_TABLE = (
    "CREATE TABLE summary_segments ("
    "  session_id text NOT NULL, level integer NOT NULL, idx integer NOT NULL,"
    "  first_seq bigint NOT NULL, through_seq bigint NOT NULL, generation bigint NOT NULL,"
    "  summary text, created_at text NOT NULL,"
    "  PRIMARY KEY (session_id, level, idx))"
)
