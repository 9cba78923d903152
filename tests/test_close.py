"""Closed is closed: the handle refuses every call, even after a cancelled close."""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionClosedError, open_engine

pytestmark = pytest.mark.anyio


async def _assert_refuses_everything(session) -> None:
    with pytest.raises(SessionClosedError):
        await session.add([Episode("user", "x")])
    with pytest.raises(SessionClosedError):
        await session.context()
    with pytest.raises(SessionClosedError):
        await session.context(wait_for_summary=True)
    with pytest.raises(SessionClosedError):
        await session.delete_episodes([1])
    with pytest.raises(SessionClosedError):
        await session.clear()


async def test_closed_handle_refuses_every_call(db_path, stored) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "before close")])
        await session.close()
        assert session.closed
        await _assert_refuses_everything(session)
        await session.close()  # closing twice is fine
        # The session itself survives; a new handle works.
        fresh = engine.session("s")
        (episode,) = await fresh.add([Episode("user", "after close")])
        assert episode.seq == 2
    assert [c for _, c in stored.episodes("s")] == ["before close", "after close"]


async def test_close_cancelled_before_it_starts_still_closes(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "x")])
        with anyio.CancelScope() as scope:
            scope.cancel()
            await session.close()
        assert scope.cancelled_caught
        assert session.closed
        await _assert_refuses_everything(session)


async def test_close_cancelled_while_waiting_still_closes(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.close)
            tasks.cancel_scope.cancel()
        assert session.closed
        await _assert_refuses_everything(session)


async def test_close_lets_the_activation_go(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "x")])
        assert engine.is_active("s")
        await session.close()
        await anyio.wait_all_tasks_blocked()
        assert not engine.is_active("s")


async def test_other_handles_stay_open(db_path) -> None:
    async with open_engine(db_path) as engine:
        first, second = engine.session("s"), engine.session("s")
        await first.close()
        (episode,) = await second.add([Episode("user", "still open")])
        assert episode.seq == 1
