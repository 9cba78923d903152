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
from memengine.store.journal import KEPT_SUMMARIES, kept_summaries

from .conftest import StoreRows
from .fakes import RecordingSummarizer, covered, turns

pytestmark = pytest.mark.anyio


@given(st.sets(st.integers(1, 10**6), max_size=300))
def test_the_kept_summaries_are_few_the_newest_first_and_ever_sparser(through_seqs: set[int]) -> None:
    kept = kept_summaries(sorted(through_seqs))
    assert len(kept) <= KEPT_SUMMARIES
    assert set(kept) <= through_seqs
    if through_seqs:
        ordered = sorted(through_seqs, reverse=True)
        assert kept[: min(2, len(ordered))] == ordered[:2]
        newest = kept[0]
        gaps = [newest - seq for seq in kept[1:]]
        assert all(later >= 2 * earlier for earlier, later in itertools.pairwise(gaps))


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
        assert count <= KEPT_SUMMARIES
        # A delete in the middle falls back on an older kept summary; nothing is lost or shown twice.
        assert await session.delete_episodes([300]) == 1
        context = await session.context(wait_for_summary=True)
        expected = [f"turn {i}" for i in range(1, 401) if i != 300]
        assert covered(context.summary) + [e.content for e in context.episodes] == expected
    (count,) = rows.query("SELECT count(*) FROM summaries WHERE session_id = 's'")[0]
    assert count <= KEPT_SUMMARIES
