"""Clear and delete leave nothing derived behind, in memory or in the store."""

from __future__ import annotations

import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import GatedSummarizer, RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio

SMALL_WINDOW = SessionConfig(evict_to=1.0, max_episodes=3)


async def test_clear_removes_everything_from_memory_and_store(db_path, stored) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(8, prefix="secret"))
        await session.context(wait_for_summary=True)
        assert stored.summaries("s")
        await session.clear()
        context = await session.context()
        assert (context.summary, context.summarized_through, context.episodes) == (None, 0, ())
        assert stored.episodes("s") == []
        assert stored.summaries("s") == []
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        context = await engine.session("s").context()
        assert (context.summary, context.episodes) == (None, ())


async def test_summary_in_flight_at_clear_never_lands(db_path, stored) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(6, prefix="secret"))
        await summarizer.wait_until_called()
        await session.clear()
        # The old call is abandoned; new episodes are summarized from scratch.
        await add_each(session, turns(5, prefix="fresh"))
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["fresh 1", "fresh 2"]
    everything = " ".join(summary for _, summary in stored.summaries("s"))
    assert "secret" not in everything
    assert [content for _, content in stored.episodes("s")] == [f"fresh {i}" for i in range(1, 6)]


async def test_stale_summary_is_refused_by_the_store_itself(db_path, stored) -> None:
    """Even a worker that ignores cancellation cannot store a summary of cleared text."""
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(2, prefix="secret"))
        before = await engine.store.load_session("s")
        await session.clear()
        token = engine._actors["s"].token  # the live lease: only the generation is stale
        refused = await engine.store.store_summary("s", token, before.generation, 2, "secret 1|secret 2")
        assert refused is False
    assert stored.summaries("s") == []


async def test_seqs_are_never_reused_after_clear(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))
        await session.clear()
        (episode,) = await session.add([Episode("user", "after clear")])
        assert episode.seq == 4
    async with open_engine(db_path) as engine:
        (episode,) = await engine.session("s").add([Episode("user", "after restart")])
        assert episode.seq == 5


async def test_delete_drops_covering_summaries_and_resummarizes(db_path, stored) -> None:
    summarizer = RecordingSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(10))
        await session.context(wait_for_summary=True)
        assert stored.summaries("s")[-1][0] == 7
        assert await session.delete_episodes([5, 9]) == 2
        context = await session.context(wait_for_summary=True)
        live = [f"turn {i}" for i in (1, 2, 3, 4, 6, 7, 8, 10)]
        assert covered(context.summary) + [e.content for e in context.episodes] == live
        # Evicted stays evicted (the boundary, through 7, is stored): the window does not refill from below.
        assert [e.seq for e in context.episodes] == [8, 10]
    for through, summary in stored.summaries("s"):
        assert "turn 5" not in summary.split("|"), (through, summary)
        assert "turn 9" not in summary.split("|"), (through, summary)
    assert [seq for seq, _ in stored.episodes("s")] == [1, 2, 3, 4, 6, 7, 8, 10]


async def test_delete_while_a_summary_of_it_is_in_flight(db_path, stored) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(4))  # evicts turn 1
        await summarizer.wait_until_called()
        assert await session.delete_episodes([1]) == 1
        summarizer.release()
        await add_each(session, turns(2, start=5))
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 2", "turn 3"]
    assert all("turn 1" not in summary.split("|") for _, summary in stored.summaries("s"))


async def test_delete_reports_only_what_existed(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))
        assert await session.delete_episodes([2, 2, 99]) == 1
        assert await session.delete_episodes([2]) == 0
        assert await session.delete_episodes([]) == 0
        with pytest.raises(TypeError):
            await session.delete_episodes(["1"])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            await session.delete_episodes(3)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await session.delete_episodes([0])
        assert [e.seq for e in (await session.context()).episodes] == [1, 3]


async def test_deleted_id_can_be_added_again(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        episode = Episode("user", "oops")
        (first,) = await session.add([episode])
        await session.delete_episodes([first.seq])
        (again,) = await session.add([episode])
        assert again.seq == 2


async def test_seventy_thousand_seqs_are_deleted_in_one_call_on_every_store(store_url, rows) -> None:
    """More seqs than a driver can bind in one statement: deleted at once, duplicates counted once."""
    keep_everything_raw = SessionConfig(evict_to=1.0, max_episodes=100_000, max_chars=10**9)
    async with open_engine(store_url, config=keep_everything_raw) as engine:
        session = engine.session("s")
        await session.add([Episode("user", f"turn {n}") for n in range(1, 1_501)])
        # 1..1400 and 1501..70000 (never stored), then 1..1000 again: 70,900 seqs.
        seqs = [*range(1, 1_401), *range(1_501, 70_001), *range(1, 1_001)]
        assert await session.delete_episodes(seqs) == 1_400
        assert [e.seq for e in (await session.context()).episodes] == list(range(1_401, 1_501))
    assert rows.query("SELECT min(seq), max(seq), count(*) FROM episodes WHERE session_id = ?", "s") == [
        (1_401, 1_500, 100)
    ]
