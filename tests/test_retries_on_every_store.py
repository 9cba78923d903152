"""Retries as users see them, on SQLite and PostgreSQL and both async libraries (memengine/retrying.py).

The summarizer's calls are retried in place; retain delivery's refused
batches are retried at times recorded in the store. Both count their tries,
raise (or record) the last error when the tries run out, and stop at once
when cancelled while waiting for the next try.
"""

from __future__ import annotations

import logging

import anyio
import pytest

import memengine.retrying
from memengine import Episode, SessionConfig, SummaryError, open_engine

from .fakes import FailingSummarizer, RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

QUICK = {
    "summarize_backoff": 0.001,
    "summarize_backoff_max": 0.001,
    "retain_backoff": 0.001,
    "retain_backoff_max": 0.001,
}
WINDOW = {"evict_to": 1.0, "max_episodes": 3, "passivate_after": None}
#: One round of three summarizer tries, then an hour before the next round (none comes in a test).
ROUND_OF_THREE = SessionConfig(**WINDOW, **QUICK, summarize_attempts=3, summarize_retry_later=3600)


def turns(count: int) -> list[Episode]:
    return [Episode("user", f"turn {n}") for n in range(1, count + 1)]


async def eventually(condition) -> None:
    """Wait for ``condition()`` (a read of the store), up to a generous deadline."""
    with anyio.fail_after(60):
        while not condition():  # noqa: ASYNC110 - polls what the store holds
            await anyio.sleep(0.01)


async def test_a_summarizer_that_fails_fewer_times_than_its_attempts_is_summarized_in_one_round(
    store_url, rows, caplog: pytest.LogCaptureFixture
) -> None:
    summarizer = FailingSummarizer(failures=2)
    with caplog.at_level(logging.WARNING, logger="memengine.summarizer"):
        async with open_engine(store_url, summarizer=summarizer, config=ROUND_OF_THREE) as engine:
            session = engine.session("s")
            await session.add(turns(5))
            context = await session.context(wait_for_summary=True)
            assert covered(context.summary) == ["turn 1", "turn 2"]
    assert len(summarizer.calls) == 3  # two failures, then the answer: no round of retry_later in between
    assert [r.getMessage().split(" (")[0] for r in caplog.records if "attempt" in r.getMessage()] == [
        "session 's': summarizer attempt 1 failed",
        "session 's': summarizer attempt 2 failed",
    ]
    assert rows.query("SELECT through_seq FROM summaries") == [(2,)]


async def test_a_summarizer_failing_every_attempt_raises_its_last_error_and_keeps_the_episodes_raw(
    store_url, rows, caplog: pytest.LogCaptureFixture
) -> None:
    summarizer = FailingSummarizer(failures=100)
    with caplog.at_level(logging.ERROR, logger="memengine.summarizer"):
        async with open_engine(store_url, summarizer=summarizer, config=ROUND_OF_THREE) as engine:
            session = engine.session("s")
            await session.add(turns(5))
            with pytest.raises(SummaryError, match=r"model unavailable \(call 3\)"):
                await session.context(wait_for_summary=True)
            context = await session.context()
            assert context.summary is None
            assert [e.content for e in context.episodes] == [f"turn {n}" for n in range(1, 6)]
    assert len(summarizer.calls) == 3  # one round of summarize_attempts, then retry_later (an hour)
    assert any("failed after 3 attempt(s)" in record.getMessage() for record in caplog.records)
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]


class _WidestJitter:
    """A jitter source that always draws the top of its window: the backoff is then exactly its cap."""

    def uniform(self, low: float, high: float) -> float:
        return high


