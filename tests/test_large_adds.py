"""Large adds: stored in bounded transactions, yet whole or not at all; leases never lapse meanwhile.

One transaction used to carry a whole add, however large: a 150,000-episode
import held the store for seconds, every other writer waited, and the lease
renewals queued behind it let the leases of unrelated sessions expire. Now no
transaction takes more than ``TRANSACTION_ROWS`` rows, renewals go first, and
an add too large for one transaction is stored in parts that are undone
together unless all of them commit (also when the process dies in between).

Statements are slowed down below the store (a wrapper around its connection)
so that a few hundred rows stand for a large import on a fast disk.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import Episode, LeaseLostError, SessionConfig, StoreError, open_engine
from memengine.store import committer

from .conftest import StoreRows
from .large_add_worker import LARGE, OWNER, large_add
from .processes import read_line

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
GUARD = 30


class SlowWrites:
    """Wraps the store's connection: slows statements inserting episodes; fails one that holds ``poison``."""

    def __init__(self, conn: Any, error: type[BaseException], per_row: float, poison: str | None = None) -> None:
        self._conn = conn
        self._error = error  # the driver's own error (sqlite3.Error, psycopg.Error)
        self.per_row = per_row
        self.poison = poison

    def _before(self, sql: str, rows: list) -> None:
        if not sql.lstrip().startswith("INSERT INTO episodes"):
            return
        time.sleep(self.per_row * len(rows))
        if self.poison is not None and any(self.poison in str(value) for row in rows for value in row):
            raise self._error("disk I/O error (injected)")

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        self._before(sql, [parameters])
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, rows: Any, /) -> Any:
        rows = list(rows)
        self._before(sql, rows)
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def slow_down(engine, per_row: float, poison: str | None = None) -> SlowWrites:
    slow = SlowWrites(engine.store._conn, engine.store._dialect.errors[0], per_row, poison)
    engine.store._conn = slow
    return slow


def says(prefix: str, count: int) -> list[Episode]:
    return [Episode("user", f"{prefix} {i}", id=f"{prefix}-{i}") for i in range(count)]


async def import_while_adding(engine: Any, small: Any, count: int, pause: float) -> tuple[tuple[Episode, ...], int]:
    """Add ``count`` episodes to session "import" in one add while ``small`` is given one add every ``pause`` s.

    Returns what the import stored and how many adds of ``small`` were acknowledged meanwhile (any that
    failed fails the caller's test).
    """
    imported = anyio.Event()
    small_adds = 0

    async def add_meanwhile() -> None:
        nonlocal small_adds
        while not imported.is_set():
            await small.add([Episode("user", f"meanwhile {small_adds}")])
            small_adds += 1
            await anyio.sleep(pause)

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(add_meanwhile)
            stored = await engine.session("import").add(says("import", count))
            imported.set()
    return stored, small_adds


async def test_a_long_import_never_lets_another_sessions_lease_lapse_nor_stalls_its_writers(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1,200 rows at 5 ms each: 6 s of writing, against leases of 3 s renewed every second (0.9 s leases
    # lapsed under a load of 10: the renewal waits its turn behind the import's transactions, slower then).
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 60, raising=False)
    config = SessionConfig(evict_to=1.0, lease_ttl=3.0, lease_wait=6.0, passivate_after=None, max_episodes=10_000)
    async with open_engine(store_url, config=config) as engine:
        small = engine.session("small")
        await small.add(says("small", 1))
        slow_down(engine, per_row=0.005)
        stored, small_adds_during_import = await import_while_adding(engine, small, 1200, pause=0.05)
        assert [e.seq for e in stored] == list(range(1, 1201))
        # The other session was never given up, and its writers went on during the import.
        (after,) = await small.add([Episode("user", "after the import")])
        assert after.seq == small_adds_during_import + 2
        assert small_adds_during_import >= 5
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 'import'") == [(1200,)]


async def test_an_import_whose_parts_each_hold_its_lease_row_past_any_renewal_wait_keeps_its_lease(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Each part holds the import's lease row for 1 s (its statements slowed), longer than a renewal waits for
    # a locked row (lock_timeout 200 ms) and not much shorter than the lease (1.5 s, renewed every 0.5 s).
    # Renewal cannot be what keeps the import's lease: the parts keep it, each one as it commits.
    if not store_url.startswith("postgresql"):
        pytest.skip("PostgreSQL's: on SQLite renewals go into the committer's own transactions, between the parts")
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 20, raising=False)
    url = store_url + "%20-c%20lock_timeout%3D200ms"
    config = SessionConfig(evict_to=1.0, lease_ttl=1.5, lease_wait=6.0, passivate_after=None, max_episodes=10_000)
    async with open_engine(url, config=config) as engine:
        small = engine.session("small")
        await small.add(says("small", 1))
        slow_down(engine, per_row=0.05)
        stored, small_adds = await import_while_adding(engine, small, 200, pause=0.1)  # 10 parts of 1 s
        assert [e.seq for e in stored] == list(range(1, 201))
        (after,) = await small.add([Episode("user", "after the import")])
        assert after.seq == small_adds + 2  # neither session was given up: no add failed
        assert len((await engine.session("import").context()).episodes) == 200
        # Not given up meanwhile either (a renewal that could not wait for its row is no proof of loss while
        # the import's own parts check and extend the lease): its first activation still serves it.
        assert rows.query("SELECT token FROM session_leases WHERE session_id = 'import'") == [(1,)]
    # And no renewal failed: the leases it could renew were renewed, those it could not wait for were left.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 'import'") == [(200,)]


async def test_an_add_whose_later_part_fails_stores_none_of_it(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 100, raising=False)
    async with open_engine(store_url, config=SessionConfig(evict_to=1.0, max_episodes=10_000)) as engine:
        session = engine.session("s")
        await session.add(says("kept", 3))
        large = says("large", 350)
        large[250] = Episode("user", "poison pill", id="poison")  # in the third part
        slow_down(engine, per_row=0.0, poison="poison pill")
        with pytest.raises(StoreError):
            await session.add(large)
        assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(3,)]
        assert rows.query("SELECT count(*) FROM unfinished_appends") == [(0,)]
        assert [e.content for e in (await session.context()).episodes] == ["kept 0", "kept 1", "kept 2"]
        assert await engine.recall("large", session_id="s") == []
        # The same add, healed, goes through whole, right after what was acknowledged.
        engine.store._conn.poison = None
        stored = await session.add(large)
        assert [e.seq for e in stored] == list(range(4, 354))
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(353,)]


