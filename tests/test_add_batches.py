"""Adds that queue behind a session's append in flight are stored together, in order, each answered with its own.

Many writers on one session: an append waits for the one before it (its seqs
follow), and the adds queued meanwhile go to the store as one append. What
users see must be exactly what one add at a time gives: each caller gets the
episodes it sent with their seqs, seqs dense in arrival order, an id repeated
across two queued adds stored once, and no add overtakes a clear or delete
queued before it. Adds join across a queued read, which is then answered at its
turn as of before them, without waiting for their commit (they were all
unacknowledged when it was sent).

The append in flight is held by blocking the store's worker thread inside its
``INSERT`` (SQLite's trace callback), so what queues behind it is certain.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(max_episodes=1000, passivate_after=None)


class HeldInsert:
    """Blocks the store's thread at the next episode ``INSERT`` until :meth:`release`; records every statement."""

    def __init__(self, statements: list[str]) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.armed = False
        self.statements = statements

    def __call__(self, statement: str) -> None:
        self.statements.append(statement)
        if self.armed and statement.startswith("INSERT INTO episodes"):
            self.armed = False
            self.entered.set()
            assert self.released.wait(10), "the held insert was never released"


@asynccontextmanager
async def one_append_held(engine: Any, first: Callable[[], Awaitable[object]], statements: list[str] | None = None):
    """Run ``first`` (an add) and hold its commit; yield a task group to queue more behind it.

    The statements the store runs meanwhile go to ``statements``.
    """
    held = HeldInsert([] if statements is None else statements)
    engine.store._conn.set_trace_callback(held)
    try:
        async with anyio.create_task_group() as tasks:
            held.armed = True
            tasks.start_soon(first)
            assert await anyio.to_thread.run_sync(held.entered.wait, 10)
            yield tasks
            await anyio.wait_all_tasks_blocked()  # everything queued is in the mailbox
            held.released.set()
    finally:
        held.released.set()
        engine.store._conn.set_trace_callback(None)


async def queue(tasks: anyio.abc.TaskGroup, call: Callable[[], Awaitable[object]]) -> None:
    """Start ``call`` and return once it waits in the session's mailbox (so the next one queues behind it)."""
    tasks.start_soon(call)
    await anyio.wait_all_tasks_blocked()


async def test_adds_queued_behind_an_append_each_get_their_own_episodes(db_path, stored) -> None:
    answers: dict[str, list[tuple[int | None, str]]] = {}

    def add(session: Any, name: str, count: int) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            added = await session.add([Episode("user", f"{name} {n}") for n in range(count)])
            answers[name] = [(episode.seq, episode.content) for episode in added]

        return call

    with anyio.fail_after(20):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            await session.add([Episode("user", "first")])
            async with one_append_held(engine, add(session, "held", 1)) as tasks:
                for name, count in (("a", 2), ("b", 1), ("c", 3)):
                    await queue(tasks, add(session, name, count))
            context = await session.context()
    assert answers == {
        "held": [(2, "held 0")],
        "a": [(3, "a 0"), (4, "a 1")],
        "b": [(5, "b 0")],
        "c": [(6, "c 0"), (7, "c 1"), (8, "c 2")],
    }
    expected = [(1, "first"), *(pair for name in ("held", "a", "b", "c") for pair in answers[name])]
    assert stored.episodes("s") == expected
    assert [(e.seq, e.content) for e in context.episodes] == expected


async def test_queued_adds_share_one_commit(db_path, stored) -> None:
    statements: list[str] = []
    with anyio.fail_after(20):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            await session.add([Episode("user", "first")])

            async def added(n: int) -> None:
                await session.add([Episode("user", f"queued {n}")])

            async with one_append_held(engine, lambda: added(0), statements) as tasks:
                for n in range(1, 9):
                    await queue(tasks, lambda n=n: added(n))
    # The held add's commit, then one for the eight queued behind it.
    assert [s for s in statements if s == "COMMIT"] == ["COMMIT", "COMMIT"]
    assert [content for _, content in stored.episodes("s")] == ["first", *(f"queued {n}" for n in range(9))]


async def test_an_id_repeated_across_queued_adds_is_stored_once(db_path, stored) -> None:
    answers: dict[str, tuple[int | None, str]] = {}

    def add(session: Any, name: str, episode_id: str) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            (episode,) = await session.add([Episode("user", f"sent by {name}", id=episode_id)])
            answers[name] = (episode.seq, episode.content)

        return call

    with anyio.fail_after(20):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            async with one_append_held(engine, add(session, "held", "h")) as tasks:
                await queue(tasks, add(session, "first", "same"))
                await queue(tasks, add(session, "retry", "same"))  # a retried add of the same episode
    # The retry is told what was stored for its id: the first sender's episode, at its seq.
    assert answers == {"held": (1, "sent by held"), "first": (2, "sent by first"), "retry": (2, "sent by first")}
    assert stored.episodes("s") == [(1, "sent by held"), (2, "sent by first")]


@pytest.mark.parametrize("between", ["clear", "delete"])
async def test_an_add_queued_after_a_clear_or_delete_is_not_stored_before_it(db_path, stored, between) -> None:
    with anyio.fail_after(20):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            await session.add([Episode("user", "first")])

            async def change() -> None:
                if between == "clear":
                    await session.clear()
                else:
                    await session.delete_episodes([1, 2, 3, 4])

            async with one_append_held(engine, lambda: session.add([Episode("user", "held")])) as tasks:
                await queue(tasks, lambda: session.add([Episode("user", "before")]))
                await queue(tasks, change)
                await queue(tasks, lambda: session.add([Episode("user", "after")]))
            context = await session.context()
    # "before" is removed by the clear or delete queued after it; "after" survives it.
    assert [content for _, content in stored.episodes("s")] == ["after"]
    assert [e.content for e in context.episodes] == ["after"]


async def test_adds_join_across_a_queued_read_which_is_answered_without_waiting_for_them(db_path, stored) -> None:
    statements: list[str] = []
    seen: list[list[str]] = []
    with anyio.fail_after(20):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            await session.add([Episode("user", "first")])

            async def read() -> None:
                seen.append([e.content for e in (await session.context()).episodes])

            async with one_append_held(engine, lambda: session.add([Episode("user", "held")]), statements) as tasks:
                await queue(tasks, lambda: session.add([Episode("user", "before the read")]))
                await queue(tasks, read)
                await queue(tasks, lambda: session.add([Episode("user", "after the read")]))
    # The add after the read joined the one before it: one commit for both, after the held one.
    assert [s for s in statements if s == "COMMIT"] == ["COMMIT", "COMMIT"]
    # The read, queued while they were unacknowledged, is answered once the held add is stored, as of
    # before them (they are not acknowledged yet): it does not wait for their commit too.
    assert seen == [["first", "held"]]
    assert [c for _, c in stored.episodes("s")] == ["first", "held", "before the read", "after the read"]
