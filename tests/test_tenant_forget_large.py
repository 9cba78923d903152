"""Forgetting a tenant of 1,000 sessions: while other tenants write, and killed in the middle.

Other tenants' writers go on during the erasure: every episode they were
acknowledged is stored, and nothing else of theirs changes. A process killed
(SIGKILL) in the middle of a forget leaves part of the tenant; running the
forget again erases the rest, and nothing of it is left in any table.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import StoreRows
from .processes import read_line
from .test_replicas import ROOT
from .test_tenant_forget import others, traces

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(max_episodes=4, evict_to=0.5, passivate_after=None)
SESSIONS = 1000


async def fill(engine, tenant: str, sessions: int, turns: int = 3) -> None:
    """``sessions`` sessions ``tenant/i`` of ``turns`` episodes each, written 50 at a time, then let go."""
    limiter = anyio.CapacityLimiter(50)

    async def one(number: int) -> None:
        async with limiter:
            session = engine.session(f"{tenant}/{number}")
            await session.add([Episode("user", f"{tenant} private {number}.{n}") for n in range(turns)])
            await session.close()

    async with anyio.create_task_group() as tasks:
        for number in range(sessions):
            tasks.start_soon(one, number)


# 300 sessions are three pages of the forget (privacy/forget.py: 100 a page); the 1,000 of old with --soak.
@pytest.mark.parametrize("sessions", [300, pytest.param(SESSIONS, marks=pytest.mark.soak)])
async def test_forgetting_1000_sessions_changes_nothing_of_the_tenants_writing_meanwhile(
    store_url, sessions: int
) -> None:
    rows = StoreRows(store_url)
    async with open_engine(store_url, config=CONFIG) as engine:
        await fill(engine, "gone", sessions)
        await fill(engine, "kept", 20)
        before = others(rows, "gone/")
        acknowledged: dict[str, list[str]] = {f"writer{w}/chat": [] for w in range(4)}
        forgetting_done = anyio.Event()

        async def write(session_id: str) -> None:
            turn = 0
            while not forgetting_done.is_set() or turn < 5:
                text = f"{session_id} turn {turn}"
                await engine.session(session_id).add([Episode("user", text)])
                acknowledged[session_id].append(text)
                turn += 1
                await anyio.sleep(0.002)

        async with anyio.create_task_group() as tasks:
            for session_id in acknowledged:
                tasks.start_soon(write, session_id)
            report = await engine.forget(tenant="gone")
            forgetting_done.set()

        assert (report.sessions, report.episodes) == (sessions, 3 * sessions)
        assert await engine.recall("private", tenant="gone", limit=10) == []
    assert traces(rows, "gone/") == {}
    after = others(rows, "gone/")
    for table, table_rows in before.items():
        kept = [
            row for row in after[table] if not str(row[0]).startswith("writer") and not str(row[1]).startswith("writer")
        ]
        assert kept == table_rows, table
    for session_id, texts in acknowledged.items():
        stored = rows.query("SELECT content FROM episodes WHERE session_id = ? ORDER BY seq", session_id)
        assert [content for (content,) in stored] == texts


def test_a_forget_killed_in_the_middle_is_finished_by_the_next_one(store_url) -> None:
    rows = StoreRows(store_url)
    sessions = 500  # five pages of the forget (privacy/forget.py): killed in the middle of them (1,000 once)

    async def prepare() -> None:
        async with open_engine(store_url, config=CONFIG) as engine:
            await fill(engine, "gone", sessions)
            await fill(engine, "kept", 10)

    anyio.run(prepare)
    before = others(rows, "gone/")
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.tenant_forget_worker", store_url, "gone", "trio"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert read_line(worker, 120).strip() == "forgetting"
        deadline = time.monotonic() + 120
        while traces(rows, "gone/").get("sessions", 0) > sessions // 2:
            assert time.monotonic() < deadline, "the forget made no progress"
            time.sleep(0.02)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pipe in (worker.stdout, worker.stderr):
            if pipe is not None:
                pipe.close()
    left = traces(rows, "gone/")
    assert 0 < left["sessions"] < sessions, left  # killed in the middle

    async def finish() -> int:
        async with open_engine(store_url, config=CONFIG) as engine:
            report = await engine.forget(tenant="gone")
            assert await engine.forget(tenant="gone", dry_run=True) == type(report)(
                "tenant 'gone'", 0, 0, 0, 0, dry_run=True
            )
            return report.sessions

    # The killed process's leases are released at once (its liveness lock died with it).
    assert anyio.run(finish) >= left["sessions"]
    assert traces(rows, "gone/") == {}
    assert others(rows, "gone/") == before
