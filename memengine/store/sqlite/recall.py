"""Full-text recall over the SQLite journal (FTS5, ranked by bm25).

Indexing a row inside every small commit costs about ten times more than
indexing rows in batches, so the index (``episodes_fts``, an external-content
FTS5 table over ``episodes``) lags behind the journal up to a watermark,
``fts_state.indexed_through``: every live row at or below it is indexed, no
row above it is. A delete trigger removes an indexed row in the transaction
that deletes it and lowers the watermark (see sqlite/schema.py), so a deleted
or cleared episode is never found.

Writing and reading are separate steps:

- :func:`catch_up` (a write) indexes rows past the watermark, a bounded
  number per call, and moves the watermark to the last row it indexed;
- :func:`search` (a read) writes nothing;
- :func:`rebuild` (a write) drops the index and builds it again from the
  journal, with its watermark and trigger.

The watermark's promise has a consequence that costs two index lookups to
check: the highest rowid in the index is the highest journal rowid at or
below the watermark. :func:`catch_up` and :func:`search` check it, and with
it SQLite's own reports (a corrupt index, a missing table, a NULL bm25), and
raise :class:`~memengine.store.base.RecallIndexDamaged` rather than index
on top of damage or answer from it. Damage that leaves no such trace (rows
taken out of the middle of the index behind the engine's back) is repaired
by ``memengine reindex``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...episode import Episode
from ...scope import Scope
from .. import unfinished
from ..base import Recalled, RecallIndexDamaged
from ..dialect import Db
from ..recall_query import query_words
from .schema import RECALL_DELETE_TRIGGER, RECALL_INDEX, RECALL_WATERMARK

_WATERMARK = (
    "SELECT state.indexed_through, "
    "  (SELECT max(id) FROM episodes_fts_docsize), "
    "  (SELECT max(rowid) FROM episodes WHERE rowid <= state.indexed_through) "
    "FROM fts_state AS state WHERE state.id = 1"
)
_SEARCH = (
    "SELECT e.session_id, e.seq, e.id, e.role, e.content, e.created_at, e.metadata, bm25(episodes_fts) "
    "FROM episodes_fts JOIN episodes AS e ON e.rowid = episodes_fts.rowid "
    "WHERE episodes_fts MATCH ? AND {in_scope} AND " + unfinished.VISIBLE + " ORDER BY bm25(episodes_fts) LIMIT ?"
)


def catch_up(db: Db, limit: int) -> int:
    """Index at most ``limit`` journal rows past the watermark, oldest first; return how many still wait.

    A write. Raises :class:`RecallIndexDamaged`, having written nothing, if
    the index does not match its watermark.
    """
    with _reporting_damage():
        indexed_through = _checked_watermark(db)
        (through,) = db.execute(
            "SELECT max(rowid) FROM (SELECT rowid FROM episodes WHERE rowid > ? ORDER BY rowid LIMIT ?)",
            (indexed_through, limit),
        ).fetchone()
        if through is None:
            return 0
        db.execute(
            "INSERT INTO episodes_fts (rowid, content) "
            "SELECT rowid, content FROM episodes WHERE rowid > ? AND rowid <= ?",
            (indexed_through, through),
        )
        db.execute("UPDATE fts_state SET indexed_through = ? WHERE id = 1", (through,))
        (waiting,) = db.execute("SELECT count(*) FROM episodes WHERE rowid > ?", (through,)).fetchone()
    return int(waiting)


def search(
    db: Db,
    query: str,
    scope: Scope,
    limit: int,
    episode_from_row: Callable[[tuple], Episode],
) -> list[Recalled]:
    """Indexed episodes of ``scope`` matching any of the query's words (see recall_query.py), best (bm25) first.

    A read: writes nothing. Raises :class:`RecallIndexDamaged` if the index is damaged.
    """
    expression = match_expression(query)
    if expression is None:
        return []
    in_scope, scope_params = scope.condition("e.session_id")
    with _reporting_damage():
        _checked_watermark(db)
        rows = db.conn.execute(_SEARCH.format(in_scope=in_scope), (expression, *scope_params, limit)).fetchall()
    if any(row[7] is None for row in rows):
        raise RecallIndexDamaged("the recall index is damaged: bm25 has no score for a hit")
    return [Recalled(row[0], episode_from_row(row[1:7]), -float(row[7])) for row in rows]


def rebuild(db: Db) -> int:
    """Drop the index and build it again from the journal; return how many episodes it holds. A write.

    Also recreates the watermark and the delete trigger if they are gone.
    """
    _drop_index(db)
    db.execute(RECALL_INDEX)
    db.execute("INSERT INTO episodes_fts (episodes_fts) VALUES ('rebuild')")
    db.execute(RECALL_WATERMARK)
    db.execute(
        "INSERT OR REPLACE INTO fts_state (id, indexed_through) "
        "VALUES (1, coalesce((SELECT max(rowid) FROM episodes), 0))"
    )
    db.execute(RECALL_DELETE_TRIGGER)
    (count,) = db.execute("SELECT count(*) FROM episodes").fetchone()
    return int(count)


def rebuild_if_damaged(db: Db) -> bool:
    """Rebuild the index if it fails the watermark check or FTS5 cannot open it; True if it was rebuilt. A write."""
    try:
        with _reporting_damage():
            _checked_watermark(db)
            # Opening the index reads its configuration and structure, which a connection
            # keeps once it has them: damage there shows only to a new connection, as here.
            db.execute("SELECT rowid FROM episodes_fts WHERE episodes_fts MATCH 'memengine' LIMIT 1").fetchall()
    except RecallIndexDamaged:
        rebuild(db)
        return True
    return False


def match_expression(query: str) -> str | None:
    """An FTS5 query matching any of the query's words (each quoted: no syntax from users)."""
    words = query_words(query)
    if not words:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def _drop_index(db: Db) -> None:
    """Drop the index, even one whose shadow tables are too damaged for FTS5 to open (and so to drop) it."""
    try:
        db.execute("DROP TABLE IF EXISTS episodes_fts")
        return
    except sqlite3.Error:
        pass
    # Give it the shadow tables of a new, empty index, which FTS5 can open.
    db.execute(RECALL_INDEX.replace("TABLE episodes_fts ", "TABLE episodes_fts_blank "))
    for shadow in ("data", "idx", "docsize", "config"):
        (create,) = db.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (f"episodes_fts_blank_{shadow}",)
        ).fetchone()
        db.execute(f"DROP TABLE IF EXISTS episodes_fts_{shadow}")
        db.execute(create.replace("episodes_fts_blank_", "episodes_fts_", 1))
        db.execute(f"INSERT INTO episodes_fts_{shadow} SELECT * FROM episodes_fts_blank_{shadow}")
    db.execute("DROP TABLE episodes_fts_blank")
    db.execute("DROP TABLE episodes_fts")


def _checked_watermark(db: Db) -> int:
    """The watermark, once it is checked against the index (else :class:`RecallIndexDamaged`)."""
    state = db.execute(_WATERMARK).fetchone()
    if state is None:
        raise RecallIndexDamaged("the recall index is damaged: its watermark is missing")
    indexed_through, highest_indexed, highest_expected = state
    if highest_indexed != highest_expected:
        raise RecallIndexDamaged(
            f"the recall index is damaged: by its watermark ({indexed_through}) its highest row should be "
            f"{highest_expected or 'none'}, but it is {highest_indexed or 'none'}"
        )
    return int(indexed_through)


@contextmanager
def _reporting_damage() -> Iterator[None]:
    """Turn SQLite's reports of a damaged index into :class:`RecallIndexDamaged`; let other errors through."""
    try:
        yield
    except sqlite3.Error as exc:
        message = str(exc)
        corrupt = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_CORRUPT
        if corrupt or any(sign in message for sign in ("no such table", "fts5", "vtable constructor failed")):
            raise RecallIndexDamaged(f"the recall index is damaged: {message}") from exc
        raise
