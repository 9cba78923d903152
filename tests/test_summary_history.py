"""Summary history is bounded: the newest summary, and a thinned few older ones a delete can fall back on.

Every rolling summary used to be kept for good (400 turns left 392 summary rows
for one session) though only the newest is read. Older ones matter only to a
delete, which drops every summary that covered a deleted episode and
re-summarizes from the newest one before it.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memengine import SessionConfig, open_engine
from memengine.store.journal import kept_summaries, most_kept

from .conftest import StoreRows
from .fakes import RecordingSummarizer, covered, turns

pytestmark = pytest.mark.anyio


def thinned_as_stored(through_seqs: list[int]) -> list[int]:
    """What a session keeps after storing these summaries one by one (the store thins after each)."""
    kept: list[int] = []
    for through_seq in through_seqs:
        kept = kept_summaries([*kept, through_seq])
    return kept


def fallback(kept: list[int], deleted: int) -> int:
    """The summary a delete of seq ``deleted`` falls back on: the newest kept one before it (0: none)."""
    return max([seq for seq in kept if seq < deleted], default=0)


@given(st.lists(st.integers(1, 400), min_size=1, max_size=400))
def test_a_delete_anywhere_falls_back_on_a_summary_a_few_times_as_far_back_as_it_is(gaps: list[int]) -> None:
    """Summaries stored one by one (``gaps`` apart): whatever was dropped, every point keeps a fallback near it.

    A delete of an episode ``d`` back from the newest summary re-summarizes from
    the fallback; that costs at most about five times ``d``, plus the spacing of
    the summaries (nothing can be nearer than the newest one stored before ``d``).
    """
    stored = list(itertools.accumulate(gaps))
    kept = thinned_as_stored(stored)
    newest = stored[-1]
    assert kept[0] == newest and set(kept) <= set(stored)
    assert kept[: min(2, len(stored))] == sorted(stored, reverse=True)[:2]  # the newest two, always
    assert len(kept) <= most_kept(newest)
    for deleted in [1, *[seq + 1 for seq in stored[:-1]]]:  # (where the best fallback moves)
        best = fallback(stored, deleted)  # had every summary been kept
        distance = newest - best
        assert newest - fallback(kept, deleted) <= 5 * distance + max(gaps), (deleted, best, kept)


def test_a_long_session_of_regular_summaries_keeps_fallbacks_in_its_first_half() -> None:
    kept = thinned_as_stored(list(range(200, 20_001, 200)))  # 20,000 episodes, a summary every 200
    assert fallback(kept, 10_000) >= 5_000
    assert fallback(kept, 18_000) >= 15_000
    assert len(kept) <= most_kept(20_000)


@given(st.sets(st.integers(1, 10**6), max_size=300))
def test_the_kept_summaries_are_few_and_the_newest_two_among_them(through_seqs: set[int]) -> None:
    kept = kept_summaries(sorted(through_seqs))
    assert set(kept) <= through_seqs
    assert kept == sorted(kept, reverse=True)
    if through_seqs:
        assert len(kept) <= most_kept(max(through_seqs))
        assert kept[: min(2, len(through_seqs))] == sorted(through_seqs, reverse=True)[:2]


async def test_a_long_session_keeps_a_bounded_summary_history_and_deletes_still_fall_back(
    store_url: str, rows: StoreRows
) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=3, passivate_after=None)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        for turn in turns(400):
            await session.add([turn])
            await session.context(wait_for_summary=True)  # one summary per turn: the worst case
        (count,) = rows.query("SELECT count(*) FROM summaries WHERE session_id = 's'")[0]
        assert count <= most_kept(400)
        # A delete in the middle falls back on an older kept summary; nothing is lost or shown twice.
        assert await session.delete_episodes([300]) == 1
        context = await session.context(wait_for_summary=True)
        expected = [f"turn {i}" for i in range(1, 401) if i != 300]
        assert covered(context.summary) + [e.content for e in context.episodes] == expected
    (count,) = rows.query("SELECT count(*) FROM summaries WHERE session_id = 's'")[0]
    assert count <= most_kept(400)
