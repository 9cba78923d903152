"""A large add enters the window a slice at a time (session/large_entry.py): other sessions are served meanwhile.

Entering 100,000 stored episodes into the window and copying them for their
caller used to run in one go on the event loop, in the append's completion,
and held every session of the engine for most of a second. The slice is made
small here (a few episodes) so that a few hundred episodes stand for an import.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from memengine import Episode, SessionClosedError, SessionConfig, open_engine
from memengine.session import handle, large_entry
from memengine.session.window import RawWindow

from .conftest import StoreRows

pytestmark = pytest.mark.anyio

GUARD = 60  # a deadline against a hang, not a pace


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(large_entry, "ENTER_SLICE", 7)
    monkeypatch.setattr(handle, "ENTER_SLICE", 7)
    return 7


def says(prefix: str, count: int) -> list[Episode]:
    return [Episode("user", f"{prefix} {i}", id=f"{prefix}-{i}") for i in range(count)]


async def test_another_session_is_answered_while_a_large_add_enters_the_window(
    store_url: str, small_slices: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, int]] = []
    append = RawWindow.append

    def logged_append(self: RawWindow, episodes: Any, *, last: bool = True) -> None:
        episodes = list(episodes)
        log.append(("entered", len(episodes)))
        append(self, episodes, last=last)

    monkeypatch.setattr(RawWindow, "append", logged_append)
    config = SessionConfig(max_episodes=10_000, passivate_after=None, lease_ttl=60.0)
    async with open_engine(store_url, config=config) as engine:
        other = engine.session("other")
        await other.add(says("other", 3))
        log.clear()
        imported = anyio.Event()
        reads = 0

        async def read_meanwhile() -> None:
            nonlocal reads
            while not imported.is_set():
                context = await other.context()  # served from memory: its lease is long
                assert [e.content for e in context.episodes] == ["other 0", "other 1", "other 2"]
                reads += 1
                log.append(("read", reads))

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(read_meanwhile)
                stored = await engine.session("import").add(says("import", 500))
                imported.set()
    assert [e.seq for e in stored] == list(range(1, 501))
    assert [e.content for e in stored] == [f"import {i}" for i in range(500)]
    slices = [n for what, n in log if what == "entered"]
    assert sum(slices) == 500 and max(slices) <= small_slices, slices
    # The other session's reads were answered between the import's slices, not only before or after them.
    first = next(i for i, (what, _) in enumerate(log) if what == "entered")
    last = max(i for i, (what, _) in enumerate(log) if what == "entered")
    assert any(what == "read" for what, _ in log[first:last]), log[first : last + 1][:50]


async def test_calls_queued_behind_a_large_add_see_it_whole_and_in_order(
    store_url: str, rows: StoreRows, small_slices: int
) -> None:
    config = SessionConfig(max_episodes=50, evict_to=0.5, passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        results: dict[str, Any] = {}

        async def add_more() -> None:
            results["more"] = await session.add(says("more", 2))

        async def read() -> None:
            results["read"] = await session.context()

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(add_more)
                tasks.start_soon(read)
                results["large"] = await session.add(says("large", 300))
            context = await session.context(wait_for_summary=True)
        contents = [f"more {i}" for i in range(2)]
        large = [f"large {i}" for i in range(300)]
        # The queued add is stored before or after the large one, never inside it; the seqs follow.
        everything = large + contents if results["more"][0].seq == 301 else contents + large
        assert [e.seq for e in results["large"]] + [e.seq for e in results["more"]] in (
            list(range(1, 303)),
            [*range(3, 303), 1, 2],
        )
        # The read saw a prefix of the session, whole: never part of the large add.
        seen = results["read"].summarized_through + len(results["read"].episodes)
        assert seen in (0, 2, 300, 302), seen
        # The window took all of it: the summary covers what was evicted, the rest is raw, no gap, no overlap.
        assert context.summarized_through + len(context.episodes) == 302
        assert [e.content for e in context.episodes] == everything[context.summarized_through :]
        assert len(context.episodes) <= 50
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(302,)]


async def test_an_engine_closing_while_a_large_add_enters_the_window_answers_its_caller(
    store_url: str, rows: StoreRows, small_slices: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    entering = anyio.Event()
    append = RawWindow.append

    def noticed_append(self: RawWindow, episodes: Any, *, last: bool = True) -> None:
        entering.set()
        append(self, episodes, last=last)

    monkeypatch.setattr(RawWindow, "append", noticed_append)
    config = SessionConfig(max_episodes=10_000, passivate_after=None)
    stored: tuple[Episode, ...] = ()
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tasks:
            async with open_engine(store_url, config=config) as engine:
                session = engine.session("s")

                async def add() -> None:
                    nonlocal stored
                    stored = await session.add(says("import", 400))

                tasks.start_soon(add)
                await entering.wait()
            # The engine has left, while the stored add was being entered.
    # Its caller was answered: the add is stored, whole.
    assert [e.seq for e in stored] == list(range(1, 401))
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(400,)]


async def test_a_large_add_on_a_closed_handle_is_refused_before_any_of_it_is_checked(
    store_url: str, rows: StoreRows, small_slices: int
) -> None:
    config = SessionConfig(max_content_chars=100)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        await session.add(says("kept", 1))
        await session.close()
        with pytest.raises(SessionClosedError):  # not the ValueError its last episode would get, once checked
            await session.add([*says("large", 50), Episode("user", "x" * 101)])
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(1,)]
