"""Idle sessions passivate (their state is durable) and come back on the next message."""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import virtual_time_backends
from .fakes import GatedSummarizer, RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio

anyio_backend = virtual_time_backends()


async def wait_until_passivated(engine, session_id: str, idle: float) -> None:
    with anyio.fail_after(idle * 50):
        while engine.is_active(session_id):  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(idle / 10)


@pytest.fixture
def idle(anyio_backend) -> float:
    return 300.0 if anyio_backend != "asyncio" else 0.05


def lease_settings(idle: float) -> dict[str, float]:
    """Leases renewed a few times per idle period, not every few seconds: under the MockClock each
    wake-up costs real time (its autojump threshold), and these tests wait out several idle periods."""
    return {"lease_ttl": idle * 10, "lease_wait": idle * 12}


async def test_idle_session_passivates_and_recovers(db_path, idle) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=3, passivate_after=idle, **lease_settings(idle))
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(6))
        before = await session.context(wait_for_summary=True)
        assert engine.is_active("s")
        await wait_until_passivated(engine, "s", idle)
        after = await session.context()  # the same handle reactivates it
        assert engine.is_active("s")
        assert after == before
        (episode,) = await session.add([Episode("user", "after passivation")])
        assert episode.seq == 7


async def test_no_passivation_while_a_summary_is_in_flight(db_path, idle) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(evict_to=1.0, max_episodes=2, passivate_after=idle, **lease_settings(idle))
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))
        await summarizer.wait_until_called()
        await anyio.sleep(idle * 3)
        assert engine.is_active("s")
        summarizer.release()
        await wait_until_passivated(engine, "s", idle)
        context = await session.context()
        assert covered(context.summary) == ["turn 1"]
