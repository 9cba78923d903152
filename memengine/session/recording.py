"""Recording the messages a session handles: :class:`MessageRecorder`, and the record format.

An engine opened with ``record_to=PATH`` gives its sessions a recorder, which
appends one JSON line per message a session handles, when it is answered::

    {"session": "alice/chat-1", "type": "add",
     "payload": {"episodes": [{"id": ..., "role": ..., "content": ..., "created_at": ..., "metadata": {}}]},
     "outcome": {"seqs": [1]}}

Types are ``add``, ``read``, ``delete``, ``clear``, ``forget`` and ``close``;
a message that failed has ``"error"`` instead of ``"outcome"``. A read's
outcome is the context's ``evicted_through``, ``summarized_through`` and the
seqs of its raw episodes. Each engine that opens the log first writes what
shapes the outcomes: its :class:`SessionConfig` (every field but the
tokenizer, which is noted as ``"custom"`` when there is one) and its
summarizer's class::

    {"type": "engine", "config": {"max_episodes": 5, ...}, "tokenizer": null,
     "summarizer": "memengine.summarizer.extractive.ExtractiveSummarizer"}

This module writes the log and knows its shape; :mod:`memengine.replay`
reads it back and drives an engine with it (replay depends on the engine and
on this module, never the reverse).

Recording writes and flushes a line per message on the event loop: a tool for
tests and debugging, not for production throughput.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from typing import Any, TextIO

import attrs

from ..config import SessionConfig
from ..context import Context
from ..episode import Episode
from .messages import (
    AddEpisodes,
    ClearSession,
    ClientMessage,
    CloseSession,
    DeleteEpisodes,
    ForgetSession,
    ReadContext,
)

log = logging.getLogger("memengine.replay")


class MessageRecorder:
    """Appends handled messages to a JSON-lines file (the format is described in this module's docstring).

    Recording is a tool for tests and debugging: a write that fails (a full
    disk) is logged once and recording stops; the engine goes on unharmed.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, config: SessionConfig | None = None, summarizer: object = None
    ) -> None:
        self._path = os.fspath(path)
        self._file: TextIO = open(path, "a", encoding="utf-8")
        self._broken = False
        self._write(_engine_json(config or SessionConfig(), summarizer))

    def record(self, session_id: str, message: ClientMessage, value: Any, error: BaseException | None) -> None:
        if self._broken:
            return
        kind, payload, outcome = _describe(message, value)
        line: dict[str, Any] = {"session": session_id, "type": kind, "payload": payload}
        if error is None:
            line["outcome"] = outcome
        else:
            line["error"] = {"type": type(error).__name__, "message": str(error)}
        self._write(line)

    def _write(self, line: dict[str, Any]) -> None:
        if self._broken:
            return
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
            return "add", {"episodes": [episode_json(e) for e in message.episodes]}, {"seqs": seqs}
        case ReadContext():
            outcome = {} if value is None else context_json(value)
            return "read", {"wait_for_summary": message.wait_for_summary}, outcome
        case DeleteEpisodes():
            return "delete", {"seqs": list(message.seqs)}, {"deleted": value}
        case ClearSession():
            return "clear", {}, {}
        case ForgetSession():
            return "forget", {}, {}
        case CloseSession():
            return "close", {}, {}
    raise TypeError(f"cannot record {type(message).__name__}")


def episode_json(episode: Episode) -> dict[str, Any]:
    return {
        "id": episode.id,
        "role": episode.role,
        "content": episode.content,
        "created_at": episode.created_at.isoformat(),
        "metadata": episode.metadata,
    }


def context_json(context: Context) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "summarized_through": context.summarized_through,
        "evicted_through": context.evicted_through,
        "seqs": [e.seq for e in context.episodes],
    }
    if context.omitted is not None:  # left out for the token ceiling (timing-dependent, like summarized_through)
        outcome["omitted"] = [context.omitted.first_seq, context.omitted.last_seq]
    return outcome


def _engine_json(config: SessionConfig, summarizer: object) -> dict[str, Any]:
    fields = attrs.asdict(config, filter=lambda field, _: field.name != "tokenizer")
    kind = type(summarizer) if summarizer is not None else None
    return {
        "type": "engine",
        "config": fields,
        "tokenizer": None if config.tokenizer is None else "custom",
        "summarizer": None if kind is None else f"{kind.__module__}.{kind.__qualname__}",
    }


def episode_from_json(data: dict[str, Any]) -> Episode:
    """The episode a record's ``episode_json`` describes."""
    return Episode(
        data["role"],
        data["content"],
        id=data["id"],
        created_at=datetime.fromisoformat(data["created_at"]),
        metadata=data.get("metadata", {}),
    )
