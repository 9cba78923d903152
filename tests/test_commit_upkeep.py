"""Upkeep between two transactions (SQLite's checkpoint, see store/sqlite/checkpoints.py): it always runs, or is let go.

``Committer._upkeep_between_transactions`` runs the backend's upkeep in the
commit thread once the transaction in flight has answered its callers. Its
waiter must come back whatever happens to that transaction: an unexpected
failure must not leave it waiting for the next write, and a close that gives
up on the thread must let it go.
"""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from memengine.store import committer
from memengine.store.sqlite import checkpoints, open_sqlite_store
from memengine.store.sqlite.store import SQLiteStore
from memengine.store.transactions import Transactions

pytestmark = pytest.mark.anyio

DEADLINE = 30.0  # seconds: generous, for a loaded machine; only a broken committer gets near it


async def _until(condition: Any) -> None:
    with anyio.fail_after(DEADLINE):
        while not condition():  # noqa: ASYNC110 - a thread sets it, or the loop that this waits on
            await anyio.sleep(0.005)


async def _ask_for_upkeep(store: Any, returned: anyio.Event) -> None:
    await store._upkeep_between_transactions()
    returned.set()


def _write(db: Any) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS probe (x)")
    db.execute("INSERT INTO probe VALUES (1)")


async def test_upkeep_asked_for_during_a_transaction_that_fails_unexpectedly_runs_without_another_write(
    db_path, monkeypatch
) -> None:
    monkeypatch.setattr(checkpoints, "CHECKPOINT_DELAY", 1e6)  # only this test asks for upkeep
    in_commit, release = threading.Event(), threading.Event()
    ran: list[int] = []
    original_commit, original_upkeep = Transactions._commit, SQLiteStore._upkeep

    def commit(self: Any, batch: list[Any]) -> None:
        if any(getattr(submission.operation, "fails", False) for submission in batch):
            in_commit.set()
            release.wait(DEADLINE)
            raise RuntimeError("an unexpected failure, not the store's")
        original_commit(self, batch)

    def upkeep(self: Any) -> None:
        ran.append(1)
        original_upkeep(self)

    def failing(db: Any) -> None:  # never runs: the commit fails around it
        raise AssertionError

    failing.fails = True  # type: ignore[attr-defined]
    monkeypatch.setattr(Transactions, "_commit", commit)
    monkeypatch.setattr(SQLiteStore, "_upkeep", upkeep)
    upkept = anyio.Event()
    async with open_sqlite_store(str(db_path)) as store:
        await store._submit(_write)

        async def submit_failing() -> None:
            with pytest.raises(Exception, match="unexpected failure"):
                await store._submit(failing)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(submit_failing)
            await _until(in_commit.is_set)
            tasks.start_soon(_ask_for_upkeep, store, upkept)
            await _until(lambda: store._upkeep_waiting)
            release.set()
            with anyio.fail_after(DEADLINE):  # before: only the next write ran it
                await upkept.wait()
    assert ran == [1]


async def test_closing_that_gives_up_on_an_upkeep_lets_its_waiter_go(db_path, monkeypatch) -> None:
    monkeypatch.setattr(checkpoints, "CHECKPOINT_DELAY", 1e6)
    monkeypatch.setattr(committer, "INTERRUPT_SECONDS", 0.2)
    in_upkeep, release = threading.Event(), threading.Event()

    def stuck_upkeep(self: Any) -> None:  # a checkpoint that does not return at the interrupt (a slow disk's fsync)
        in_upkeep.set()
        release.wait(DEADLINE)

    monkeypatch.setattr(SQLiteStore, "_upkeep", stuck_upkeep)
    let_go = anyio.Event()
    try:
        async with open_sqlite_store(str(db_path)) as store:
            await store._submit(_write)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_ask_for_upkeep, store, let_go)
                await _until(in_upkeep.is_set)
                assert not await store.aclose(grace=0.0)  # gave up on the thread: not everything ran
                with anyio.fail_after(DEADLINE):  # before: it waited for ever
                    await let_go.wait()
    finally:
        release.set()  # the thread left behind returns, and closes the connection
