"""Message recording and replay.

An engine opened with ``record_to=PATH`` appends one JSON line per message a
session handles, when it is answered::

    {"session": "alice/chat-1", "type": "add",
     "payload": {"episodes": [{"id": ..., "role": ..., "content": ..., "created_at": ..., "metadata": {}}]},
     "outcome": {"seqs": [1]}}

Types are ``add``, ``read``, ``delete``, ``clear`` and ``close``; a message that
failed has ``"error"`` instead of ``"outcome"``. :func:`replay` feeds such a log
into an engine on a fresh store. It reproduces the same episodes and seqs, and
the same summaries whenever the summarizer's result does not depend on how
evictions were batched into calls. Tests can be written as logs.

Recording writes and flushes a line per message on the event loop: a tool for
tests and debugging, not for production throughput.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

import attrs

from .context import Context
from .episode import Episode
from .session.messages import AddEpisodes, ClearSession, ClientMessage, CloseSession, DeleteEpisodes, ReadContext

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("memengine.replay")


class MessageRecorder:
    """Appends handled messages to a JSON-lines file.

    Recording is a tool for tests and debugging: a write that fails (a full
    disk) is logged once and recording stops; the engine goes on unharmed.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._file: TextIO = open(path, "a", encoding="utf-8")
        self._broken = False

    def record(self, session_id: str, message: ClientMessage, value: Any, error: BaseException | None) -> None:
        if self._broken:
            return
        kind, payload, outcome = _describe(message, value)
        line: dict[str, Any] = {"session": session_id, "type": kind, "payload": payload}
        if error is None:
            line["outcome"] = outcome
        else:
            line["error"] = {"type": type(error).__name__, "message": str(error)}
        try:
            self._file.write(json.dumps(line, ensure_ascii=False) + "\n")
            self._file.flush()
        except (OSError, ValueError) as exc:
            self._broken = True
            log.error("recording messages to %s failed (%s); recording stops, the engine goes on", self._path, exc)

    def close(self) -> None:
        self._file.close()


def _describe(message: ClientMessage, value: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    match message:
        case AddEpisodes():
            seqs = [episode.seq for episode in value] if value is not None else None
            return "add", {"episodes": [_episode_json(e) for e in message.episodes]}, {"seqs": seqs}
        case ReadContext():
            outcome = {} if value is None else _context_json(value)
            return "read", {"wait_for_summary": message.wait_for_summary}, outcome
        case DeleteEpisodes():
            return "delete", {"seqs": list(message.seqs)}, {"deleted": value}
        case ClearSession():
            return "clear", {}, {}
        case CloseSession():
            return "close", {}, {}
    raise TypeError(f"cannot record {type(message).__name__}")


def _episode_json(episode: Episode) -> dict[str, Any]:
    return {
        "id": episode.id,
        "role": episode.role,
        "content": episode.content,
        "created_at": episode.created_at.isoformat(),
        "metadata": episode.metadata,
    }


def _context_json(context: Context) -> dict[str, Any]:
    return {"summarized_through": context.summarized_through, "seqs": [e.seq for e in context.episodes]}


@attrs.frozen
class ReplayReport:
    """What a replay did: messages replayed, and where outcomes differed from the log."""

    messages: int
    sessions: tuple[str, ...]
    mismatches: tuple[str, ...]


def read_log(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as log:
        for number, line in enumerate(log, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{os.fspath(path)}:{number}: not a JSON line: {exc}") from None
            if not isinstance(record, dict) or "session" not in record or "type" not in record:
                raise ValueError(f"{os.fspath(path)}:{number}: a record needs 'session' and 'type'")
            yield record


async def replay(path: str | os.PathLike[str], engine: Engine) -> ReplayReport:
    """Send every message of the log at ``path`` to ``engine``, in order.

    Messages that failed when recorded are sent again (they fail again or not);
    reads that waited for a summary wait again, so replay passes the same
    synchronisation points. Differences between recorded and replayed outcomes
    (seqs of an add, count of a delete) are reported, not raised.
    """
    mismatches: list[str] = []
    sessions: dict[str, None] = {}
    count = 0
    for count, record in enumerate(read_log(path), 1):
        session_id = record["session"]
        sessions[session_id] = None
        session = engine.session(session_id)
        payload = record.get("payload", {})
        expected = record.get("outcome")
        kind = record["type"]
        try:
            if kind == "add":
                stored = await session.add([_episode_from_json(e) for e in payload["episodes"]])
                actual: Any = {"seqs": [e.seq for e in stored]}
            elif kind == "read":
                actual = _context_json(await session.context(wait_for_summary=payload.get("wait_for_summary", False)))
                expected = None  # a read changes nothing; its timing may differ
            elif kind == "delete":
                actual = {"deleted": await session.delete_episodes(payload["seqs"])}
            elif kind == "clear":
                await session.clear()
                actual = {}
            elif kind == "close":
                await session.close()
                actual = {}
            else:
                raise ValueError(f"message {count}: unknown type {kind!r}")
        except (ValueError, TypeError) as exc:
            if "error" not in record:
                mismatches.append(f"message {count} ({kind} on {session_id!r}) failed on replay: {exc}")
            continue
        if expected is not None and actual != expected:
            mismatches.append(f"message {count} ({kind} on {session_id!r}): recorded {expected}, replayed {actual}")
    return ReplayReport(count, tuple(sessions), tuple(mismatches))


def _episode_from_json(data: dict[str, Any]) -> Episode:
    return Episode(
        data["role"],
        data["content"],
        id=data["id"],
        created_at=datetime.fromisoformat(data["created_at"]),
        metadata=data.get("metadata", {}),
    )
