"""Writers never wait for the LLM; evictions coalesce; waiting readers are independent."""

from __future__ import annotations

import anyio
import pytest

from memengine import LeaseLostError, SessionConfig, open_engine
from memengine.session.messages import SummaryStored

from .fakes import GatedSummarizer, RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio

SMALL_WINDOW = SessionConfig(evict_to=1.0, max_episodes=3)


async def test_add_returns_while_the_summarizer_is_blocked(db_path, stored) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))  # evicts turn 1: the summarizer is called and blocks
        await summarizer.wait_until_called()
        # The LLM never answers during these adds; each add still returns, committed.
        await add_each(session, turns(20, start=5))
        assert len(stored.episodes("s")) == 24
        assert summarizer.finished == 0
        context = await session.context()
        # Nothing disappears from view while the LLM call is pending.
        assert context.summary is None
        assert [e.seq for e in context.episodes] == list(range(1, 25))
        assert context.evicted_through == 21
        summarizer.release()


async def test_evictions_during_a_slow_call_coalesce(db_path, stored) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))
        await summarizer.wait_until_called()
        await add_each(session, turns(40, start=5))  # 40 more evictions while the call is blocked
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.summarized_through == 41
        assert covered(context.summary) == [f"turn {i}" for i in range(1, 42)]
        # One call for the first eviction, one for the 40 that piled up behind it.
        assert summarizer.calls == [(1,), tuple(range(2, 42))]
        assert stored.summaries("s")[-1][0] == 41


async def test_cancelled_waiter_stops_only_its_own_wait(db_path, stored) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(6))  # evicts turns 1..3
        await summarizer.wait_until_called()
        answers = []

        async def wait_for_summary() -> None:
            answers.append(await session.context(wait_for_summary=True))

        async with anyio.create_task_group() as waiters:
            waiters.start_soon(wait_for_summary)
            waiters.start_soon(wait_for_summary)
            async with anyio.create_task_group() as impatient:
                impatient.start_soon(wait_for_summary)
                await anyio.wait_all_tasks_blocked()
                impatient.cancel_scope.cancel()
            assert answers == []
            summarizer.release()
        # The two patient waiters got their answer; the summarizer was never cancelled.
        assert len(answers) == 2
        for context in answers:
            assert context.summarized_through == 3
            assert [e.seq for e in context.episodes] == [4, 5, 6]
        assert summarizer.calls == [(1,), (2, 3)]
        assert [through for through, _ in stored.summaries("s")] == [1, 3]


async def test_waiting_reader_sees_every_earlier_eviction_covered(db_path) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(10))
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.summarized_through == 7
        assert context.evicted_through == 7
        assert [e.seq for e in context.episodes] == [8, 9, 10]


async def test_wait_for_summary_with_nothing_evicted_answers_at_once(db_path) -> None:
    summarizer = GatedSummarizer()  # never released
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))
        with anyio.fail_after(60):
            context = await session.context(wait_for_summary=True)
        assert [e.seq for e in context.episodes] == [1, 2, 3]
        assert summarizer.calls == []


async def test_summaries_in_flight_are_capped_engine_wide(db_path) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW, max_concurrent_summaries=3) as engine:
        for n in range(8):
            await add_each(engine.session(f"s{n}"), turns(4))
        await summarizer.wait_until_called(3)
        await anyio.wait_all_tasks_blocked()
        assert len(summarizer.calls) == 3  # five sessions wait for a slot
        summarizer.release()
        for n in range(8):
            context = await engine.session(f"s{n}").context(wait_for_summary=True)
            assert covered(context.summary) == ["turn 1"]
        assert len(summarizer.calls) == 8


async def test_a_summary_answered_in_the_moment_its_activation_stops_breaks_nothing(db_path) -> None:
    """The child's answer and the activation's end land together: the session stops cleanly, nothing is lost.

    The summary's store call returns in the very step the activation is given
    up, so the child is already due to run with its answer when the actor
    closes its mailbox. Repeated, since which of the two runs first is the
    scheduler's choice.
    """
    for attempt in range(12):
        session_id = f"s{attempt}"
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
            store = engine.store
            real_store_summary = store.store_summary
            gate, waiting = anyio.Event(), anyio.Event()

            async def store_summary(*args, real=real_store_summary, gate=gate, waiting=waiting, **kwargs):
                stored = await real(*args, **kwargs)
                waiting.set()
                await gate.wait()
                return stored

            store.store_summary = store_summary
            session = engine.session(session_id)
            await session.add(turns(6))  # evicts: a summary starts
            with anyio.fail_after(60):
                await waiting.wait()
            actor = engine._actors[session_id]
            actor._give_up(LeaseLostError("given up in the test"))  # the actor is due to stop...
            gate.set()  # ...and the child is due to answer, in the same step
            with anyio.fail_after(60):
                while engine.is_active(session_id):  # noqa: ASYNC110 - what a user can observe
                    await anyio.sleep(0.01)
            store.store_summary = real_store_summary
            # Whichever ran first, the child's answer to a stopped activation is dropped, not raised into
            # the session's task group (as a CI run once saw: MailboxClosed, and the session failed).
            actor._child._acknowledge(SummaryStored(0, 3, "late", True))
            context = await session.context(wait_for_summary=True)  # a new activation, from the store
            assert covered(context.summary) + [e.content for e in context.episodes] == [e.content for e in turns(6)]
