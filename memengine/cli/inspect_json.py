"""``memengine inspect --json``: what a store holds as one JSON document, every text whole.

The shapes are part of the command's interface: a session list is
``{"sessions": [{session_id, generation, episode_count, summarized_through,
last_seq}, ...]}``; one session is the same fields plus ``summary`` and the
raw ``episodes`` after it (``seq``, ``id``, ``role``, ``content``,
``created_at`` in ISO 8601, ``metadata``). ``episode_count`` is always a
number (the episodes stored), ``episodes`` always a list of episodes. Both carry ``set_aside``: the work
set aside after too many failed rounds (of every session, or of that one),
each ``{kind ("summary" or "retain"), session_id, first_seq, last_seq,
attempts, error, set_aside_at}`` (``set_aside_at`` in ISO 8601).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs

from ..episode import Episode
from ..store.base import SessionRow, SessionSnapshot, SetAside


def sessions_document(sessions: list[SessionRow], set_aside: list[SetAside]) -> dict[str, Any]:
    return {"sessions": [_row(row) for row in sessions], "set_aside": set_aside_document(set_aside)}


def _row(row: SessionRow) -> dict[str, Any]:
    return {
        "session_id": row.session_id,
        "generation": row.generation,
        "episode_count": row.episodes,
        "summarized_through": row.summarized_through,
        "last_seq": row.last_seq,
    }


def set_aside_document(set_aside: list[SetAside]) -> list[dict[str, Any]]:
    return [
        {**attrs.asdict(work), "set_aside_at": datetime.fromtimestamp(work.set_aside_at, UTC).isoformat()}
        for work in set_aside
    ]


def session_document(
    row: SessionRow, snapshot: SessionSnapshot, limit: int | None, set_aside: list[SetAside]
) -> dict[str, Any]:
    episodes = snapshot.episodes[-limit:] if limit is not None else snapshot.episodes
    return {
        **_row(row),
        "summarized_through": snapshot.summarized_through,
        "summary": snapshot.summary,
        "episodes": [_episode(episode) for episode in episodes],
        "set_aside": set_aside_document(set_aside),
    }


def _episode(episode: Episode) -> dict[str, Any]:
    return {
        "seq": episode.seq,
        "id": episode.id,
        "role": episode.role,
        "content": episode.content,
        "created_at": episode.created_at.isoformat(),
        "metadata": episode.metadata,
    }
