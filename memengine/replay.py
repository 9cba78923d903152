"""Replaying recorded messages into an engine.

An engine opened with ``record_to=PATH`` records every message its sessions
handle (see :mod:`memengine.session.recording` for the record format).
:func:`replay` feeds such a log into an engine on a fresh store (open it with
:func:`recorded_config`'s config to reproduce the recording). It reproduces
the same episodes and seqs, and the same summaries whenever the summarizer's
result does not depend on how evictions were batched into calls. Tests can
be written as logs.

This module drives an engine (it depends on :mod:`memengine.engine`); the
engine and its sessions know only the recorder. ``MessageRecorder`` is
importable from here too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from .config import SessionConfig
from .session.recording import MessageRecorder, context_json, episode_from_json

if TYPE_CHECKING:
    from .engine import Engine

__all__ = [
    "MessageRecorder",
    "RecordedEngine",
    "ReplayReport",
    "read_log",
    "recorded_config",
    "replay",
]


@attrs.frozen
class RecordedEngine:
    """What the first engine that wrote a log was opened with, as far as a replay can rebuild it.

    ``config`` is its :class:`SessionConfig` (without a tokenizer); ``notes``
    say what could not be rebuilt (a custom tokenizer, fields this version
    does not know, other engines with another config in the same log).
    """

    config: SessionConfig
    summarizer: str | None
    notes: tuple[str, ...]


def recorded_config(path: str | os.PathLike[str]) -> RecordedEngine | None:
    """The engine options recorded in the log at ``path``, or ``None`` for a log written before they were."""
    headers = [record for record in read_log(path) if record["type"] == "engine"]
    if not headers:
        return None
    first = headers[0]
    fields = dict(first.get("config") or {})
    known = {field.name for field in attrs.fields(SessionConfig)} - {"tokenizer"}
    notes = []
    unknown = sorted(set(fields) - known)
    if unknown:
        notes.append(f"recorded config fields this memengine does not know are ignored: {', '.join(unknown)}")
    try:
        config = SessionConfig(**{name: value for name, value in fields.items() if name in known})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{os.fspath(path)}: the recorded config is not valid: {exc}") from None
    if first.get("tokenizer") is not None:
        notes.append("recorded with a custom tokenizer; replayed with the offline token estimate")
    if any(header.get("config") != first.get("config") for header in headers[1:]):
        notes.append("the log was written by engines with different configs; replayed with the first one's")
    summarizer = first.get("summarizer")
    return RecordedEngine(config, summarizer if isinstance(summarizer, str) else None, tuple(notes))


def _read_differences(recorded: dict[str, Any], replayed: dict[str, Any], waited: bool) -> dict[str, Any]:
    """The parts of a read's outcome that differ, among those that do not depend on the summarizer's timing.

    The window (``evicted_through`` and the raw episodes after it) follows from
    the messages alone. How far the summary reaches does too for a read that
    waited for it and found everything evicted summarized; otherwise it depends
    on when the summarizer finished. Logs written before ``evicted_through``
    was recorded compare only the reads that waited for a summary.
    """
    if "evicted_through" not in recorded:
        keys = ["summarized_through", "seqs"] if waited and "seqs" in recorded else []
        return {key: (recorded[key], replayed[key]) for key in keys if recorded[key] != replayed[key]}

    # Episodes left out for the token ceiling depend on the summarizer's timing too: compared after them.
    left_out = max([outcome.get("omitted", (0, 0))[1] for outcome in (recorded, replayed)])

    def window(outcome: dict[str, Any]) -> dict[str, Any]:
        through = outcome["evicted_through"]
        return {"evicted_through": through, "window": [seq for seq in outcome["seqs"] if seq > max(through, left_out)]}

    expected, actual = window(recorded), window(replayed)
    if waited and recorded["summarized_through"] == recorded["evicted_through"]:
        expected["summarized_through"] = recorded["summarized_through"]
        actual["summarized_through"] = replayed["summarized_through"]
    return {key: (expected[key], actual[key]) for key in expected if expected[key] != actual[key]}


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
            if not isinstance(record, dict) or "type" not in record:
                raise ValueError(f"{os.fspath(path)}:{number}: a record needs 'session' and 'type'")
            if record["type"] != "engine" and "session" not in record:
                raise ValueError(f"{os.fspath(path)}:{number}: a record needs 'session' and 'type'")
            yield record


async def replay(
    path: str | os.PathLike[str], engine: Engine, on_handled: Callable[[int], object] | None = None
) -> ReplayReport:
    """Send every message of the log at ``path`` to ``engine``, in order.

    Messages that failed when recorded are sent again (they fail again or not);
    reads that waited for a summary wait again, so replay passes the same
    synchronisation points. Differences between recorded and replayed outcomes
    (seqs of an add, count of a delete, a read's window and, where it does not
    depend on timing, its summary's reach) are reported, not raised. The
    engine's config is the caller's choice: :func:`recorded_config` gives the
    recorded one. ``on_handled`` is called with the number of messages
    handled so far, after each one (for progress).
    """
    mismatches: list[str] = []
    sessions: dict[str, None] = {}
    messages: Iterator[dict[str, Any]] = (record for record in read_log(path) if record["type"] != "engine")
    if on_handled is not None:
        messages = _counted(messages, on_handled)
    count = 0
    for count, record in enumerate(messages, 1):
        session_id = record["session"]
        sessions[session_id] = None
        session = engine.session(session_id)
        payload = record.get("payload", {})
        expected = record.get("outcome")
        kind = record["type"]
        try:
            if kind == "add":
                stored = await session.add([episode_from_json(e) for e in payload["episodes"]])
                actual: Any = {"seqs": [e.seq for e in stored]}
            elif kind == "read":
                waited = payload.get("wait_for_summary", False)
                replayed = context_json(await session.context(wait_for_summary=waited))
                if expected is not None:
                    differences = _read_differences(expected, replayed, waited)
                    for key, (was, now) in differences.items():
                        mismatches.append(
                            f"message {count} (read on {session_id!r}): {key} recorded {was}, replayed {now}"
                        )
                continue
            elif kind == "delete":
                actual = {"deleted": await session.delete_episodes(payload["seqs"])}
            elif kind == "clear":
                await session.clear()
                actual = {}
            elif kind == "forget":
                await engine.forget(session_id=session_id)
                actual = {}
            elif kind == "close":
                await session.close()
                actual = {}
            else:
                raise ValueError(f"message {count}: unknown type {kind!r}")
        except KeyError as exc:
            raise ValueError(f"{os.fspath(path)}: message {count} ({kind}) lacks {exc}") from None
        except (ValueError, TypeError) as exc:
            if "error" not in record:
                mismatches.append(f"message {count} ({kind} on {session_id!r}) failed on replay: {exc}")
            continue
        if expected is not None and actual != expected:
            mismatches.append(f"message {count} ({kind} on {session_id!r}): recorded {expected}, replayed {actual}")
    return ReplayReport(count, tuple(sessions), tuple(mismatches))


def _counted(records: Iterator[dict[str, Any]], on_handled: Callable[[int], object]) -> Iterator[dict[str, Any]]:
    """``records``, calling ``on_handled`` each time the one handed out before was handled."""
    handled = 0
    for record in records:
        yield record
        handled += 1
        on_handled(handled)
