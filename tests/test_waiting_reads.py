"""Reads that wait for a summary: abandoned ones leave nothing behind, failed summaries end the wait.

A caller that gives up on ``context(wait_for_summary=True)`` (a timeout, a
disconnect) must leave nothing in the session; and when the summarizer has
failed every attempt for the episodes a reader waits for, the reader gets a
:class:`SummaryError` naming the cause instead of waiting for ever.
"""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Sequence

import anyio
import pytest

from memengine import Episode, SessionConfig, SummaryError, open_engine

from .fakes import FailingSummarizer, GatedSummarizer, covered, turns

pytestmark = pytest.mark.anyio

GUARD = 10
FAST = {
    "summarize_attempts": 2,
    "summarize_backoff": 0.001,
    "summarize_backoff_max": 0.001,
    "summarize_retry_later": 60.0,
    "passivate_after": None,
}


async def test_thousands_of_abandoned_waiting_reads_leave_nothing_behind(db_path) -> None:
    summarizer = GatedSummarizer()  # the summary never comes while the reads wait
    async with open_engine(
        db_path, summarizer=summarizer, config=SessionConfig(evict_to=1.0, max_episodes=1, **FAST)
    ) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        await summarizer.wait_until_called()
        replies = []
        send_now = engine._send_now

        def spying_send_now(session_id, message):  # keeps a weak reference to every message sent
            replies.append(weakref.ref(message))
            return send_now(session_id, message)

        engine._send_now = spying_send_now  # type: ignore[method-assign]
        for _ in range(2000):
            with anyio.move_on_after(0.0005):
                await session.context(wait_for_summary=True)
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        # Nearly every read reached the session before its deadline (on a loaded machine a few are
        # cancelled on the way, which leaves nothing either).
        assert len(replies) >= 1000, len(replies)
        assert sum(ref() is not None for ref in replies) == 0, "abandoned reads are still held"
        summarizer.release()
        with anyio.fail_after(GUARD):
            context = await engine.session("s").context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1"]


class SyncSummarizer:
    def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        return "not awaitable"


class SyncSink:
    def retain(self, batch: object) -> None:
        pass


async def test_a_summarizer_or_sink_that_is_not_async_is_refused_at_open(db_path) -> None:
    with pytest.raises(TypeError, match="async def summarize"):
        async with open_engine(db_path, summarizer=SyncSummarizer()):
            pass
    with pytest.raises(TypeError, match="async def retain"):
        async with open_engine(db_path, retain_sink=SyncSink()):
            pass


@pytest.mark.parametrize(
    ("summarizer", "cause"),
    [
        (FailingSummarizer(failures=10**6), "model unavailable"),
        (FailingSummarizer(failures=10**6, bad=""), "''"),
        (FailingSummarizer(failures=10**6, bad=42), "42"),
    ],
    ids=["raises", "empty", "not-a-string"],
)
async def test_a_reader_waiting_for_a_summary_that_failed_every_attempt_gets_summary_error(
    db_path, caplog: pytest.LogCaptureFixture, summarizer, cause: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="memengine")
    caplog.set_level(logging.DEBUG, logger="memengine.content")  # the opt-in logger of what may quote content
    summarizer.calls.clear()
    config = SessionConfig(evict_to=1.0, max_episodes=1, **FAST)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(3))
        with anyio.fail_after(GUARD), pytest.raises(SummaryError, match="failed") as failed:
            await session.context(wait_for_summary=True)
        assert cause in str(failed.value)
        assert f"{config.summarize_attempts} attempts" in str(failed.value)
        # The episodes stay visible raw, and pending: nothing is lost.
        context = await session.context()
        assert [e.content for e in context.episodes] == ["turn 1", "turn 2", "turn 3"]
    failures = [r for r in caplog.records if r.name == "memengine.summarizer" and r.levelno >= logging.WARNING]
    assert failures, "each failure is logged"
    for record in failures:  # one concise line each; the traceback only at debug level, where content may be
        assert record.exc_info is None and "\n" not in record.getMessage()
    assert any(r.levelno == logging.DEBUG and r.exc_info for r in caplog.records if r.name == "memengine.content")


async def test_a_reader_arriving_after_the_failure_waits_for_the_next_try(db_path) -> None:
    summarizer = FailingSummarizer(failures=2)  # both attempts of the first round fail, the retry succeeds
    config = SessionConfig(evict_to=1.0, max_episodes=1, **{**FAST, "summarize_retry_later": 0.05})
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        with anyio.fail_after(GUARD), pytest.raises(SummaryError):
            await session.context(wait_for_summary=True)
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1"]


@pytest.mark.parametrize("output", ["before\x00after", "lone \ud800 surrogate"], ids=["nul", "surrogate"])
async def test_summarizer_output_the_store_cannot_hold_is_cleaned_not_retried_forever(
    store_url: str, output: str
) -> None:
    class OddSummarizer:
        calls = 0

        async def summarize(self, previous, episodes) -> str:
            OddSummarizer.calls += 1
            return output

    async with open_engine(
        store_url, summarizer=OddSummarizer(), config=SessionConfig(evict_to=1.0, max_episodes=1)
    ) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
    assert OddSummarizer.calls == 1
    assert context.summary is not None and "\x00" not in context.summary
    context.summary.encode("utf-8")  # storable as UTF-8
