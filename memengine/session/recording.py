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

Erasure reaches the log. Before a delete, clear or forget is answered (and
recorded), :meth:`MessageRecorder.erase` rewrites the log (a new file put in
its place): in the session's earlier records, each erased episode's content
is masked, character for character (a letter becomes ``x``, a digit ``0``,
any other visible character ``.``; whitespace stays), so the log replays to
the same seqs and windows (character budgets count the same; the offline
token estimate nearly so), its metadata becomes ``{}`` and its record gets
``"erased": [seqs]``; and every error text of the session's records (which
may quote its episodes) is replaced. A clear or forget masks every episode
of the session recorded so far. Erasures asked for during a rewrite share the
next one; lines recorded meanwhile are held and written after it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Collection
from datetime import datetime
from typing import Any, TextIO

import anyio
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
        # Lines recorded while a rewrite runs (None when none does); guarded by _lock with the file.
        self._held: list[str] | None = None
        self._lock = threading.Lock()
        self._erasures: list[tuple[str, frozenset[int] | None, anyio.Event]] = []
        self._rewriting = False
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
        text = json.dumps(line, ensure_ascii=False) + "\n"
        with self._lock:
            if self._held is not None:
                self._held.append(text)
                return
            try:
                self._file.write(text)
                self._file.flush()
            except (OSError, ValueError) as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self._broken = True
        log.error("recording messages to %s failed (%s); recording stops, the engine goes on", self._path, exc)

    async def erase(self, session_id: str, seqs: Collection[int] | None) -> None:
        """Erase the session's episodes ``seqs`` (``None``: all of them) from the log recorded so far.

        See the module docstring. The rewrite runs in a worker thread; erasures
        asked for meanwhile share the next one. Returns once a rewrite that
        started after the call has ended. If cancelled, the rewrite still runs
        to its end. A rewrite that fails stops recording, as a failed write does
        (the log is left as it was).
        """
        if self._broken:
            return
        done = anyio.Event()
        self._erasures.append((session_id, None if seqs is None else frozenset(seqs), done))
        if not self._rewriting:
            self._rewriting = True
            with anyio.CancelScope(shield=True):
                try:
                    while self._erasures:
                        erasures, self._erasures = self._erasures, []
                        await anyio.to_thread.run_sync(self._rewrite, [(s, q) for s, q, _ in erasures])
                        for _, _, finished in erasures:
                            finished.set()
                finally:
                    self._rewriting = False
        await done.wait()

    def _rewrite(self, erasures: list[tuple[str, frozenset[int] | None]]) -> None:
        """In a worker thread: write the log with ``erasures`` applied to a new file, and put it in its place."""
        if self._broken:
            return
        with self._lock:
            self._held = []
        fresh = f"{self._path}.erasing"
        try:
            with open(self._path, encoding="utf-8") as old, open(fresh, "w", encoding="utf-8") as new:
                for line in old:
                    new.write(_erased_line(line, erasures))
            with self._lock:
                with open(fresh, "a", encoding="utf-8") as new:
                    new.writelines(self._held)
                self._file.close()
                os.replace(fresh, self._path)
                self._file = open(self._path, "a", encoding="utf-8")
                self._held = None
        except (OSError, ValueError) as exc:
            with self._lock:
                self._held = None
                self._fail(exc)

    def close(self) -> None:
        with self._lock:
            self._file.close()


#: What an error text of a session's record becomes when episodes of the session are erased.
ERASED_ERROR = "(erased with the session's deleted episodes: it may have quoted them)"


def masked(text: str) -> str:
    """``text`` with every letter an ``x``, every digit a ``0``, any other visible character a ``.``."""
    return "".join("x" if c.isalpha() else "0" if c.isdigit() else c if c.isspace() else "." for c in text)


def _erased_line(line: str, erasures: list[tuple[str, frozenset[int] | None]]) -> str:
    """The log line with the erasures applied (the line itself when they do not touch it)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return line  # not ours to judge: replay reports it
    if not isinstance(record, dict):
        return line
    touched = [seqs for session_id, seqs in erasures if record.get("session") == session_id]
    if not touched:
        return line
    everything = any(seqs is None for seqs in touched)
    erased_seqs = frozenset().union(*(seqs for seqs in touched if seqs is not None))
    if isinstance(record.get("error"), dict):
        record["error"]["message"] = ERASED_ERROR
    if record.get("type") == "add":
        _mask_add(record, everything, erased_seqs)
    return json.dumps(record, ensure_ascii=False) + "\n"


def _mask_add(record: dict[str, Any], everything: bool, erased_seqs: frozenset[int]) -> None:
    episodes = record.get("payload", {}).get("episodes", [])
    outcome = record.get("outcome") or {}
    seqs = outcome.get("seqs") or [None] * len(episodes)
    erased = set(record.get("erased", []))
    for episode, seq in zip(episodes, seqs, strict=False):
        if everything or seq in erased_seqs:
            episode["content"] = masked(episode["content"])
            episode["metadata"] = {}
            if seq is not None:
                erased.add(seq)
    if erased:
        record["erased"] = sorted(erased)


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
    if context.resummarizing:  # a segmented summary's holes after a delete (timing-dependent too)
        outcome["resummarizing"] = [list(hole) for hole in context.resummarizing]
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
