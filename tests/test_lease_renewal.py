"""A large add never costs another session of the engine its lease (issue #26, item 7).

Every lease of an engine is renewed by one task on the event loop, every third
of ``lease_ttl``. Whatever holds the loop longer than that lets leases expire,
and an expired lease is never revived: the other session was given up with
LeaseLostError. A 100,000-episode add held the loop for about a second when
its completion counted every episode's tokens on the loop (one by one, each a
short content), so it cost an unrelated session its lease with a 0.9 s lease.
Now a batch of many contents, or long ones together, is counted in a worker
thread, before the add is sent to the session.

The worker's tokenizer takes at least a millisecond per content, so counting
the large add on the loop would hold it for several lease periods on any
machine; nothing here measures time. Run in a child process (it could hang).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import StoreRows, postgres_schema, postgres_unreachable
from .lease_renewal_worker import LARGE

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_large_add_costs_no_other_session_its_lease(store_url: str, backend: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.lease_renewal_worker", store_url, backend],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The first context() after the import holds all of it; the other session's adds all went on.
    assert done.stdout.split() == ["ok", str(LARGE), "True"], done.stdout + done.stderr[-3000:]


class SlowLoad:
    """Wraps the store's connection: the next load of a session's episodes sleeps ``pause`` seconds first."""

    def __init__(self, conn: Any, pause: float) -> None:
        self._conn = conn
        self.pause = pause

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        if self.pause and "FROM episodes WHERE session_id = " in sql and sql.rstrip().endswith("ORDER BY seq"):
            pause, self.pause = self.pause, 0.0
            time.sleep(pause)
        return self._conn.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.mark.anyio
async def test_a_session_whose_load_outlasts_its_lease_keeps_the_lease(store_url: str) -> None:
    # Loading a large session (100,000 episodes) can take longer than the lease, which was taken at the
    # start of that transaction: it had expired by the time the session was active, never renewed.
    # The load is slowed here to two lease periods (a sleep: at least that long on any machine).
    config = SessionConfig(evict_to=1.0, lease_ttl=0.9, lease_wait=2.0, passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        await engine.session("other").add([Episode("user", "first")])
        engine.store._conn = SlowLoad(engine.store._conn, pause=2 * config.lease_ttl)  # type: ignore[attr-defined]
        with anyio.fail_after(60):
            session = engine.session("slow to load")
            (stored,) = await session.add([Episode("user", "after a slow load")])
            context = await session.context()
    assert stored.seq == 1
    assert [e.content for e in context.episodes] == ["after a slow load"]


@pytest.mark.anyio
async def test_a_lease_row_held_locked_by_a_write_delays_no_other_renewal() -> None:
    # PostgreSQL renews every lease of the engine in one statement on a connection of its own, locking the rows
    # in id order. A part of a large add holds its session's lease row (FOR SHARE, checking the lease) until it
    # commits: the renewal waited for it, and every other lease of the engine expired meanwhile. Here the row is
    # held by a transaction the test keeps open; the other session's lease must be renewed all the same.
    psycopg = pytest.importorskip("psycopg")
    if postgres_unreachable():
        pytest.skip(postgres_unreachable())
    with postgres_schema() as url:
        rows = StoreRows(url)
        async with open_engine(url, config=SessionConfig(lease_ttl=30.0, passivate_after=None)) as engine:
            await engine.session("a-importing").add([Episode("user", "a")])
            await engine.session("b-other").add([Episode("user", "b")])
            held = rows.query("SELECT session_id, token FROM session_leases ORDER BY session_id")
            before = dict(rows.query("SELECT session_id, expires_at FROM session_leases"))
            with psycopg.connect(url) as locker:
                locker.execute("SELECT 1 FROM session_leases WHERE session_id = 'a-importing' FOR SHARE")
                async with anyio.create_task_group() as tasks:
                    renewed: set[str] = set()

                    async def renew() -> None:
                        renewed.update(await engine.store.renew_leases([tuple(lease) for lease in held], 30.0))

                    tasks.start_soon(renew)
                    with anyio.fail_after(30):  # a deadline, not a pace
                        while b_expiry(rows) == before["b-other"]:  # noqa: ASYNC110 (a row, not an event)
                            await anyio.sleep(0.02)
                    locker.rollback()  # the write ends: the locked lease is renewed too
            assert renewed == {"a-importing", "b-other"}


def b_expiry(rows: StoreRows) -> float:
    return dict(rows.query("SELECT session_id, expires_at FROM session_leases"))["b-other"]
