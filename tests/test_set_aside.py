"""Poison work is set aside: a summary batch that fails round after round stops being retried until asked.

The session may then passivate, the failure shows in stats, the store and the
logs, a restart keeps it set aside, and a retry summarizes it and lifts the mark.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from memengine import SessionConfig, StoreError, SummaryError, open_engine

from .conftest import StoreRows, virtual_time_backends
from .fakes import RecordingSummarizer, add_each, context_once_summarized, covered, turns

pytestmark = pytest.mark.anyio

anyio_backend = virtual_time_backends()


class BrokenSummarizer(RecordingSummarizer):
    """Refuses every call while :attr:`broken`; then folds."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    async def summarize(self, previous, episodes):
        summary = await super().summarize(previous, episodes)
        if self.broken:
            raise RuntimeError("the model refuses this batch")
        return summary


def scaled(anyio_backend) -> float:
    return 1.0 if anyio_backend != "asyncio" else 0.01


@pytest.fixture
def config(anyio_backend) -> SessionConfig:
    scale = scaled(anyio_backend)
    return SessionConfig(
        evict_to=1.0,
        max_episodes=3,
        summarize_attempts=2,
        summarize_backoff=0.1 * scale,
        summarize_backoff_max=0.1 * scale,
        summarize_retry_later=5.0 * scale,
        summarize_set_aside_after=2,
        passivate_after=20.0 * scale,
    )


async def set_aside_error(session) -> SummaryError:
    """Read, waiting for the summary, until the read is told the batch is set aside."""
    with anyio.fail_after(60):
        while True:
            try:
                await session.context(wait_for_summary=True)
            except SummaryError as error:
                if "set aside" in str(error):
                    return error
            else:
                raise AssertionError("the summary was stored")


async def until_passivated(engine, session_id: str, scale: float) -> None:
    with anyio.fail_after(60):
        while engine.is_active(session_id):  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(scale)


async def test_a_batch_failing_every_round_is_set_aside_and_the_session_passivates(
    store_url, config, anyio_backend, caplog
) -> None:
    rows = StoreRows(store_url)
    summarizer = BrokenSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))  # seq 1 is evicted
        error = await set_aside_error(session)
        assert "episodes 1..1" in error.args[0] and "the model refuses" in error.args[0]
        # Two rounds of two attempts, then no more calls.
        assert summarizer.calls == [(1,)] * 4
        stats = await engine.stats()
        assert (stats.summaries_set_aside, stats.retains_set_aside) == (1, 0)
        (work,) = await engine.list_set_aside()
        assert (work.kind, work.session_id, work.first_seq, work.last_seq, work.attempts) == ("summary", "s", 1, 1, 4)
        assert "the model refuses" in work.error
        # Later evictions stay pending too (summaries cover episodes in order), every episode shown raw.
        await add_each(session, turns(3, start=5))
        context = await session.context()
        assert context.summary is None and [e.seq for e in context.episodes] == list(range(1, 8))
        await until_passivated(engine, "s", scaled(anyio_backend))
        assert len(summarizer.calls) == 4
        # No engine picks the session up to summarize it (at its start, or from a dead owner).
        assert await engine.store.sessions_needing_summary(3, 8000) == []
    assert rows.query("SELECT session_id, through_seq, attempts FROM summaries_set_aside") == [("s", 1, 4)]
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]
    set_aside_logs = [r for r in caplog.records if r.levelno == logging.ERROR and "set aside" in r.getMessage()]
    assert len(set_aside_logs) == 1


async def test_a_restart_keeps_it_set_aside_and_a_retry_summarizes_it(store_url, config, anyio_backend) -> None:
    rows = StoreRows(store_url)
    summarizer = BrokenSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(5))
        await set_aside_error(session)
    calls = len(summarizer.calls)

    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        context = await session.context()  # activated again: the mark is loaded, nothing is tried
        assert [e.seq for e in context.episodes] == [1, 2, 3, 4, 5] and context.summary is None
        with pytest.raises(SummaryError, match="set aside"):
            await session.context(wait_for_summary=True)  # told at once, not kept waiting
        assert (await engine.stats()).summaries_set_aside == 1
        await until_passivated(engine, "s", scaled(anyio_backend))
        assert len(summarizer.calls) == calls

        summarizer.broken = False
        assert await engine.retry_set_aside() == 1
        context = await engine.session("s").context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1", "turn 2"]
        assert [e.seq for e in context.episodes] == [3, 4, 5]
        assert (await engine.stats()).summaries_set_aside == 0
        assert await engine.list_set_aside() == []
        assert await engine.retry_set_aside() == 0  # nothing left to retry
    assert rows.query("SELECT count(*) FROM summaries_set_aside") == [(0,)]
    assert rows.query("SELECT through_seq, summary FROM summaries") == [(2, "turn 1|turn 2")]


