"""Full-text recall over the PostgreSQL journal (the ``simple`` configuration, ranked by ``ts_rank``).

PostgreSQL keeps its GIN index (``episodes_text``, see postgres/schema.py) in
the transaction that writes or deletes a row, so there is nothing to catch
up and no watermark that could go wrong: every committed episode is found,
and a deleted one never. A corrupted index would be a fault of the database
itself (storage, a bug); ``memengine reindex URL`` rebuilds it with
``REINDEX``, which blocks writes to the journal while it runs, so it is not
done behind the user's back.
"""

from __future__ import annotations

from collections.abc import Callable

from ...episode import Episode
from ...scope import Scope
from .. import unfinished
from ..base import Recalled
from ..dialect import Db
from ..recall_query import query_words
from .schema import RECALL_PREFIX_CHARS

# The index covers an episode's first RECALL_PREFIX_CHARS characters (a tsvector holds at most 1 MB):
# the search uses the same expression, so that the index serves it.
_PREFIX = str(RECALL_PREFIX_CHARS)

# Any word matches: an OR of one plain query per word (plain queries take user text
# without syntax). The words travel as one array parameter, however many there are.
_TSVECTOR = "to_tsvector('simple', left(e.content, " + _PREFIX + "))"
_SEARCH = (
    "SELECT e.session_id, e.seq, e.id, e.role, e.content, e.created_at, e.metadata, "
    "  ts_rank(" + _TSVECTOR + ", q.query) AS score "
    "FROM episodes AS e, ("
    "  SELECT string_agg('(' || word_query::text || ')', ' | ')::tsquery AS query "
    "  FROM unnest(%s::text[]) AS word, plainto_tsquery('simple', word) AS word_query "
    "  WHERE numnode(word_query) > 0) AS q "
    "WHERE " + _TSVECTOR + " @@ q.query AND {in_scope} AND " + unfinished.VISIBLE + " "
    "ORDER BY score DESC, e.session_id, e.seq LIMIT %s"
)


def search(
    db: Db,
    query: str,
    scope: Scope,
    limit: int,
    episode_from_row: Callable[[tuple], Episode],
) -> list[Recalled]:
    """Episodes of ``scope`` matching any of the query's words (see recall_query.py), best first. A read."""
    words = query_words(query)
    if not words:
        return []
    in_scope, scope_params = scope.condition("e.session_id")
    search = _SEARCH.format(in_scope=in_scope.replace("?", "%s"))
    rows = db.conn.execute(search, (words, *scope_params, limit)).fetchall()
    return [Recalled(row[0], episode_from_row(row[1:7]), float(row[7])) for row in rows]


def rebuild(db: Db) -> int:
    """Rebuild the text index from the journal (``REINDEX``); return how many episodes it holds."""
    db.execute("REINDEX INDEX episodes_text")
    (count,) = db.execute("SELECT count(*) FROM episodes").fetchone()
    return int(count)
