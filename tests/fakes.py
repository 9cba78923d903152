"""Scripted summarizers for tests: they record calls and block or fail on command."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import anyio

from memengine import Episode, SummaryError
from memengine.store.segments import PART_SEPARATOR


def fold(previous: str | None, episodes: Sequence[Episode]) -> str:
    """A summary that lists exactly the contents it covers, so tests can check coverage."""
    parts = [previous] if previous else []
    parts.extend(episode.content for episode in episodes)
    return "|".join(parts)


def covered(summary: str | None) -> list[str]:
    """The contents a :func:`fold` summary covers, in order; a segmented one's parts too.

    A segmented summary shows a hole's episodes in its place, one ``role: content`` line each, between
    the marker lines (store/segments.py): they are read as the contents they show.
    """
    if not summary:
        return []
    contents: list[str] = []
    for part in summary.split(PART_SEPARATOR):
        if not part.startswith("[memengine:"):
            contents.extend(part.split("|"))
            continue
        contents.extend(line.split(": ", 1)[1] for line in part.split("\n") if not line.startswith("[memengine:"))
    return contents


class RecordingSummarizer:
    """Answers at once with :func:`fold`; records each call's episode seqs."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls.append(tuple(episode.seq for episode in episodes))  # type: ignore[misc]
        return fold(previous, episodes)


class GatedSummarizer(RecordingSummarizer):
    """Blocks every call until :meth:`release`; :attr:`started` counts calls entered."""

    def __init__(self) -> None:
        super().__init__()
        self._gate: anyio.Event | None = None
        self._entered: anyio.Event | None = None
        self.finished = 0

    def _events(self) -> tuple[anyio.Event, anyio.Event]:
        if self._gate is None or self._entered is None:
            self._gate, self._entered = anyio.Event(), anyio.Event()
        return self._gate, self._entered

    async def wait_until_called(self, times: int = 1) -> None:
        while len(self.calls) < times:
            _, entered = self._events()
            await entered.wait()
            self._entered = anyio.Event()

    def release(self) -> None:
        gate, _ = self._events()
        gate.set()

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        gate, entered = self._events()
        self.calls.append(tuple(episode.seq for episode in episodes))  # type: ignore[misc]
        entered.set()
        await gate.wait()
        self.finished += 1
        return fold(previous, episodes)


class FailingSummarizer(RecordingSummarizer):
    """Raises (or returns ``bad``) for the first ``failures`` calls, then folds."""

    def __init__(self, failures: int, bad: object = None) -> None:
        super().__init__()
        self.failures = failures
        self.bad = bad

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        result = await super().summarize(previous, episodes)
        if len(self.calls) <= self.failures:
            if self.bad is not None:
                return self.bad  # type: ignore[return-value]
            raise RuntimeError(f"model unavailable (call {len(self.calls)})")
        return result


class QuotingSummarizer(RecordingSummarizer):
    """Refuses any batch with an episode that holds ``refused``, quoting the episode (as a model's refusal might)."""

    def __init__(self, refused: str) -> None:
        super().__init__()
        self.refused = refused

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        for episode in episodes:
            if self.refused in episode.content:
                raise RuntimeError(f"the model refuses to summarize {episode.content!r}")
        return await super().summarize(previous, episodes)


async def context_once_summarized(session):
    """``context(wait_for_summary=True)``, asked again after each :class:`SummaryError`, as a patient client would.

    A waiting read is told when the summarizer failed every attempt; tests whose
    summarizer recovers later wait through such rounds with this.
    """
    while True:
        try:
            return await session.context(wait_for_summary=True)
        except SummaryError:
            await anyio.sleep(0.001)


def turns(count: int, start: int = 1, prefix: str = "turn") -> list[Episode]:
    return [Episode("user" if i % 2 else "assistant", f"{prefix} {i}") for i in range(start, start + count)]


async def add_each(session, episodes: Sequence[Episode]) -> None:
    for episode in episodes:
        await session.add([episode])


