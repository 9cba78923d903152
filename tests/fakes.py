"""Scripted summarizers for tests: they record calls and block or fail on command."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from memengine import Episode, SummaryError


def fold(previous: str | None, episodes: Sequence[Episode]) -> str:
    """A summary that lists exactly the contents it covers, so tests can check coverage."""
    parts = [previous] if previous else []
    parts.extend(episode.content for episode in episodes)
    return "|".join(parts)


def covered(summary: str | None) -> list[str]:
    return summary.split("|") if summary else []


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


class StuckSink:
    """A retain sink that never returns."""

    mode = "append"

    def __init__(self) -> None:
        self.calls = 0

    async def retain(self, batch) -> None:
        self.calls += 1
        await anyio.sleep_forever()
