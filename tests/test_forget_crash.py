"""Forgets survive kill -9: add 10 / retain / delete 3 / clear, with the process killed after every step.

A child (tests/forget_worker.py) runs the steps with a sink that writes each
call it stores to a side file, and is killed with SIGKILL after its k-th
acknowledged step (and, for some k, a moment later, mid-delivery). A restarted
engine in this process, under the same owner name, finishes what the child
did not acknowledge (each step is idempotent: adds by id, deletes by seq, a
clear of an empty session forgets nothing) and drains. Together, the child's
side file and the restarted sink saw: the retain of 1..10, a forget of
exactly 2, 5 and 7, a whole-session forget, in that order; a call repeated
only as the killed run's last one, redelivered with the same key because its
delivery was never recorded. Both stores, both async libraries (the child runs
on the other one).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import open_engine

from .forget_worker import CONFIG, DELETED, OWNER, SESSION, call_record, episodes, outbox_emptied
from .processes import communicate, lines

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["added", "retained", "deleted", "forgot", "cleared", "done"]
CHILD_TIMEOUT = 60.0
RESTART_TIMEOUT = 30.0
#: (acknowledged steps before the kill, seconds after that line): every step, and a few mid-delivery.
KILL_POINTS = [(0, 0.0), (1, 0.0), (1, 0.003), (2, 0.0), (3, 0.0), (3, 0.003), (4, 0.0), (5, 0.003), (6, 0.0)]


def run_child_until_killed(store: str, side_file: Path, backend: str, after: int, delay: float) -> list[str]:
    """Start the child, SIGKILL it once it printed ``after`` steps (plus ``delay``); return the steps it printed."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.forget_worker", store, str(side_file), backend],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed: list[str] = []
    try:
        printing = lines(child, CHILD_TIMEOUT)
        while len(printed) < after and (line := next(printing, None)) is not None:
            printed.append(line.strip())
        assert len(printed) >= after, f"the child stopped after {printed}: {child.stderr.read()[-3000:]}"  # type: ignore[union-attr]
        if after == 0:
            time.sleep(0.3)  # somewhere in opening the engine or the first add
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        out, _ = communicate(child, 30)  # what readline() buffered too
    return printed + [line for line in out.splitlines() if line]


def side_calls(side_file: Path) -> list[dict[str, Any]]:
    if not side_file.exists():
        return []
    lines = side_file.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1]]  # a torn last line was never stored


class RecordingForgetSink:
    mode = "append"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def retain(self, batch: Any) -> None:
        self.calls.append(call_record("retain", batch))

    async def forget(self, request: Any) -> None:
        self.calls.append(call_record("forget", request))


async def finish_the_steps(store: str, printed: list[str]) -> list[dict[str, Any]]:
    """Reopen the store and do what the killed child did not acknowledge; return what this sink was sent."""
    sink = RecordingForgetSink()
    async with open_engine(store, retain_sink=sink, config=CONFIG, owner=OWNER) as engine:
        session = engine.session(SESSION)
        if "added" not in printed:
            await session.add(episodes())
        await outbox_emptied(engine, 10)
        if "deleted" not in printed:
            await session.delete_episodes(DELETED)
        await outbox_emptied(engine)
        if "cleared" not in printed:
            await session.clear()
        await outbox_emptied(engine)
        await session.close()
    return sink.calls


@pytest.mark.parametrize(("after", "delay"), KILL_POINTS)
async def test_every_retain_and_forget_reaches_the_sink_once_in_order_across_a_kill(
    store_url: str, rows, anyio_backend: str, tmp_path: Path, after: int, delay: float
) -> None:
    side_file = tmp_path / "side.jsonl"
    child_backend = "trio" if anyio_backend == "asyncio" else "asyncio"
    printed = run_child_until_killed(store_url, side_file, child_backend, after, delay)
    where = f"killed after {printed} + {delay}s"
    killed = side_calls(side_file)
    with anyio.fail_after(RESTART_TIMEOUT):
        restarted = await finish_the_steps(store_url, printed)
    calls = killed + restarted
    if killed and restarted and restarted[0]["key"] == killed[-1]["key"]:
        # Stored by the killed run, its delivery never recorded: sent again, with the same key.
        assert restarted[0] == killed[-1], where
        calls = killed + restarted[1:]
    assert [(call["call"], call["seqs"]) for call in calls] == [
        ("retain", list(range(1, 11))),
        ("forget", DELETED),
        ("forget", None),
    ], where
    assert len({call["key"] for call in calls}) == 3, where
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)], where
    assert rows.query("SELECT count(*) FROM episodes") == [(0,)], where
