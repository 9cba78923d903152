"""Shutdown is bounded and loses nothing acknowledged; activations come and go safely."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from memengine import Engine, EngineClosedError, Episode, SessionConfig, open_engine

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


async def test_messages_racing_passivation_keep_order(db_path, stored, monkeypatch) -> None:
    """Sessions passivating constantly under load: one activation at a time, no lost or reordered add."""
    config = SessionConfig(max_episodes=4, passivate_after=0.001)
    acknowledged: dict[str, list[int]] = {}

    async def writer(engine, name: str) -> None:
        session = engine.session(name)
        for i in range(60):
            (episode,) = await session.add([Episode("user", f"{name} {i}")])
            acknowledged.setdefault(name, []).append(episode.seq)
            if i % 7 == 0:
                await anyio.sleep(0.02)  # long enough for the session to passivate

    activations = 0
    activate = Engine._activate

    def counting_activate(engine, session_id):
        nonlocal activations
        activations += 1
        return activate(engine, session_id)

    monkeypatch.setattr(Engine, "_activate", counting_activate)
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        async with anyio.create_task_group() as writers:
            for n in range(6):
                writers.start_soon(writer, engine, f"w{n % 3}")
    assert activations > 6  # the sessions really did passivate and come back, several times
    for name, seqs in acknowledged.items():
        assert sorted(seqs) == list(range(1, 121))
        assert [seq for seq, _ in stored.episodes(name)] == list(range(1, 121))
