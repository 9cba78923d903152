"""Summarizer calls follow the evicted volume, not the number of turns, and each call's input is bounded.

While one summarizer call is held, every later eviction waits for the next
call, and that single call takes all of them (``summarize_batch_max`` at a
time). Which episodes each call received is recorded by the summarizer itself.
This is the session actor's bookkeeping, the same on every store: SQLite only.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import SessionConfig, open_engine

from .fakes import GatedSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio


def contents(seqs) -> list[str]:
    return [f"turn {seq}" for seq in seqs]


async def test_evictions_during_a_call_all_go_into_the_next_single_call(db_path) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(evict_to=1.0, max_episodes=2, passivate_after=None)
    with anyio.fail_after(60):
        async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
            session = engine.session("s")
            await add_each(session, turns(3))  # 1 leaves the window
            await summarizer.wait_until_called()
            await add_each(session, turns(7, start=4))  # 2-8 leave it while the first call is held
            assert summarizer.calls == [(1,)]
            held = await session.context()
            assert (held.summary, [e.seq for e in held.episodes]) == (None, list(range(1, 11)))

            summarizer.release()
            context = await session.context(wait_for_summary=True)
    assert summarizer.calls == [(1,), (2, 3, 4, 5, 6, 7, 8)]
    assert covered(context.summary) == contents(range(1, 9))
    assert [e.seq for e in context.episodes] == [9, 10]


async def test_no_call_takes_more_than_summarize_batch_max_episodes(db_path) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(evict_to=1.0, max_episodes=2, summarize_batch_max=3, passivate_after=None)
    with anyio.fail_after(60):
        async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
            session = engine.session("s")
            await add_each(session, turns(3))
            await summarizer.wait_until_called()
            await add_each(session, turns(9, start=4))  # 2-10 pile up behind the held call
            summarizer.release()
            context = await session.context(wait_for_summary=True)
    assert all(len(call) <= 3 for call in summarizer.calls), summarizer.calls
    assert [seq for call in summarizer.calls for seq in call] == list(range(1, 11))  # in order, no gap or overlap
    assert len(summarizer.calls) == 1 + 3  # the held call, then full batches of 3
    assert covered(context.summary) == contents(range(1, 11))
    assert [e.seq for e in context.episodes] == [11, 12]
