"""Shutdown is bounded and loses nothing acknowledged; sessions passivate and come back."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from trio.testing import MockClock

from memengine import EngineClosedError, Episode, SessionConfig, open_engine

from .fakes import GatedSummarizer, RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio


async def test_exit_with_a_blocked_summarizer_and_waiters_is_bounded(db_path, stored) -> None:
    summarizer = GatedSummarizer()  # never released
    errors: list[BaseException] = []

    async def waiter(session) -> None:
        try:
            await session.context(wait_for_summary=True)
        except EngineClosedError as exc:
            errors.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as outside:
            async with open_engine(db_path, summarizer=summarizer, config=SessionConfig(max_episodes=2)) as engine:
                session = engine.session("s")
                await add_each(session, turns(5))
                await summarizer.wait_until_called()
                outside.start_soon(waiter, session)
                outside.start_soon(waiter, session)
                await anyio.wait_all_tasks_blocked()
    assert len(errors) == 2
    assert [seq for seq, _ in stored.episodes("s")] == [1, 2, 3, 4, 5]
    with pytest.raises(EngineClosedError):
        await session.add([Episode("user", "too late")])
    with pytest.raises(EngineClosedError):
        await session.context()
    await session.close()  # closing after the engine is gone is quiet


async def test_every_acknowledged_add_survives_a_shutdown_in_the_middle(db_path, stored) -> None:
    acknowledged: dict[str, list[int]] = {}
    refused: list[EngineClosedError] = []

    async def writer(engine, name: str) -> None:
        session = engine.session(name)
        try:
            for i in range(1000):
                (episode,) = await session.add([Episode("user", f"{name} {i}")])
                acknowledged.setdefault(name, []).append(episode.seq)
        except EngineClosedError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as writers:
        async with open_engine(db_path, config=SessionConfig(max_episodes=5)) as engine:
            for n in range(20):
                writers.start_soon(writer, engine, f"w{n}")
            while sum(map(len, acknowledged.values())) < 300:
                await anyio.lowlevel.checkpoint()
        # The engine closed under the writers' feet.
    assert len(refused) == 20
    for name, seqs in acknowledged.items():
        stored_seqs = [seq for seq, _ in stored.episodes(name)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert stored_seqs[: len(seqs)] == seqs  # acknowledged means durable
        assert stored_seqs == list(range(1, len(stored_seqs) + 1))


async def test_thousands_of_sessions_at_once(db_path, stored) -> None:
    config = SessionConfig(max_episodes=2)
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        async with anyio.create_task_group() as tasks:
            for n in range(2000):
                tasks.start_soon(add_each, engine.session(f"user-{n}"), turns(3))
        assert engine.active_sessions == 2000
        context = await engine.session("user-1999").context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1"]
    assert stored.query("SELECT count(*), count(DISTINCT session_id) FROM episodes") == [(6000, 2000)]


class TestPassivation:
    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest):
        if request.param == "trio":
            return ("trio", {"clock": MockClock(autojump_threshold=0)})
        return "asyncio"

    @pytest.fixture
    def idle(self, anyio_backend) -> float:
        return 300.0 if anyio_backend != "asyncio" else 0.05

    async def test_idle_session_passivates_and_recovers(self, db_path, idle) -> None:
        config = SessionConfig(max_episodes=3, passivate_after=idle)
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            session = engine.session("s")
            await add_each(session, turns(6))
            before = await session.context(wait_for_summary=True)
            assert engine.is_active("s")
            await anyio.sleep(idle * 1.5)
            assert not engine.is_active("s")
            after = await session.context()  # the same handle reactivates it
            assert engine.is_active("s")
            assert after == before
            (episode,) = await session.add([Episode("user", "after passivation")])
            assert episode.seq == 7

    async def test_no_passivation_while_a_summary_is_in_flight(self, db_path, idle) -> None:
        summarizer = GatedSummarizer()
        config = SessionConfig(max_episodes=2, passivate_after=idle)
        async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
            session = engine.session("s")
            await add_each(session, turns(3))
            await summarizer.wait_until_called()
            await anyio.sleep(idle * 3)
            assert engine.is_active("s")
            summarizer.release()
            await anyio.sleep(idle * 3)
            assert not engine.is_active("s")
            context = await session.context()
            assert covered(context.summary) == ["turn 1"]

    async def test_messages_racing_passivation_keep_order(self, db_path, stored, anyio_backend) -> None:
        """Sessions passivating constantly under load: one activation at a time, no lost or reordered add."""
        config = SessionConfig(max_episodes=4, passivate_after=1e-6)
        acknowledged: dict[str, list[int]] = {}

        async def writer(engine, name: str) -> None:
            session = engine.session(name)
            for i in range(60):
                (episode,) = await session.add([Episode("user", f"{name} {i}")])
                acknowledged.setdefault(name, []).append(episode.seq)
                if i % 7 == 0:
                    await anyio.sleep(0.001)

        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            async with anyio.create_task_group() as writers:
                for n in range(6):
                    writers.start_soon(writer, engine, f"w{n % 3}")
        for name, seqs in acknowledged.items():
            assert sorted(seqs) == list(range(1, 121))
            assert [seq for seq, _ in stored.episodes(name)] == list(range(1, 121))
