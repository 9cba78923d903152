"""Exporting the sessions of a scope as JSON lines, a page at a time (``Engine.export``, ``memengine export``).

The export is a stream of records, one per line: for each session (in the
store's order of ids) one ``"session"`` record (its latest summary and how
many episodes it holds), then one ``"episode"`` record per stored episode in
seq order. Sessions are listed and episodes read a page at a time, each page
its own read, so a tenant of any size is exported in bounded memory. The
pages are not one snapshot: a session written while it is exported shows
what was stored when each page was read (an add in progress never shows).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from ..episode import Episode
from ..scope import Scope
from ..store.base import ExportedSession, Store

#: Session ids listed per read.
SESSIONS_PER_PAGE = 100
#: Episodes read per read.
EPISODES_PER_PAGE = 500

Record = dict[str, Any]


class ExportStream:
    """The records of an export, as an async iterator (``async for record in engine.export(tenant=...)``).

    Every step that reads the store is a checkpoint; if cancelled, nothing
    changes and the stream may be iterated further.
    """

    def __init__(self, store: Store, scope: Scope, check_caller: Callable[[], None] | None = None) -> None:
        self._store = store
        self._check_caller = check_caller  # the engine's: refuses a step from another event loop
        self._scope = scope
        self._listed_after: str | None = None
        self._listing_done = False
        self._sessions: deque[str] = deque()
        self._session: str | None = None
        self._after_seq = 0
        self._ready: deque[Record] = deque()

    def __aiter__(self) -> ExportStream:
        return self

    async def __anext__(self) -> Record:
        if self._check_caller is not None:
            self._check_caller()
        while not self._ready:
            if self._session is not None:
                episodes = await self._store.episodes_after(self._session, self._after_seq, EPISODES_PER_PAGE)
                if episodes:
                    self._after_seq = episodes[-1].seq  # type: ignore[assignment]
                    self._ready.extend(episode_record(self._session, episode) for episode in episodes)
                    continue
                self._session = None
            if not self._sessions and not await self._list_more():
                raise StopAsyncIteration
            session_id = self._sessions.popleft()
            self._ready.append(session_record(await self._store.exported_session(session_id)))
            self._session, self._after_seq = session_id, 0
        return self._ready.popleft()

    async def _list_more(self) -> bool:
        if self._listing_done:
            return False
        page = await self._store.scope_session_ids(self._scope, self._listed_after, SESSIONS_PER_PAGE)
        if not page:
            self._listing_done = True
            return False
        self._listed_after = page[-1]
        self._sessions.extend(page)
        return True


def session_record(session: ExportedSession) -> Record:
    return {
        "type": "session",
        "session_id": session.session_id,
        "episodes": session.episodes,
        "summary": session.summary,
        "summarized_through": session.summarized_through,
        "summary_created_at": session.summary_created_at,
    }


def episode_record(session_id: str, episode: Episode) -> Record:
    return {
        "type": "episode",
        "session_id": session_id,
        "seq": episode.seq,
        "id": episode.id,
        "role": episode.role,
        "content": episode.content,
        "metadata": episode.metadata,
        "created_at": episode.created_at.isoformat(),
    }


async def write_json_lines(records: ExportStream, out: TextIO) -> tuple[int, int]:
    """Write every record as one line of JSON to ``out``; return how many sessions and episodes were written."""
    sessions = episodes = 0
    async for record in records:
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        if record["type"] == "session":
            sessions += 1
        else:
            episodes += 1
    return sessions, episodes
