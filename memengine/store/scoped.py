"""Reads over the sessions of a scope (one tenant's, a prefix's): listing, counting, exporting.

Every function is a read (the store runs it on its read connection) and
takes a bounded page, so that a tenant with a million episodes is listed,
exported or counted without holding them in memory. A session is in the
store once it has a row in ``sessions`` (it stored something, or was
cleared) or in ``session_leases`` (it was activated).
"""

from __future__ import annotations

from ..episode import Episode
from ..scope import Scope
from . import unfinished
from .base import ExportedSession, ScopeCounts
from .dialect import Db
from .rows import EPISODE_COLUMNS, episode_from_row


def session_ids(db: Db, scope: Scope, after: str | None, limit: int) -> list[str]:
    """The ids of the scope's sessions after ``after`` (in the store's order of ids), at most ``limit``."""
    later, after_params = ("", ()) if after is None else (" AND s.session_id > ?", (after,))
    branches: list[str] = []
    params: list[str] = []
    for table in ("sessions", "session_leases"):
        condition, scope_params = _in_scope(db, scope)
        branches.append(f"SELECT s.session_id FROM {table} AS s WHERE {condition}{later}")
        params.extend((*scope_params, *after_params))
    rows = db.execute(
        f"SELECT session_id FROM ({' UNION '.join(branches)}) AS u ORDER BY session_id LIMIT ?", (*params, limit)
    ).fetchall()
    return [row[0] for row in rows]


def counts(db: Db, scope: Scope) -> ScopeCounts:
    """How many sessions, episodes, summaries and undelivered retain batches the scope holds."""

    def count(table: str) -> int:
        condition, params = _in_scope(db, scope)
        (found,) = db.execute(f"SELECT count(*) FROM {table} AS s WHERE {condition}", params).fetchone()
        return int(found)

    sessions_condition, params = _in_scope(db, scope)
    (sessions,) = db.execute(
        "SELECT count(*) FROM (SELECT s.session_id FROM sessions AS s WHERE "
        f"{sessions_condition} UNION SELECT s.session_id FROM session_leases AS s WHERE {sessions_condition}) AS u",
        (*params, *params),
    ).fetchone()
    return ScopeCounts(
        sessions=int(sessions),
        episodes=count("episodes"),
        summaries=count("summaries"),
        outbox_batches=count("retain_outbox"),
    )


def _in_scope(db: Db, scope: Scope) -> tuple[str, tuple[str, ...]]:
    """The scope's condition on ``s.session_id``; on SQLite with a range its index can use.

    SQLite compares ids byte by byte (BINARY): every id that starts with the
    prefix lies in ``[prefix, prefix with its last character raised)``.
    PostgreSQL's order depends on the collation, so there only the exact
    comparison is made.
    """
    condition, params = scope.condition("s.session_id")
    if db.dialect.name != "sqlite" or scope.prefix is None:
        return condition, params
    upper = _next_prefix(scope.prefix)
    if upper is None:
        return f"s.session_id >= ? AND {condition}", (scope.prefix, *params)
    return f"s.session_id >= ? AND s.session_id < ? AND {condition}", (scope.prefix, upper, *params)


def _next_prefix(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (code point order), if any."""
    last = ord(prefix[-1])
    if last == 0x10FFFF:
        return None
    following = last + 1 if last + 1 != 0xD800 else 0xE000  # surrogates are not text
    return prefix[:-1] + chr(following)


def exported_session(db: Db, session_id: str) -> ExportedSession:
    """The session's line of an export: its latest summary and how far its seqs went."""
    latest = db.execute(
        "SELECT through_seq, summary, created_at FROM summaries WHERE session_id = ? ORDER BY through_seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    (episodes,) = db.execute("SELECT count(*) FROM episodes WHERE session_id = ?", (session_id,)).fetchone()
    through, summary, created_at = latest if latest is not None else (0, None, None)
    return ExportedSession(session_id, summary or None, int(through), created_at, int(episodes))


def episodes_after(db: Db, session_id: str, after_seq: int, limit: int) -> list[Episode]:
    """The session's stored episodes after ``after_seq``, in order, at most ``limit`` (not an add in progress)."""
    rows = db.execute(
        f"SELECT {', '.join('e.' + column for column in EPISODE_COLUMNS.split(', '))} FROM episodes AS e "
        f"WHERE e.session_id = ? AND e.seq > ? AND {unfinished.VISIBLE} ORDER BY e.seq LIMIT ?",
        (session_id, after_seq, limit),
    ).fetchall()
    return [episode_from_row(row) for row in rows]
