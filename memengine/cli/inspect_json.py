"""``memengine inspect --json``: what a store holds as one JSON document, every text whole.

The shapes are part of the command's interface: a session list is
``{"sessions": [{session_id, generation, episodes, summarized_through,
last_seq}, ...]}``; one session is its row's fields plus ``summary`` and the
raw ``episodes`` after it (``seq``, ``id``, ``role``, ``content``,
``created_at`` in ISO 8601, ``metadata``).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..episode import Episode
from ..store.base import SessionRow, SessionSnapshot


def sessions_document(sessions: list[SessionRow]) -> dict[str, Any]:
    return {"sessions": [attrs.asdict(row) for row in sessions]}


def session_document(row: SessionRow, snapshot: SessionSnapshot, limit: int | None) -> dict[str, Any]:
    episodes = snapshot.episodes[-limit:] if limit is not None else snapshot.episodes
    return {
        "session_id": row.session_id,
        "generation": row.generation,
        "stored_episodes": row.episodes,
        "last_seq": row.last_seq,
        "summarized_through": snapshot.summarized_through,
        "summary": snapshot.summary,
        "episodes": [_episode(episode) for episode in episodes],
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
