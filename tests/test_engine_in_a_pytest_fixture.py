"""Holding an engine in a pytest fixture: the two patterns the README's Testing section shows, used as shown.

``open_engine`` owns a task group, whose cancel scope must be left by the task
that entered it. A plugin that runs an async generator fixture's setup and
teardown in two different tasks (pytest-asyncio does) fails at teardown with
"Attempted to exit cancel scope in a different task". anyio's pytest plugin
(it comes with anyio, which memengine depends on) runs a fixture and its test
in one task: the first pattern. The second works with any test runner, and
with tests on event loops of their own: the engine runs in a thread of its
own behind a blocking portal, held by a plain (sync) fixture.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from memengine import Engine, Episode, open_engine

# --- 1. anyio's pytest plugin: an async fixture, tests marked anyio (on asyncio and trio here) ---


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with open_engine(tmp_path / "memory.db") as engine:
        yield engine


@pytest.mark.anyio
async def test_a_test_uses_the_engine_its_async_fixture_opened(engine: Engine) -> None:
    session = engine.session("alice")
    await session.add([Episode("user", "hello"), Episode("assistant", "hi!")])

    context = await session.context()

    assert [episode.content for episode in context.episodes] == ["hello", "hi!"]


@pytest.mark.anyio
async def test_every_test_gets_an_engine_of_its_own(engine: Engine) -> None:
    assert (await engine.session("alice").context()).episodes == ()


# --- 2. Any runner: the engine in a thread of its own, behind a portal, held by a sync fixture ---


@pytest.fixture
def engine_in_a_thread(tmp_path: Path) -> Iterator[tuple[Engine, BlockingPortal]]:
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(open_engine(tmp_path / "memory.db")) as engine,
    ):
        yield engine, portal


def test_a_sync_test_calls_the_engine_through_the_portal(engine_in_a_thread: tuple[Engine, BlockingPortal]) -> None:
    engine, portal = engine_in_a_thread
    session = engine.session("alice")
    portal.call(session.add, [Episode("user", "hello")])

    context = portal.call(session.context)

    assert [episode.content for episode in context.episodes] == ["hello"]


def test_an_agent_on_an_event_loop_of_its_own_uses_the_session_through_the_portal(
    engine_in_a_thread: tuple[Engine, BlockingPortal],
) -> None:
    # What a pytest-asyncio test does: it runs on a loop that is not the engine's.
    pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed")
    from agents import Agent, Runner, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message

    from memengine.integrations.openai_agents import MemEngineSession

    set_tracing_disabled(True)
    engine, portal = engine_in_a_thread
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)

    async def the_test() -> list[object]:
        session = MemEngineSession(engine, "alice", portal=portal)
        for reply in ["Hi!", "You said hello."]:
            model.enqueue([assistant_message(reply)])
            await Runner.run(agent, "hello", session=session)
        return [item.get("role") for item in await session.get_items()]

    assert asyncio.run(the_test()) == ["user", "assistant", "user", "assistant"]
