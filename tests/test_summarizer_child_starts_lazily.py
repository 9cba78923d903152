"""A session's summarizer child runs only once the session has something to summarize.

Most activations never summarize (a short conversation; a session read and
let go). Their child held a task, a mailbox waiter and a cancel scope all the
same: a quarter of what each active session kept alive, and so of what every
garbage collection walked with thousands of sessions active. The child now
starts with its first batch, under the session's task group as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.summarizer.actor import SummarizerActor

from .fakes import RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

GUARD = 30.0  # seconds: generous, for a loaded machine


def summarizer_tasks() -> int:
    return sum(1 for task in anyio.get_running_tasks() if (task.name or "").endswith("SummarizerActor.run"))


async def test_sessions_that_never_summarize_run_no_summarizer_task(db_path) -> None:
    config = SessionConfig(max_episodes=3, evict_to=1, passivate_after=None)
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            for n in range(20):
                await engine.session(f"s{n}").add([Episode("user", f"hello {n}")])
            assert engine.active_sessions == 20
            assert summarizer_tasks() == 0
            busy = engine.session("s0")
            await busy.add([Episode("user", f"turn {turn}") for turn in range(2, 5)])
            context = await busy.context(wait_for_summary=True)  # the child started, summarized, stored
            assert covered(context.summary) == ["hello 0"]
            assert summarizer_tasks() == 1


async def test_the_summarizer_sees_the_context_variables_of_the_session(db_path) -> None:
    """The child starts from whatever submits its first batch (a store callback, often): in the session's context."""
    tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
    seen: list[str | None] = []

    class Seeing(RecordingSummarizer):
        async def summarize(self, previous, episodes):  # type: ignore[no-untyped-def]
            seen.append(tenant.get())
            return await super().summarize(previous, episodes)

    config = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None)
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=Seeing(), config=config) as engine:
            tenant.set("acme")
            session = engine.session("s")
            for turn in range(1, 5):
                await session.add([Episode("user", f"turn {turn}")])
            await session.context(wait_for_summary=True)
    assert seen and set(seen) == {"acme"}


async def test_a_batch_submitted_after_the_session_stopped_starts_nothing_and_logs_no_error(
    db_path, caplog, monkeypatch
) -> None:
    """An evicting add whose commit completes after the session's task group exited (the engine closing).

    Its summary batch has no task group to start in: it starts nothing (the
    next activation summarizes), and nothing fails in the commit's callback.
    """
    config = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None)
    in_commit, release = threading.Event(), threading.Event()
    stop_starting = SummarizerActor.stop_starting

    def released_when_stopped(child: SummarizerActor) -> None:
        stop_starting(child)
        release.set()  # the session's task group has exited: now let the add commit

    monkeypatch.setattr(SummarizerActor, "stop_starting", released_when_stopped)
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            session = engine.session("s")
            for turn in range(1, 3):
                await session.add([Episode("user", f"turn {turn}")])
            commit = engine.store._commit_in_thread  # type: ignore[attr-defined]

            def held(batch):  # type: ignore[no-untyped-def]
                in_commit.set()
                release.wait(GUARD)
                return commit(batch)

            engine.store._commit_in_thread = held  # type: ignore[attr-defined]

            async def evicting_add() -> None:
                with contextlib.suppress(BaseException):
                    await session.add([Episode("user", "turn 3")])  # evicts: a summary batch once committed

            engine._tasks.start_soon(evicting_add)  # type: ignore[attr-defined]
            assert await anyio.to_thread.run_sync(in_commit.wait, GUARD)
        # Leaving: the session stops (its task group exits), then the store commits the add.
    assert release.is_set()
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == []
