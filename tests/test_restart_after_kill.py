"""A process killed with kill -9 releases its sessions and retain claims at once, for any process on the store.

Real processes (tests/restart_worker.py), default settings: a lease lasts 10 s
and a retain claim 60 s, so anything faster than that comes from the dead
process's liveness lock (store/owners.py, store/liveness.py), which the
operating system (SQLite's file lock) or the server (PostgreSQL's advisory
lock) ended with the process. The bounds here are generous (the machine is
shared); benchmarks/restart_after_kill.py measures the real figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .processes import communicate, lines

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = [("asyncio", "trio"), ("trio", "asyncio")]
#: The takeover tests give the dead process a lease and a claim far longer than any wait a loaded machine
#: causes (10 and 60 s were once the bounds, with 4 s to tell a takeover at once from one after they lapse).
DEAD = {"MEMENGINE_TEST_LEASE_TTL": "600", "MEMENGINE_TEST_CLAIM_SECONDS": "3600"}
#: The process after it keeps the default lease (a running one looks for dead owners every third of it)
#: and waits long for a session and for the batches: how long it took is the test's to judge.
NEXT = {"MEMENGINE_TEST_LEASE_WAIT": "300", "MEMENGINE_TEST_WAIT_SECONDS": "240"}
#: Far below that lease (600 s) and claim (3,600 s): only a takeover at once comes in time.
FIRST_CALL_BOUND = 120.0
#: The dead process ran on this machine, so no grace applies on PostgreSQL either (store/owners.py).
FIRST_BATCH_BOUND = 120.0


def start(store: str, backend: str, mode: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.restart_worker", store, backend, mode, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(process: subprocess.Popen[str], op: str, timeout: float = 120) -> dict[str, Any]:
    """The worker's first ``op`` record, within ``timeout`` seconds (a deadline, not a pace: generous)."""
    for line in lines(process, timeout):
        record = json.loads(line)
        if record["op"] == op:
            return record
    process.kill()
    raise AssertionError(f"no {op!r} from the worker in {timeout} s: {communicate(process, 10)[1][-3000:]}")


def finish(process: subprocess.Popen[str], timeout: float = 90) -> list[dict[str, Any]]:
    try:
        out, err = communicate(process, timeout)  # what wait_for()'s readline() buffered too
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = communicate(process)
        raise AssertionError(f"the worker did not finish in {timeout} s: {err[-3000:]}") from None
    assert process.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines()]


def killed_while_holding(store: str, backend: str) -> None:
    """A process that holds two sessions and a retain claim (its sink call hangs), killed with kill -9."""
    holder = start(store, backend, "hold", env=DEAD)
    try:
        wait_for(holder, "holding")
    finally:
        holder.send_signal(signal.SIGKILL)
        communicate(holder, 30)


def assert_kept_delivered_once_in_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept = [r for r in records if r["op"] == "batch" and r["session"] == "kept"]
    assert [c for r in kept for c in r["contents"]] == [f"kept {n}" for n in range(1, 6)], kept
    return kept


@pytest.mark.parametrize(("first", "then"), BACKENDS)
def test_a_restart_after_kill_9_serves_the_dead_process_sessions_and_delivers_its_batches_at_once(
    store_url: str, first: str, then: str
) -> None:
    killed_while_holding(store_url, first)
    records = finish(start(store_url, then, "next", env=NEXT), timeout=300)
    (added,) = [r for r in records if r["op"] == "added"]
    assert added["seq"] == 2 and added["seconds"] < FIRST_CALL_BOUND, added
    kept = assert_kept_delivered_once_in_order(records)
    assert kept[0]["at"] < FIRST_BATCH_BOUND, kept


@pytest.mark.parametrize(("first", "then"), BACKENDS)
def test_a_running_replica_takes_over_a_killed_one_batches_without_any_call(
    store_url: str, first: str, then: str
) -> None:
    # The survivor starts once the holder's sink call holds the first batch: started before, it could claim that
    # batch itself (any process delivers what is due), and the holder would never hold it.
    holder = start(store_url, first, "hold", env=DEAD)
    survivor: subprocess.Popen[str] | None = None
    try:
        wait_for(holder, "holding")
        survivor = start(store_url, then, "next", "--no-add", env=NEXT)
        wait_for(survivor, "opened")
        holder.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        communicate(holder, 30)
        records = finish(survivor, timeout=300)
    finally:
        holder.kill()
        if survivor is not None and survivor.poll() is None:
            survivor.kill()
            communicate(survivor)
    kept = assert_kept_delivered_once_in_order(records)
    assert kept[0]["monotonic"] - killed_at < FIRST_BATCH_BOUND, (kept, killed_at)


def test_a_paused_process_is_not_taken_for_dead(store_url: str) -> None:
    """SIGSTOP (a GC pause, a debugger) keeps the liveness lock: its sessions move only when their leases expire."""
    holder = start(store_url, "asyncio", "hold")
    try:
        wait_for(holder, "holding")
        holder.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        records = finish(start(store_url, "trio", "next", "--add-only"), timeout=60)
    finally:
        holder.send_signal(signal.SIGKILL)
        communicate(holder, 30)
    (added,) = [r for r in records if r["op"] == "added"]
    # Its lease (10 s) was renewed at most a third of it before the pause: at least 6.6 s were left.
    assert added["seq"] == 2 and added["monotonic"] - stopped_at > 6.0, (added, stopped_at)