async def test_a_lost_lease_in_the_middle_of_a_large_add_stores_none_of_it(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 50, raising=False)
    async with open_engine(
        store_url, config=SessionConfig(evict_to=1.0, max_episodes=10_000, passivate_after=None)
    ) as engine:
        session = engine.session("s")
        await session.add(says("kept", 1))
        slow_down(engine, per_row=0.002)
        async with anyio.create_task_group() as tasks:

            async def take_the_lease_over() -> None:
                # Another process takes the session over once the add has stored a part.
                while rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(1,)]:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                rows.query("UPDATE session_leases SET owner = 'other', token = token + 1 WHERE session_id = 's'")

            tasks.start_soon(take_the_lease_over)
            with anyio.fail_after(GUARD), pytest.raises((LeaseLostError, StoreError)):
                await session.add(says("large", 400))
    # The parts stored before the takeover are undone by whoever next loads the session.
    rows.query("UPDATE session_leases SET owner = NULL, expires_at = 0 WHERE session_id = 's'")
    async with open_engine(store_url, config=SessionConfig(evict_to=1.0, max_episodes=10_000)) as engine:
        context = await engine.session("s").context()
        assert [e.content for e in context.episodes] == ["kept 0"]
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(1,)]


def kill_in_the_middle_of_the_large_add(store_url: str, rows: StoreRows) -> int:
    """Run the worker; kill -9 it once some parts of its large add are committed; return the rows then."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.large_add_worker", store_url, "s"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stdout is not None
            assert read_line(worker, GUARD).strip() == "acked"
            assert read_line(worker, GUARD).strip() == "adding"
            deadline = time.monotonic() + GUARD
            while rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'")[0][0] < 101:
                assert time.monotonic() < deadline, "the large add never started"
                time.sleep(0.01)
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    return int(rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'")[0][0])


async def test_a_process_killed_in_the_middle_of_a_large_add_leaves_none_of_it(store_url: str, rows: StoreRows) -> None:
    stored_then = kill_in_the_middle_of_the_large_add(store_url, rows)
    assert 101 <= stored_then < LARGE + 1, "the kill came before or after the parts, not between them"

    async with open_engine(store_url, config=SessionConfig(evict_to=1.0, max_episodes=10_000), owner=OWNER) as engine:
        session = engine.session("s")
        assert [e.content for e in (await session.context()).episodes] == ["before the large add"]
        assert await engine.recall("word1", session_id="s") == []
        again = await session.add(large_add())  # the caller never heard back: it retries
        assert [e.seq for e in again] == list(range(2, LARGE + 2))
    assert rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(LARGE + 1,)]
    assert rows.query("SELECT count(*) FROM unfinished_appends") == [(0,)]


async def test_recall_never_finds_the_parts_of_an_add_still_being_stored(
    store_url: str, rows: StoreRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 50, raising=False)
    async with open_engine(
        store_url, config=SessionConfig(evict_to=1.0, max_episodes=10_000, passivate_after=None)
    ) as engine:
        session = engine.session("s")
        slow_down(engine, per_row=0.002)
        seen_while_adding: list[int] = []
        async with anyio.create_task_group() as tasks:

            async def recall_meanwhile() -> None:
                # Once some parts are committed (and before the last one), recall sees none of them.
                while rows.query("SELECT count(*) FROM episodes WHERE session_id = 's'") == [(0,)]:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
                seen_while_adding.append(len(await engine.recall("part", session_id="s")))
                seen_while_adding.append(rows.query("SELECT count(*) FROM unfinished_appends")[0][0])

            tasks.start_soon(recall_meanwhile)
            with anyio.fail_after(GUARD):
                await session.add([Episode("user", f"part word{i}") for i in range(300)])
        assert seen_while_adding == [0, 1]  # stored in part, unfinished, and not found
        assert len(await engine.recall("part", session_id="s", limit=1000)) == 300
