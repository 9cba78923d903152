"""Full-text recall over the SQLite journal (FTS5, ranked by bm25).

Indexing a row inside every small commit costs about ten times more than
indexing rows in batches, so new rows are indexed in bounded catch-up steps
that ride along with a group commit every couple of thousand appends, and
always in full at the start of a recall's own transaction, so every stored
episode is searchable. A delete trigger removes a row from the index in
the same transaction that deletes it (see schema.py): a deleted or cleared
episode is never found.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..episode import Episode
from .base import Recalled
from .dialect import Db

_TERM = re.compile(r"\w+", re.UNICODE)


def index_pending(db: Db, limit: int | None = None) -> int:
    """Index journal rows past the watermark (at most ``limit``); return how many."""
    (indexed_through,) = db.execute("SELECT indexed_through FROM fts_state WHERE id = 1").fetchone()
    bound = "" if limit is None else f" ORDER BY rowid LIMIT {int(limit)}"
    cursor = db.execute(
        f"INSERT INTO episodes_fts (rowid, content) SELECT rowid, content FROM episodes WHERE rowid > ?{bound}",
        (indexed_through,),
    )
    if cursor.rowcount:
        db.execute(
            "UPDATE fts_state SET indexed_through = (SELECT max(rowid) FROM episodes_fts) WHERE id = 1",
        )
    return cursor.rowcount


def match_expression(query: str) -> str | None:
    """An FTS5 query matching any word of ``query`` (each quoted: no syntax from users)."""
    terms = dict.fromkeys(term.lower() for term in _TERM.findall(query))
    if not terms:
        return None
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def recall(
    db: Db,
    query: str,
    session_id: str | None,
    limit: int,
    episode_from_row: Callable[[tuple], Episode],
) -> list[Recalled]:
    """Episodes matching any word of ``query``, best (bm25) first."""
    index_pending(db)
    expression = match_expression(query)
    if expression is None:
        return []
    where = "episodes_fts MATCH ?"
    params: list[object] = [expression]
    if session_id is not None:
        where += " AND e.session_id = ?"
        params.append(session_id)
    params.append(limit)
    rows = db.execute(
        "SELECT e.session_id, e.seq, e.id, e.role, e.content, e.created_at, e.metadata, bm25(episodes_fts) "
        "FROM episodes_fts JOIN episodes AS e ON e.rowid = episodes_fts.rowid "
        f"WHERE {where} ORDER BY bm25(episodes_fts) LIMIT ?",
        params,
    )
    return [Recalled(row[0], episode_from_row(row[1:7]), -row[7]) for row in rows]
