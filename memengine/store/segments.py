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
tile the leaves, oldest first, joined by :data:`PART_SEPARATOR` (one part per
set bit of the leaf count once every fold is made; while a backlog of evicted
episodes goes first, at most ``bit_length(leaves) + 2`` parts before folds go
ahead of it). It is stored in ``summaries`` as the session's summary through
the last leaf (an empty text if every leaf's episodes were deleted), so
whatever reads a session's summary reads it as before. Only that newest
summary is kept.

A delete of seq ``s`` erases, in its own transaction, the text of the leaf that
holds ``s`` (the row stays, its summary NULL: a *hole*, to be summarized
again) and deletes every node above it; the composed summary is made again at
once, showing the hole's live episodes in its place as they were said
(:data:`HOLE_OPENS`; beyond :data:`HOLE_SHOWN_CHARS` characters the rest is
said left out): nothing leaves the view while it is summarized again. A read
reports the hole's range as ``Context.resummarizing``. The summarizer child
then makes that leaf again (one call) and the folds above it (one per
level): about ``log2(leaves)`` calls, however old the deleted episode. The
work, in the order the session dispatches it: a hole; new episodes evicted
from the window (a new leaf); a fold (two sibling nodes of the composed
summary whose parent is missing).

Only a session summarized from its start is segmented: one with a rolling
summary stays rolling (a delete there falls back on its older summaries,
journal.py). Once segmented, a session stays so until it is cleared.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from datetime import UTC, datetime

from ..attachments import for_summarizer
from . import leases
from .base import Composed, SegmentRepair, SegmentState
from .dialect import Db
from .rows import EPISODE_COLUMNS, episode_from_row

#: Between the texts of the nodes a composed summary is made of.
PART_SEPARATOR = "\n\n"
#: Opens the episodes of leaves being summarized again after a delete, shown in their place as they were said.
HOLE_OPENS = (
    "[memengine: episodes {first}..{last} are being summarized again after a delete; until then, here they "
    "are as they were said:]"
)
#: Closes them.
HOLE_CLOSES = "[memengine: end of episodes {first}..{last}]"
#: Said where the episodes of a hole go past :data:`HOLE_SHOWN_CHARS`.
HOLE_LEFT_OUT = (
    "[memengine: episodes {first}..{last} ({count}, {chars} characters) are left out here: too long to show "
    "before their summary is made]"
)
#: Characters of holes' episodes a composed summary shows, all its holes together (the rest is said, not shown).
HOLE_SHOWN_CHARS = 16_000
#: What a read over its token ceiling shows in place of a hole's episodes (see :func:`compact`).
HOLE_COMPACT = (
    "[memengine: episodes {first}..{last} are being summarized again after a delete; left out here, to stay "
    "within the token ceiling]"
)
_HOLE_BLOCK = re.compile(
    re.escape(HOLE_OPENS).replace(r"\{first\}", r"(?P<first>\d+)").replace(r"\{last\}", r"(?P<last>\d+)")
    + r".*?"
    + re.escape(HOLE_CLOSES).replace(r"\{first\}", r"(?P=first)").replace(r"\{last\}", r"(?P=last)"),
    re.DOTALL,
)


#: Parts a composed summary may have beyond its folded shape before folds go ahead of new leaves.
_SPARE_PARTS = 2

_Node = tuple[int, int, bool]  # first_seq, through_seq, stale (a leaf whose text a delete erased)


def _tiled(db: Db, session_id: str) -> tuple[dict[tuple[int, int], _Node], list[tuple[int, int]], int] | None:
    """The largest whole nodes that tile the leaves, oldest first (a stale leaf stands for itself); None if none.

    Returns those nodes' rows, the nodes in order, and the number of leaves.
    Read from the top down, never every row: the roots a full binary counter
    of that many leaves has, and, for each of them that is missing (not
    folded yet, or above a hole), its children in its place, and so on: a few
    point reads per level, however long the session.
    """
    last = _last_leaf(db, session_id)
    if last is None:
        return None
    leaves = last + 1
    wanted: list[tuple[int, int]] = []
    position = 0
    for level in reversed(range(leaves.bit_length())):
        if leaves >> level & 1:
            wanted.append((level, position >> level))
            position += 1 << level
    nodes: dict[tuple[int, int], _Node] = {}
    while True:
        unread = [node for node in wanted if node not in nodes]
        if not unread:
            return nodes, wanted, leaves
        nodes.update(_read(db, session_id, unread))
        parts: list[tuple[int, int]] = []
        for level, index in wanted:
            if (level, index) in nodes:
                parts.append((level, index))
            elif level > 0:  # not folded yet, or above a hole: its children stand in its place
                parts.extend([(level - 1, 2 * index), (level - 1, 2 * index + 1)])
        wanted = parts


def _last_leaf(db: Db, session_id: str) -> int | None:
    """The index of the session's newest leaf; None if it has none (it is not segmented)."""
    (last,) = db.execute(
        "SELECT max(idx) FROM summary_segments WHERE session_id = ? AND level = 0", (session_id,)
    ).fetchone()
    return last  # type: ignore[no-any-return]


def _read(db: Db, session_id: str, wanted: Sequence[tuple[int, int]]) -> dict[tuple[int, int], _Node]:
    rows = _points(db, "level, idx, first_seq, through_seq, summary IS NULL", session_id, wanted)
    return {(level, index): (first, through, bool(stale)) for level, index, first, through, stale in rows}


def _points(db: Db, columns: str, session_id: str, nodes: Sequence[tuple[int, int]]) -> list[tuple]:
    """``columns`` of the given nodes' rows: a point read of the primary key each.

    One statement per hundred, as a UNION ALL of point reads: written as one
    condition with ORs, SQLite's planner may choose the index on first_seq
    and read every row of the session instead.
    """
    rows: list[tuple] = []
    for start in range(0, len(nodes), 100):
        chunk = nodes[start : start + 100]
        point = f"SELECT {columns} FROM summary_segments WHERE session_id = ? AND level = ? AND idx = ?"
        rows.extend(
            db.execute(
                " UNION ALL ".join([point] * len(chunk)),
                tuple(value for level, index in chunk for value in (session_id, level, index)),
            ).fetchall()
        )
    return rows


def _state(nodes: dict[tuple[int, int], _Node], parts: list[tuple[int, int]], leaves: int) -> SegmentState:
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
    tiled = _tiled(db, session_id)
    return None if tiled is None else _state(*tiled)


def compose(db: Db, session_id: str, generation: int) -> Composed | None:
    """Make the composed summary again and store it as the session's summary; None if it is not segmented.

    A hole's live episodes are shown in its place, as they were said (up to
    :data:`HOLE_SHOWN_CHARS`; the rest is said left out): nothing leaves the
    view while it is summarized again. An empty summary (every leaf's episodes
    deleted) is stored as an empty text, so that the session still reads as
    summarized through its last leaf.
    """
    tiled = _tiled(db, session_id)
    if tiled is None:
        return None
    nodes, parts, _ = tiled
    state = _state(*tiled)
    texts = _texts(db, session_id, [part for part in parts if not nodes[part][2]])
    pieces: list[str] = []
    holes = iter(state.holes)
    budget = [HOLE_SHOWN_CHARS]
    in_hole = False
    for part in parts:
        if not nodes[part][2]:  # (not stale)
            in_hole = False
            if texts[part]:
                pieces.append(texts[part])
        elif not in_hole:  # neighbouring stale leaves read as one hole
            in_hole = True
            shown = _hole(db, session_id, *next(holes), budget)
            if shown:
                pieces.append(shown)
    text = PART_SEPARATOR.join(pieces)
    through_seq = nodes[parts[-1]][1]
    # Only the newest summary is kept: a delete goes through the segments, not back to an older summary.
    db.execute("DELETE FROM summaries WHERE session_id = ? AND through_seq <> ?", (session_id, through_seq))
    db.execute(
        "INSERT INTO summaries (session_id, through_seq, generation, summary, created_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (session_id, through_seq) DO UPDATE SET "
        "generation = excluded.generation, summary = excluded.summary, created_at = excluded.created_at",
        (session_id, through_seq, generation, text, _now()),
    )
    return Composed(through_seq, text or None, state)


def _hole(db: Db, session_id: str, first_seq: int, last_seq: int, budget: list[int]) -> str:
    """A hole's live episodes as the composed summary shows them ("" if none is left).

    They take what is left of ``budget`` (characters, shared by every hole of
    the summary); past it the rest are said left out, with their count and
    size read by the database, not fetched.
    """
    cursor = db.execute(
        f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (session_id, first_seq, last_seq),
    )
    lines = [HOLE_OPENS.format(first=first_seq, last=last_seq)]
    rest_from: int | None = None
    while rest_from is None:
        row = cursor.fetchone()
        if row is None:
            break
        # As the summarizer reads it: an image's base64 as a placeholder ("[image/png, 150 KB]").
        (episode,) = for_summarizer([episode_from_row(row)])
        line = f"{episode.role}: {episode.content}"
        if len(line) > budget[0]:
            rest_from = row[0]
            break
        lines.append(line)
        budget[0] -= len(line)
    cursor.close()
    if rest_from is None and len(lines) == 1:
        return ""  # every episode of the hole was deleted
    if rest_from is not None:
        count, chars = db.execute(
            "SELECT count(*), coalesce(sum(length(content)), 0) FROM episodes "
            "WHERE session_id = ? AND seq BETWEEN ? AND ?",
            (session_id, rest_from, last_seq),
        ).fetchone()
        lines.append(HOLE_LEFT_OUT.format(first=rest_from, last=last_seq, count=count, chars=chars))
        budget[0] = 0  # later holes show nothing either: the summary keeps its order
    lines.append(HOLE_CLOSES.format(first=first_seq, last=last_seq))
    return "\n".join(lines)


def compact(summary: str) -> str:
    """``summary`` with each hole's episodes replaced by one line saying they are left out (for the ceiling)."""
    return _HOLE_BLOCK.sub(lambda found: HOLE_COMPACT.format(first=found["first"], last=found["last"]), summary)


def _texts(db: Db, session_id: str, parts: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
    return {(level, index): summary for level, index, summary in _points(db, "level, idx, summary", session_id, parts)}


def _generation_is(db: Db, session_id: str, generation: int) -> bool:
    row = db.execute("SELECT generation FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
    return (row[0] if row is not None else 0) == generation


def store_leaf(db: Db, session_id: str, token: int, generation: int, through_seq: int, summary: str) -> Composed | None:
    """Store a new leaf, the summary of the evicted episodes up to ``through_seq``; None if refused.

    Refused (nothing written) when ``generation`` is no longer the session's,
    or ``through_seq`` is not past the last leaf, or the session has a
    rolling summary (it stays rolling: only a session summarized from its
    start is segmented).
    """
    leases.require(db, session_id, token)
    if not _generation_is(db, session_id, generation):
        return None
    last = db.execute(
        "SELECT idx, through_seq FROM summary_segments WHERE session_id = ? AND level = 0 ORDER BY idx DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    if last is None and db.execute("SELECT 1 FROM summaries WHERE session_id = ? LIMIT 1", (session_id,)).fetchone():
        return None
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
    tiled = _tiled(db, session_id)
    if tiled is None:
        return None
    nodes, parts, _ = tiled
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
    return Composed(nodes[parts[-1]][1], (row[0] if row is not None else None) or None, _state(*tiled))


def invalidate(db: Db, session_id: str, deleted: Sequence[int]) -> bool:
    """After a delete of the seqs ``deleted``: erase the leaves holding any of them and every node above.

    Returns whether the session is segmented (then the caller composes its
    summary again rather than dropping summaries back to before the delete).
    Reads only the leaves from the one holding the first deleted seq to the
    one holding the last.
    """
    last = _last_leaf(db, session_id)
    if last is None:
        return False
    ordered = sorted(deleted)
    start = db.execute(
        "SELECT first_seq FROM summary_segments WHERE session_id = ? AND level = 0 AND first_seq <= ? "
        "ORDER BY first_seq DESC LIMIT 1",
        (session_id, ordered[0]),
    ).fetchone()
    leaves = db.execute(
        "SELECT idx, first_seq, through_seq FROM summary_segments "
        "WHERE session_id = ? AND level = 0 AND first_seq BETWEEN ? AND ? ORDER BY first_seq",
        (session_id, start[0] if start is not None else ordered[0], ordered[-1]),
    ).fetchall()
    hit: set[int] = set()
    position = 0
    for seq in ordered:  # both in order: one walk
        while position < len(leaves) and leaves[position][2] < seq:
            position += 1
        if position == len(leaves):
            break
        if leaves[position][1] <= seq:
            hit.add(leaves[position][0])
    if not hit:
        return True
    top = max(last, 1).bit_length()
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


#: The table and its indexes (both backends: the same SQL). ``summary`` is NULL for a leaf whose text a
#: delete erased (a hole); the holes have an index of their own, so that finding them never reads every leaf.
SEGMENTS_SCHEMA = (
    "CREATE TABLE summary_segments ("
    "  session_id text NOT NULL, level integer NOT NULL, idx integer NOT NULL,"
    "  first_seq bigint NOT NULL, through_seq bigint NOT NULL, generation bigint NOT NULL,"
    "  summary text, created_at text NOT NULL,"
    "  PRIMARY KEY (session_id, level, idx))",
    "CREATE INDEX summary_segments_by_first_seq ON summary_segments (session_id, level, first_seq)",
    "CREATE INDEX summary_segments_holes ON summary_segments (session_id, idx) WHERE level = 0 AND summary IS NULL",
)
