"""A child process for the foreign-caller tests: every public call of the engine, from another thread's event loop.

Usage: python -m tests.foreign_loop_worker ENGINE_BACKEND CALLER_BACKEND DB_PATH [agents]

The engine runs on ENGINE_BACKEND in a thread of its own (behind a blocking
portal, as users run it); one session is given an episode through the portal.
Then this process's main thread runs an event loop of its own (CALLER_BACKEND)
and makes every public call of the engine and of a session handle directly,
not through the portal. With ``agents``, it instead runs the OpenAI Agents
SDK's ``Runner.run_sync`` with a ``MemEngineSession`` given no portal.

It prints one JSON line: each call's outcome, the name of the exception it
raised (with ``"message"`` the first such message), ``"returned"``, or
``"hung"`` when it was given up after :data:`GIVE_UP` seconds. The test runs
it with a timeout, so a hang of the whole process fails the test too. It then
leaves at once (``os._exit``): an engine that was called wrongly may not stop.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.from_thread import start_blocking_portal

from memengine import Episode, open_engine

#: A call that has not returned after this long is hung (it takes milliseconds when it works).
GIVE_UP = 20.0


def calls(engine: Any) -> dict[str, Callable[[], Awaitable[object]]]:
    session = engine.session("seeded")

    async def export() -> object:
        return [record async for record in engine.export(session_id="seeded")]

    return {
        "Session.add": lambda: session.add([Episode("user", "from another loop")]),
        "Session.add (nothing)": lambda: session.add([]),
        "Session.context": lambda: session.context(),
        "Session.delete_episodes": lambda: session.delete_episodes([1]),
        "Session.clear": lambda: session.clear(),
        "Engine.recall": lambda: engine.recall("seeded", session_id="seeded"),
        "Engine.forget": lambda: engine.forget(session_id="seeded", dry_run=True),
        "Engine.export": export,
        "Engine.stats": lambda: engine.stats(),
        "Engine.retain_metrics": lambda: engine.retain_metrics(),
        "Engine.list_set_aside": lambda: engine.list_set_aside(),
        "Engine.retry_set_aside": lambda: engine.retry_set_aside(),
        "Engine.discard_set_aside": lambda: engine.discard_set_aside(),
        "Session.close": lambda: session.close(),
    }


async def outcome_of(call: Callable[[], Awaitable[object]], report: dict[str, Any]) -> str:
    with anyio.move_on_after(GIVE_UP):
        try:
            await call()
        except Exception as exc:
            report.setdefault("message", str(exc))
            return type(exc).__name__
        return "returned"
    return "hung"


async def call_everything(engine: Any) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for name, call in calls(engine).items():
        report[name] = await outcome_of(call, report)
    return report


def run_agent(engine: Any) -> dict[str, Any]:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message

    from memengine.integrations.openai_agents import MemEngineSession

    set_tracing_disabled(True)
    model = ScriptedModel()
    model.enqueue([assistant_message("hello")])
    agent = Agent(name="assistant", model=model)
    session = MemEngineSession(engine, "agent")
    report: dict[str, Any] = {"Runner.run_sync": "hung"}

    def run() -> None:  # Runner.run_sync runs an asyncio loop of its own, here in a thread: a bounded wait
        try:
            Runner.run_sync(agent, "hi", session=session)
        except Exception as exc:
            report["Runner.run_sync"] = type(exc).__name__
            report["message"] = str(exc)
        else:
            report["Runner.run_sync"] = "returned"

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(GIVE_UP)
    return report


def main(engine_backend: str, caller_backend: str, db_path: str, agents: bool) -> dict[str, Any]:
    with (
        start_blocking_portal(engine_backend) as portal,
        portal.wrap_async_context_manager(open_engine(db_path)) as engine,
    ):
        portal.call(engine.session("seeded").add, [Episode("user", "seeded on the engine's loop")])
        if agents:
            report = run_agent(engine)
        else:
            report = anyio.run(call_everything, engine, backend=caller_backend)
        # The engine still serves its own loop's calls afterwards.
        context = portal.call(engine.session("seeded").context)
        report["afterwards"] = [episode.content for episode in context.episodes]
        return report


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] == ["agents"])
    print(json.dumps(result), flush=True)
    os._exit(0)
