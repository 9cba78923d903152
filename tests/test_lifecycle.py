"""Shutdown is bounded and loses nothing acknowledged; activations come and go safely."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from memengine import Engine, EngineClosedError, EngineFailedError, Episode, SessionConfig, StoreError, open_engine
from memengine.store import committer
from memengine.store.operations import GroupCommitStore

from .fakes import GatedSummarizer, RecordingSink, RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio


async def test_exit_with_a_blocked_summarizer_and_waiters_is_bounded(db_path, stored) -> None:
    summarizer = GatedSummarizer()  # never released
    errors: list[BaseException] = []

    async def waiter(session) -> None:
        try:
            await session.context(wait_for_summary=True)
        except EngineClosedError as exc:
            errors.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as outside:
            async with open_engine(
                db_path, summarizer=summarizer, config=SessionConfig(evict_to=1.0, max_episodes=2)
            ) as engine:
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
    enough = anyio.Event()

    async def writer(engine, name: str) -> None:
        session = engine.session(name)
        try:
            for i in range(1000):
                (episode,) = await session.add([Episode("user", f"{name} {i}")])
                acknowledged.setdefault(name, []).append(episode.seq)
                if sum(map(len, acknowledged.values())) >= 300:
                    enough.set()
        except EngineClosedError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as writers:
        async with open_engine(db_path, config=SessionConfig(evict_to=1.0, max_episodes=5)) as engine:
            for n in range(20):
                writers.start_soon(writer, engine, f"w{n}")
            await enough.wait()  # (a busy loop of checkpoints here starved the engine on a loaded machine)
        # The engine closed under the writers' feet.
    assert len(refused) == 20
    for name, seqs in acknowledged.items():
        stored_seqs = [seq for seq, _ in stored.episodes(name)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert stored_seqs[: len(seqs)] == seqs  # acknowledged means durable
        assert stored_seqs == list(range(1, len(stored_seqs) + 1))


async def test_thousands_of_sessions_at_once(db_path, stored) -> None:
    # Leases that outlast the test: renewing 2,000 leases of the default 10 s can fall behind on a loaded
    # machine (LeaseLostError, as seen in test_retain_delivery's 2,000 sessions), and leases are not the point.
    config = SessionConfig(evict_to=1.0, max_episodes=2, lease_ttl=3600, lease_wait=3600)
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
    config = SessionConfig(evict_to=1.0, max_episodes=4, passivate_after=0.001)
    acknowledged: dict[str, list[int]] = {}

    async def writer(engine, name: str) -> None:
        session = engine.session(name)
        for i in range(60):
            (episode,) = await session.add([Episode("user", f"{name} {i}")])
            acknowledged.setdefault(name, []).append(episode.seq)
            if i % 7 == 0:
                # Long enough for the session to passivate, once its last summary (which rides along with
                # the next write, or commits alone within SUMMARY_RIDER_SECONDS) is stored.
                await anyio.sleep(0.02 + committer.SUMMARY_RIDER_SECONDS)

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


class EngineBug(Exception):
    pass


async def test_an_engine_task_that_fails_stops_the_engine_with_one_engine_failed_error(db_path, monkeypatch) -> None:
    async def broken_sweep(self, passivate_after: float) -> None:
        await anyio.lowlevel.checkpoint()
        raise EngineBug("a bug in the engine")

    monkeypatch.setattr(Engine, "_sweep_idle_sessions", broken_sweep)
    with anyio.fail_after(60), pytest.raises(EngineFailedError) as failed:
        async with open_engine(db_path) as engine:
            await engine.session("s").add([Episode("user", "kept")])
            await anyio.sleep_forever()  # the engine's failure cancels the block
    cause = failed.value.__cause__
    assert isinstance(cause, BaseExceptionGroup)
    bugs, rest = cause.split(EngineBug)
    assert bugs is not None and rest is None  # the engine's own error, attached; nothing else
    assert "a bug in the engine" in str(failed.value)


async def test_the_callers_own_error_wins_over_an_engine_failure(db_path, monkeypatch) -> None:
    async def broken_renewals(self) -> None:
        await anyio.lowlevel.checkpoint()
        raise EngineBug("a bug in the engine")

    monkeypatch.setattr(Engine, "_renew_leases", broken_renewals)
    with pytest.raises(ValueError, match="mine"):
        async with open_engine(db_path):
            raise ValueError("mine")


async def test_a_store_error_while_opening_is_raised_as_itself(db_path, monkeypatch) -> None:
    async def failing_enqueue(self, mode, *, orphaned_only=False, batch_size=None):
        raise StoreError("disk I/O error (injected)")

    monkeypatch.setattr(GroupCommitStore, "enqueue_all_retains", failing_enqueue)
    with pytest.raises(StoreError, match="injected"):
        async with open_engine(db_path, retain_sink=RecordingSink()):
            pass


async def test_an_add_is_answered_even_if_its_follow_ups_meet_a_closing_store(db_path, monkeypatch) -> None:
    """Recording a due retain batch after an append may find the store closing: the add is still answered."""

    def closing(*args, **kwargs) -> None:
        raise EngineClosedError("the store is closed")

    async with open_engine(db_path, retain_sink=RecordingSink(), config=SessionConfig(retain_every=1)) as engine:
        monkeypatch.setattr(engine.store, "submit_retain", closing)
        with anyio.fail_after(60):
            (stored,) = await engine.session("s").add([Episode("user", "answered")])
        assert stored.seq == 1
