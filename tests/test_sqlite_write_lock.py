"""Another process holds the SQLite file's write lock: adds fail after ``busy_timeout``, nothing acknowledged is lost.

The other process (a backup, a long transaction of another tool) holds
``BEGIN IMMEDIATE`` on the file. A write waits ``busy_timeout`` seconds for
it, then fails with :class:`StoreError`, nothing of it stored; once the lock
is gone, the same session takes writes again. (Leaving the engine while the
lock is held is bounded: tests/test_engine_exit.py, scenario "locked".)
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from memengine import Episode, StoreError, open_engine

from .conftest import StoredRows
from .processes import read_line

pytestmark = pytest.mark.anyio

BUSY_TIMEOUT = 0.5
#: Room for a slow, shared machine.
SLACK = 5.0

_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
conn.execute("ROLLBACK")
"""


@contextmanager
def write_lock_held_by_another_process(path: Path) -> Iterator[None]:
    command = [sys.executable, "-c", _HOLDER, str(path)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert read_line(holder, 60).strip() == "locked"
            yield
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(30)


async def test_an_add_fails_after_the_busy_timeout_and_the_store_keeps_what_was_acknowledged(
    anyio_backend: str, db_path: Path, stored: StoredRows
) -> None:
    async with open_engine(db_path, busy_timeout=BUSY_TIMEOUT) as engine:
        session = engine.session("alice")
        await session.add([Episode("user", "before the lock")])
        with write_lock_held_by_another_process(db_path):
            started = time.monotonic()
            with anyio.fail_after(BUSY_TIMEOUT + 30), pytest.raises(StoreError, match="locked"):
                await session.add([Episode("user", "while locked")])
            waited = time.monotonic() - started
        await session.add([Episode("user", "after the lock")])
        context = await session.context()

    assert BUSY_TIMEOUT <= waited <= BUSY_TIMEOUT + SLACK
    assert [e.content for e in context.episodes] == ["before the lock", "after the lock"]
    assert stored.episodes("alice") == [(1, "before the lock"), (2, "after the lock")]


@pytest.mark.parametrize("busy_timeout", [-1, float("nan"), float("inf")])
async def test_a_busy_timeout_that_is_no_number_of_seconds_is_refused(
    anyio_backend: str, db_path: Path, busy_timeout: float
) -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        async with open_engine(db_path, busy_timeout=busy_timeout):
            pass
