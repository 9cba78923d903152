"""Retain delivery when a replica dies or is cut off from the store mid-call (issue #14, items 3 and 4).

- A batch whose claim a killed process left behind is sent by a surviving
  engine once the claim lapses, with nothing else happening in the cluster
  (no add, no retry due, no orphan tail): delivery wakes at the lapse it saw.
- A process that cannot extend its claim cancels its sink call before the
  claim lapses, so the sink never sees a late copy of a batch after the
  batches another process sent meanwhile; the cancelled call never counts
  as delivered.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from memengine import SessionConfig, open_engine

from . import delivery_worker
from .conftest import StoreRows

GUARD = 30  # seconds: no wait here lasts this long unless delivery is stuck
ROOT = Path(__file__).resolve().parent.parent


class RecordingSink:
    mode = "append"

    def __init__(self) -> None:
        self.batches: list[tuple[str, int, int, str]] = []
        self.changed = anyio.Event()

    async def retain(self, batch) -> None:
        self.batches.append((batch.session_id, batch.first_seq, batch.last_seq, batch.key))
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_for(self, count: int) -> None:
        while len(self.batches) < count:
            await self.changed.wait()


# -- item 3: a killed replica's claim lapses, and a quiet cluster still sends the batch ----------


@pytest.fixture
def killed_mid_call(store_url: str, anyio_backend: str):
    """Start a worker process, let its sink call hang on its one batch, SIGKILL it; yield its claim's end."""
    claim_seconds = 4.0
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.delivery_worker", store_url, "asyncio", "worker", str(claim_seconds)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + GUARD
        line = ""
        while time.monotonic() < deadline and not line.startswith("{"):
            line = process.stdout.readline()  # the worker prints one line, then hangs
            if not line and process.poll() is not None:
                break
        assert line.startswith("{"), f"the worker never called its sink: {process.stderr.read()}"
        assert json.loads(line) == {"op": "sink called", "first_seq": 1, "last_seq": delivery_worker.BATCH}
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=GUARD)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=GUARD)
        process.stdout.close()
        process.stderr.close()
    yield claim_seconds


async def test_a_killed_replica_batch_is_sent_once_its_claim_lapses_without_any_new_add(
    store_url, killed_mid_call
) -> None:
    rows = StoreRows(store_url)
    # The worker died holding a live claim: the survivor's first look finds the batch not due.
    ((claimed_by, remaining),) = rows.query(
        "SELECT claimed_by, claim_until - " + _now(store_url) + " FROM retain_outbox"
    )
    assert claimed_by == "worker"
    assert remaining > 1.0, "the test is too slow to start the survivor before the claim lapses"
    sink = RecordingSink()
    # Nothing else would wake delivery: no add, no retry pending, and the periodic look is an hour away.
    config = SessionConfig(retain_every=delivery_worker.BATCH, retain_retry_later=3600.0, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config, owner="survivor", retain_grace=0):
        with anyio.fail_after(GUARD):
            await sink.wait_for(1)
            while rows.query("SELECT count(*) FROM retain_outbox") != [(0,)]:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # recorded right after the sink returned
    assert [(s, first, last) for s, first, last, _ in sink.batches] == [
        (delivery_worker.SESSION, 1, delivery_worker.BATCH)
    ]


def _now(store_url: str) -> str:
    if store_url.startswith("postgresql://"):
        return "extract(epoch from clock_timestamp())::float8"
    return "((julianday('now') - 2440587.5) * 86400.0)"


# -- the setting ---------------------------------------------------------------------------------


def test_retain_claim_seconds_is_validated_like_every_other_duration() -> None:
    assert SessionConfig().retain_claim_seconds == 60.0
    assert SessionConfig(retain_claim_seconds=2).retain_claim_seconds == 2
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="retain_claim_seconds"):
            SessionConfig(retain_claim_seconds=bad)
    for wrong in ("5", None, True):
        with pytest.raises(TypeError, match="retain_claim_seconds"):
            SessionConfig(retain_claim_seconds=wrong)
