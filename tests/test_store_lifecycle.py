"""The store's own lifecycle: a close that gives up on a stuck thread, reads whose callers gave up, sweeps in steps.

Each test runs on SQLite and PostgreSQL and on both async libraries. Statements
are stalled below the store (a wrapper around a connection) at the Python
level, where no database interrupt reaches them: the hardest case for a close
that must end in time.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from typing import Any

import anyio
import pytest

from memengine import Episode, UncertainCommitError
from memengine.store import committer, leases
from memengine.store.open import open_store

from .conftest import StoreRows

pytestmark = pytest.mark.anyio

GUARD = 20
TTL = 60.0
#: Which caller's read a statement runs for (worker threads run in a copy of the caller's context).
CALLER: ContextVar[str] = ContextVar("caller", default="?")


class Stalling:
    """Wraps a connection: statements starting with ``prefix`` block until released; records what they raised."""

    def __init__(self, conn: Any, prefix: str) -> None:
        self._conn = conn
        self._prefix = prefix
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.callers: list[str] = []  # CALLER of each statement started
        self.errors: list[BaseException] = []
        self.finished = threading.Event()

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        if sql.lstrip().startswith(self._prefix):
            self.callers.append(CALLER.get())
            self.stalled.set()
            self.release.wait(GUARD)
            try:
                return self._conn.execute(sql, parameters)
            except BaseException as exc:
                self.errors.append(exc)
                raise
            finally:
                self.finished.set()
        return self._conn.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_a_close_that_leaves_a_stuck_thread_behind_never_closes_the_connection_under_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "INTERRUPT_SECONDS", 0.1)
    async with open_store(store_url, owner="a") as store:
        token, _ = await store.activate("s", TTL)
        stuck = Stalling(store._conn, "UPDATE session_leases")  # the release below, deaf to interrupts
        store._conn = stuck

        async def release() -> None:
            with pytest.raises(UncertainCommitError):  # left behind mid-transaction: its caller cannot know
                await store.release_lease("s", token)

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(release)
                await anyio.to_thread.run_sync(stuck.stalled.wait, GUARD)
                assert await store.aclose(0.1) is False  # gave up on the thread
                assert await store.aclose() is False  # and says so again: the thread may still be running
    # The store has closed; the thread left behind now finishes its statement on an open connection.
    stuck.release.set()
    await anyio.to_thread.run_sync(stuck.finished.wait, GUARD)
    assert stuck.errors == []


async def test_reads_whose_callers_gave_up_before_they_started_never_run(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_store(store_url, owner="a") as store:
        reader = Stalling(store._reader, "SELECT s.session_id, s.generation")  # the listing's statement
        store._reader = reader
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:

                async def impatient(name: str) -> None:
                    CALLER.set(name)
                    with anyio.move_on_after(0.05):
                        await store.list_sessions()

                callers.start_soon(impatient, "the first")  # its read starts, and stalls
                await anyio.to_thread.run_sync(reader.stalled.wait, GUARD)
                for number in range(7):
                    # Theirs wait for the first: they give up before starting.
                    callers.start_soon(impatient, f"impatient {number}")
            reader.release.set()
            CALLER.set("the last")
            assert await store.list_sessions() == []
    # The stalled one, and the last; none of the seven abandoned while waiting ran. (The last may run twice:
    # the interrupt meant for the first, abandoned, can reach the server late and hit it, and it runs again.)
    first, *rest = reader.callers
    assert first == "the first"
    assert rest in (["the last"], ["the last", "the last"]), reader.callers


async def test_the_retain_sweep_leaves_a_session_another_process_took_since_listing_it(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_store(store_url, owner="a") as a, open_store(store_url, owner="b") as b:
        token, _ = await b.activate("s", TTL)
        await a_append(b, "s", token, 1, Episode("user", "b's acknowledged episode"))
        # A listing taken before b's takeover would still name "s": every session is listed here.
        monkeypatch.setattr(leases, "unowned", lambda owner, orphaned_only: ("1 = 1", ()))
        assert await a.enqueue_all_retains("append") == []  # checked again under the lease: b's, left alone
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]
    assert rows.query("SELECT content FROM episodes WHERE session_id = 's'") == [("b's acknowledged episode",)]


async def test_the_retain_sweep_takes_every_unowned_session_in_bounded_steps(store_url: str, rows: StoreRows) -> None:
    sessions = [f"s{i:03d}" for i in range(250)]
    async with open_store(store_url, owner="gone") as gone:
        for session_id in sessions:
            token, _ = await gone.activate(session_id, TTL)
            await a_append(gone, session_id, token, 1, Episode("user", f"tail of {session_id}"))
        await gone.release_leases()
    async with open_store(store_url, owner="a") as a:
        assert sorted(await a.enqueue_all_retains("append")) == sessions  # 100 sessions per transaction
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(250,)]


async def a_append(store, session_id: str, token: int, first_seq: int, *episodes: Episode) -> None:
    outcome: dict[str, Any] = {}
    done = anyio.Event()

    def complete(result: Any, error: BaseException | None) -> None:
        outcome["error"] = error
        done.set()

    store.submit_append(session_id, token, first_seq, list(episodes), complete)
    await done.wait()
    assert outcome["error"] is None