async def test_a_clear_gives_the_session_a_fresh_start(store_url, config) -> None:
    rows = StoreRows(store_url)
    summarizer = BrokenSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        await set_aside_error(session)
        await session.clear()  # a new generation: the mark no longer holds
        assert (await engine.stats()).summaries_set_aside == 0
        # Gone with the episodes: its error text may quote them (derived data never outlives its source).
        assert rows.query("SELECT count(*) FROM summaries_set_aside") == [(0,)]
        summarizer.broken = False
        await add_each(session, turns(4, start=10))
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 10"]


async def test_a_delete_lifts_the_mark_and_what_is_left_is_summarized(store_url, config) -> None:
    rows = StoreRows(store_url)
    summarizer = BrokenSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(5))
        await set_aside_error(session)
        summarizer.broken = False
        assert await session.delete_episodes([1]) == 1
        assert rows.query("SELECT count(*) FROM summaries_set_aside") == [(0,)]
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 2"]
        assert [e.seq for e in context.episodes] == [3, 4, 5]


async def test_never_set_aside_when_not_configured(db_path, config) -> None:
    summarizer = BrokenSummarizer()
    never = SessionConfig(**{**_fields(config), "summarize_set_aside_after": None})
    async with open_engine(db_path, summarizer=summarizer, config=never) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        for _ in range(4):  # four rounds, each told to the waiting read, never set aside
            with pytest.raises(SummaryError, match="tried again in"):
                await session.context(wait_for_summary=True)
        assert (await engine.stats()).summaries_set_aside == 0
        assert len(summarizer.calls) >= 8


def _fields(config: SessionConfig) -> dict:
    import attrs

    return attrs.asdict(config)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3"])
def test_the_set_aside_settings_are_validated(value) -> None:
    with pytest.raises((TypeError, ValueError), match="summarize_set_aside_after"):
        SessionConfig(summarize_set_aside_after=value)
    with pytest.raises((TypeError, ValueError), match="retain_set_aside_after"):
        SessionConfig(retain_set_aside_after=value)


class RefusesSessionA(RecordingSummarizer):
    """Refuses every batch of session "a" (contents "a ..."), folds the others."""

    def __init__(self) -> None:
        super().__init__()
        self.calls_for_a = 0

    async def summarize(self, previous, episodes):
        if episodes[0].content.startswith("a "):
            self.calls_for_a += 1
            raise RuntimeError("refused")
        return await super().summarize(previous, episodes)


async def test_no_summarizer_slot_is_held_while_a_batch_waits_for_its_next_attempt(db_path) -> None:
    # One slot for the whole engine; session a's batch sleeps out a long backoff between its attempts.
    config = SessionConfig(
        evict_to=1.0, max_episodes=3, summarize_attempts=2, summarize_backoff=1000.0, summarize_backoff_max=1000.0
    )
    summarizer = RefusesSessionA()
    async with open_engine(db_path, summarizer=summarizer, config=config, max_concurrent_summaries=1) as engine:
        await add_each(engine.session("a"), turns(4, prefix="a"))
        with anyio.fail_after(60):
            while summarizer.calls_for_a < 1:  # noqa: ASYNC110 - polls what the summarizer saw
                await anyio.sleep(0.001)
            await add_each(engine.session("b"), turns(4, prefix="b"))
            context = await engine.session("b").context(wait_for_summary=True)
        assert covered(context.summary) == ["b 1"]
        # b was summarized while a waited for its second attempt, not after it.
        assert summarizer.calls_for_a == 1


async def test_an_active_session_notices_at_its_idle_tick_a_mark_lifted_in_the_store(
    store_url, config, anyio_backend
) -> None:
    scale = scaled(anyio_backend)
    summarizer = BrokenSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        await set_aside_error(session)
        summarizer.broken = False
        # What `memengine set-aside retry` does from another process: lift the mark in the store only.
        assert await engine.store.lift_summary_set_aside("s", None)
        with anyio.fail_after(60):
            while True:  # reading keeps the session active: it is the tick, not a new activation, that notices
                try:
                    context = await session.context(wait_for_summary=True)
                    break
                except SummaryError:
                    await anyio.sleep(scale)
        assert covered(context.summary) == ["turn 1"]


async def test_rounds_lost_to_the_store_do_not_set_a_batch_aside(db_path, config, monkeypatch) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        store_summary = engine.store.store_summary

        async def store_down(*args, **kwargs):
            raise StoreError("the disk is full")

        monkeypatch.setattr(engine.store, "store_summary", store_down)
        session = engine.session("s")
        await add_each(session, turns(4))
        for _ in range(3):  # more rounds than summarize_set_aside_after, each told to the waiting read
            with pytest.raises(SummaryError, match="storing the summary"):
                await session.context(wait_for_summary=True)
        assert (await engine.stats()).summaries_set_aside == 0
        monkeypatch.setattr(engine.store, "store_summary", store_summary)
        context = await context_once_summarized(session)
        assert covered(context.summary) == ["turn 1"]