class RecordingSink:
    """A retain sink that records every batch it accepts."""

    def __init__(self, mode: str = "append", failures: int = 0) -> None:
        self.mode = mode
        self.failures = failures
        self.calls = 0
        self.batches: list = []
        self._arrived: anyio.Event | None = None

    async def retain(self, batch) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"sink unavailable (call {self.calls})")
        self.batches.append(batch)
        if self._arrived is not None:
            self._arrived.set()

    async def wait_for(self, count: int) -> None:
        while len(self.batches) < count:
            self._arrived = anyio.Event()
            await self._arrived.wait()

    def delivered_contents(self) -> list[str]:
        return [episode.content for batch in self.batches for episode in batch.episodes]


class ForgettingSink(RecordingSink):
    """A retain sink that also forgets: records every call in order, and what it holds per session.

    ``calls_made`` lists ``("retain", seqs)`` and ``("forget", seqs or None)`` in arrival order;
    ``held`` is the sink's model of its store: the seqs of each session it was handed and not told to forget.
    With ``gate`` set, each call waits for it (``entered`` counts calls that started).
    """

    def __init__(self, mode: str = "append", failures: int = 0) -> None:
        super().__init__(mode, failures)
        self.calls_made: list[tuple[str, tuple[int, ...] | None]] = []
        self.forgets: list = []
        self.held: dict[str, set[int]] = {}
        self.gate: anyio.Event | None = None
        self.entered = 0

    async def retain(self, batch) -> None:
        self.entered += 1
        if self.gate is not None:
            await self.gate.wait()
        await super().retain(batch)
        seqs = tuple(episode.seq for episode in batch.episodes)
        self.calls_made.append(("retain", seqs))
        held = self.held.setdefault(batch.session_id, set())
        if batch.mode == "replace":
            held.clear()
        held.update(seqs)

    async def forget(self, request) -> None:
        self.entered += 1
        if self.gate is not None:
            await self.gate.wait()
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"sink unavailable (call {self.calls})")
        self.forgets.append(request)
        self.calls_made.append(("forget", request.seqs))
        held = self.held.setdefault(request.session_id, set())
        if request.seqs is None:
            held.clear()
        else:
            held.difference_update(request.seqs)
        if self._arrived is not None:
            self._arrived.set()

    async def wait_for_calls(self, count: int) -> None:
        while len(self.calls_made) < count:
            self._arrived = anyio.Event()
            await self._arrived.wait()


class StuckSink:
    """A retain sink that never returns."""

    def __init__(self, mode: str = "append") -> None:
        self.mode = mode
        self.calls = 0

    async def retain(self, batch) -> None:
        self.calls += 1
        await anyio.sleep_forever()


class CommitThenLoseConnection:
    """Wraps a store's connection: when armed, the next COMMIT lands, then "the connection is lost".

    The store then cannot know whether the transaction landed and reports
    :class:`UncertainCommitError`, exactly as after a connection lost right
    after the server committed. With ``hold``, that COMMIT first waits for
    :meth:`release` (so a test can line other calls up behind it).
    """

    def __init__(self, store: Any, wait: float = 10.0) -> None:
        self._conn = store._conn
        self._error = store._dialect.errors[0]  # the driver's own error (sqlite3.Error, psycopg.Error)
        self._wait = wait
        self._armed = threading.Event()
        self._held: threading.Event | None = None
        self._lost_now = False
        self.lost = 0
        store._conn = self
        store._connection_lost = self._connection_lost

    def arm(self, *, hold: bool = False) -> None:
        self._held = threading.Event() if hold else None
        self._armed.set()

    def disarm(self) -> None:
        self._armed.clear()

    def release(self) -> None:
        if self._held is not None:
            self._held.set()

    def _connection_lost(self) -> bool:
        lost, self._lost_now = self._lost_now, False  # said once, for the COMMIT that "lost" it
        return lost

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        if sql.strip() == "COMMIT" and self._armed.is_set():
            self._armed.clear()
            if self._held is not None:
                self._held.wait(self._wait)
            self._conn.execute(sql, parameters)  # committed...
            self.lost += 1
            self._lost_now = True
            raise self._error("connection lost (injected, after the commit)")  # ...but who knows
        return self._conn.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
