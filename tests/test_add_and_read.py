"""add, context, idempotency, and the no-gap/no-overlap rule."""

from __future__ import annotations

import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio


async def test_add_assigns_dense_seqs_and_stores_rows(db_path, stored) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("alice/chat-1")
        first = await session.add([Episode("user", "I moved to Lisbon"), Episode("assistant", "Nice!")])
        second = await session.add([Episode("user", "It is sunny", metadata={"mood": "happy"})])
        assert [e.seq for e in first + second] == [1, 2, 3]
        # Committed when add returned: visible to another connection right now.
        assert stored.episodes("alice/chat-1") == [(1, "I moved to Lisbon"), (2, "Nice!"), (3, "It is sunny")]
        context = await session.context()
        assert [e.content for e in context.episodes] == ["I moved to Lisbon", "Nice!", "It is sunny"]
        assert context.episodes[2].metadata == {"mood": "happy"}
        assert context.summary is None and context.summarized_through == 0


async def test_add_is_idempotent_per_episode_id(db_path, stored) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        hello = Episode("user", "hello")
        (first,) = await session.add([hello])
        again = await session.add([hello, Episode("user", "world"), hello])
        assert [e.seq for e in again] == [1, 2, 1]
        assert again[0] == first
        assert stored.episodes("s") == [(1, "hello"), (2, "world")]
        assert [e.seq for e in (await session.context()).episodes] == [1, 2]


async def test_ids_are_scoped_per_session(db_path, stored) -> None:
    async with open_engine(db_path) as engine:
        shared = Episode("user", "same id, two sessions")
        await engine.session("a").add([shared])
        (in_b,) = await engine.session("b").add([shared])
        assert in_b.seq == 1
        assert stored.episodes("a") == stored.episodes("b") == [(1, "same id, two sessions")]


async def test_rejected_add_stores_nothing(db_path, stored) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "kept")])
        with pytest.raises(TypeError):
            await session.add([Episode("user", "never stored"), "not an episode"])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            await session.add(Episode("user", "a bare episode, not a list"))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await session.add("text")  # type: ignore[arg-type]
        assert await session.add([]) == ()
        assert stored.episodes("s") == [(1, "kept")]
        assert [e.content for e in (await session.context()).episodes] == ["kept"]


async def test_round_trip_is_exact(store_url) -> None:
    tricky = Episode(
        "user",
        "control \x01\x1f, emoji 🧠, RTL שלום, newline\nend",  # NUL is refused in text (PostgreSQL cannot store it)
        metadata={"nested": {"list": [1, 2.5, None, True]}, "ünïcode": "✓", "NUL \x00": "\x00 in JSON is an escape"},
    )
    async with open_engine(store_url) as engine:
        await engine.session("s").add([tricky])
    async with open_engine(store_url) as engine:
        (restored,) = (await engine.session("s").context()).episodes
    assert (restored.id, restored.role, restored.content, restored.created_at, restored.metadata) == (
        tricky.id,
        tricky.role,
        tricky.content,
        tricky.created_at,
        tricky.metadata,
    )


@pytest.mark.parametrize(("max_episodes", "max_chars"), [(3, 10_000), (50, 40), (4, 33)])
async def test_no_gap_no_overlap(db_path, max_episodes: int, max_chars: int) -> None:
    """Summary contents + raw contents are exactly the live episodes, in order, at every read."""
    config = SessionConfig(evict_to=1.0, max_episodes=max_episodes, max_chars=max_chars)
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        expected: list[str] = []
        for episode in turns(30):
            await session.add([episode])
            expected.append(episode.content)
            for wait in (False, True):
                context = await session.context(wait_for_summary=wait)
                assert covered(context.summary) + [e.content for e in context.episodes] == expected
                raw_seqs = [e.seq for e in context.episodes]
                assert all(seq > context.summarized_through for seq in raw_seqs)
                assert raw_seqs == sorted(raw_seqs)
                assert context.summarized_through <= context.evicted_through
        window = (await session.context(wait_for_summary=True)).episodes
        assert len(window) <= max_episodes
        assert sum(len(e.content) for e in window) <= max_chars


async def test_reads_of_an_active_session_do_not_touch_the_store(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))

        async def broken(*args, **kwargs):
            raise AssertionError("the store was consulted for a read")

        engine.store.load_session = broken  # type: ignore[method-assign]
        context = await session.context()
        assert [e.seq for e in context.episodes] == [1, 2, 3]


async def test_size_limits_are_configurable_and_refuse_the_whole_add(db_path, stored) -> None:
    config = SessionConfig(max_content_chars=50, max_metadata_bytes=40)
    async with open_engine(db_path, config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "x" * 50, metadata={"k": "v" * 20})])
        with pytest.raises(ValueError, match="max_content_chars=50"):
            await session.add([Episode("user", "fits"), Episode("user", "y" * 51)])
        with pytest.raises(ValueError, match="max_metadata_bytes=40"):
            await session.add([Episode("user", "fits", metadata={"k": "é" * 20})])  # 40 chars, more bytes
    assert stored.episodes("s") == [(1, "x" * 50)]
