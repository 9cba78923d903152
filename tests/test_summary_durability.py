"""Acknowledged means stored: retries, giving up for now, garbage output, crashes mid-summary."""

from __future__ import annotations

import logging

import anyio
import pytest

from memengine import SessionConfig, SummaryError, open_engine

from .conftest import virtual_time_backends
from .fakes import (
    FailingSummarizer,
    GatedSummarizer,
    RecordingSummarizer,
    add_each,
    context_once_summarized,
    covered,
    turns,
)

pytestmark = pytest.mark.anyio


# Retry delays are virtual under trio (MockClock); under asyncio the same tests
# run with the delays scaled down to milliseconds.
anyio_backend = virtual_time_backends()


@pytest.fixture
def config(anyio_backend) -> SessionConfig:
    scale = 1.0 if anyio_backend != "asyncio" else 0.001
    return SessionConfig(
        evict_to=1.0,
        max_episodes=3,
        summarize_attempts=3,
        summarize_backoff=1.0 * scale,
        summarize_backoff_max=5.0 * scale,
        summarize_retry_later=60.0 * scale,
    )


async def test_failures_are_retried_then_stored_once(db_path, stored, config, caplog) -> None:
    summarizer = FailingSummarizer(failures=2)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        context = await session.context(wait_for_summary=True)
    assert covered(context.summary) == ["turn 1"]
    assert summarizer.calls == [(1,), (1,), (1,)]
    assert stored.summaries("s") == [(1, "turn 1")]
    retries = [r for r in caplog.records if r.name == "memengine.summarizer" and r.levelno == logging.WARNING]
    # Named by its type: its text may quote the episodes (memengine/privacy/error_text.py).
    assert len(retries) == 2 and "RuntimeError" in retries[0].getMessage()
    assert "model unavailable" not in retries[0].getMessage()


class GatedFailingSummarizer(FailingSummarizer):
    """Fails like FailingSummarizer, but not before ``gate`` is set."""

    def __init__(self, failures: int) -> None:
        super().__init__(failures)
        self.gate = anyio.Event()

    async def summarize(self, previous, episodes):
        await self.gate.wait()
        return await super().summarize(previous, episodes)


async def test_after_the_last_attempt_the_batch_stays_pending_and_is_retried_later(
    db_path, stored, config, caplog
) -> None:
    summarizer = GatedFailingSummarizer(failures=config.summarize_attempts + 1)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        await add_each(session, turns(2, start=5))  # two more evictions while the first batch fails

        async def waiting_read() -> None:
            with pytest.raises(SummaryError, match="failed after 3 attempts"):  # told, not kept waiting
                await session.context(wait_for_summary=True)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(waiting_read)
            await anyio.wait_all_tasks_blocked()  # the read waits: only now may the attempts fail
            summarizer.gate.set()
        context = await context_once_summarized(session)
    # Attempts 1-3 failed; the 4th call (the retry, later) failed too; the 5th covered everything.
    assert len(summarizer.calls) == 5
    assert summarizer.calls[-1] == (1, 2, 3)
    assert covered(context.summary) == ["turn 1", "turn 2", "turn 3"]
    assert stored.summaries("s") == [(3, "turn 1|turn 2|turn 3")]
    gave_up = [r for r in caplog.records if r.name == "memengine.summarizer" and r.levelno == logging.ERROR]
    assert gave_up and "stay pending" in gave_up[0].getMessage()


async def test_pending_episodes_stay_visible_while_the_summarizer_fails(db_path, stored, config) -> None:
    summarizer = FailingSummarizer(failures=1000)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(6))
        context = await session.context()
        assert context.summary is None
        assert [e.seq for e in context.episodes] == [1, 2, 3, 4, 5, 6]
        assert context.evicted_through == 3
    assert stored.summaries("s") == []


@pytest.mark.parametrize("garbage", ["", "   \n", 42])
async def test_garbage_output_is_never_stored(db_path, stored, config, garbage) -> None:
    summarizer = FailingSummarizer(failures=2, bad=garbage)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        context = await session.context(wait_for_summary=True)
    assert covered(context.summary) == ["turn 1"]
    assert stored.summaries("s") == [(1, "turn 1")]


async def test_summary_cut_off_by_shutdown_is_made_after_restart(db_path, stored, config) -> None:
    blocked = GatedSummarizer()
    async with open_engine(db_path, summarizer=blocked, config=config) as engine:
        await add_each(engine.session("s"), turns(7))
        await blocked.wait_until_called()
    # The engine stopped mid-summary: nothing was stored, the episodes are all still there.
    assert blocked.finished == 0
    assert stored.summaries("s") == []
    assert [seq for seq, _ in stored.episodes("s")] == list(range(1, 8))

    summarizer = GatedSummarizer()
    summarizer.release()
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        # Nobody touched the session: the engine found the pending work on its own.
        await summarizer.wait_until_called()
        assert engine.is_active("s")
        context = await engine.session("s").context(wait_for_summary=True)
    assert summarizer.calls[0] == (1, 2, 3, 4)
    assert covered(context.summary) == [f"turn {i}" for i in range(1, 5)]
    assert stored.summaries("s")[-1] == (4, "turn 1|turn 2|turn 3|turn 4")


async def test_restart_without_pending_work_activates_nothing(db_path, config) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(5))
        await session.context(wait_for_summary=True)
        await add_each(engine.session("small"), turns(2))
    summarizer = RecordingSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        context = await engine.session("s").context()
        assert [e.seq for e in context.episodes] == [3, 4, 5]
        assert not engine.is_active("small")
    assert summarizer.calls == []