async def test_a_close_during_the_backoff_wait_cancels_it_and_the_episodes_are_summarized_next_time(
    store_url, rows, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(memengine.retrying, "_JITTER", _WidestJitter())
    summarizer = FailingSummarizer(failures=1)
    backoff = {"summarize_backoff": 600.0, "summarize_backoff_max": 600.0}  # ten minutes, if nothing cancelled it
    config = SessionConfig(**WINDOW, **backoff, summarize_attempts=3)
    waiting = anyio.Event()

    class Told(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying in 600.00s" in record.getMessage():
                waiting.set()

    told = Told()
    logging.getLogger("memengine.summarizer").addHandler(told)
    try:
        with anyio.fail_after(300):  # a guard against a hang, half the backoff: the wait must end by cancellation
            async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
                await engine.session("s").add(turns(5))
                await waiting.wait()  # the first call failed and the summarizer sleeps before the second
    finally:
        logging.getLogger("memengine.summarizer").removeHandler(told)
    assert len(summarizer.calls) == 1  # no second try: the wait was cancelled with the engine
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]
    again = RecordingSummarizer()
    async with open_engine(store_url, summarizer=again, config=SessionConfig(**WINDOW)) as engine:
        context = await engine.session("s").context(wait_for_summary=True)
        assert covered(context.summary) + [e.content for e in context.episodes] == [f"turn {n}" for n in range(1, 6)]
    assert rows.query("SELECT count(*) FROM summaries") == [(1,)]


async def test_a_refused_retain_batch_is_tried_again_until_the_sink_accepts_it_once(store_url, rows) -> None:
    sink = RecordingSink(failures=2)
    config = SessionConfig(**WINDOW, **QUICK, retain_every=2, retain_attempts=3, retain_retry_later=3600)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        await engine.session("s").add(turns(2))
        await sink.wait_for(1)
    assert sink.calls == 3  # two refusals, then accepted, within one round
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2)]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_retain_batch_refused_for_a_whole_round_records_the_last_error_and_waits_retry_later(
    store_url, rows
) -> None:
    sink = RecordingSink(failures=100)
    config = SessionConfig(**WINDOW, **QUICK, retain_every=2, retain_attempts=3, retain_retry_later=3600)
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0.001) as engine:
        await engine.session("s").add(turns(2))
        await eventually(lambda: rows.query("SELECT attempts FROM retain_outbox") == [(3,)])
        ((error, wait),) = rows.query("SELECT last_error, retry_at - created_at FROM retain_outbox")
        assert "sink unavailable (call 3)" in error
        assert wait > 3000  # the round's end: retain_retry_later (an hour), not a backoff of milliseconds
        assert sink.calls == 3
    assert sink.batches == []
    assert rows.query("SELECT first_seq, last_seq FROM retain_outbox") == [(1, 2)]  # kept, not lost


# -- the store's own retries (PostgreSQL: deadlocks and dropped connections) ------------------------


async def test_a_transaction_that_deadlocked_runs_again_and_one_that_keeps_deadlocking_fails() -> None:
    import psycopg

    from memengine import StoreError
    from memengine.store.open import open_store

    from .conftest import postgres_schema

    calls = {"twice": 0, "always": 0}

    def deadlocks(name: str, times: int):
        def operation(db) -> str:
            calls[name] += 1
            db.execute("SELECT 1")
            if calls[name] <= times:
                raise psycopg.errors.DeadlockDetected("deadlock detected (injected)")
            return "stored"

        return operation

    with postgres_schema() as url:
        async with open_store(url) as store:
            assert await store._submit(deadlocks("twice", 2)) == "stored"  # type: ignore[attr-defined]
            with pytest.raises(StoreError, match="kept deadlocking"):
                await store._submit(deadlocks("always", 10**6))  # type: ignore[attr-defined]
    assert calls == {"twice": 3, "always": 8}  # rolled back and run again; eight tries in all


async def test_a_lease_renewal_whose_connection_the_server_dropped_reconnects_and_renews() -> None:
    import psycopg

    from memengine.store.open import open_store

    from .conftest import POSTGRES_SERVER, postgres_schema

    with postgres_schema() as url:
        async with open_store(url) as store:
            token, _ = await store.activate("s", 60.0)
            assert await store.renew_leases([("s", token)], 60.0) == {"s"}
            renewing = store._renewals._conn.info.backend_pid  # type: ignore[attr-defined]
            with psycopg.connect(POSTGRES_SERVER, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (renewing,))
            assert await store.renew_leases([("s", token)], 60.0) == {"s"}
            assert store._renewals._conn.info.backend_pid != renewing  # type: ignore[attr-defined]
