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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from . import delivery_worker
from .conftest import StoreRows
from .processes import lines
from .test_store_conformance import append, two_processes

pytestmark = pytest.mark.anyio

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
        # The worker prints one line, then hangs.
        line = next((line for line in lines(process, GUARD) if line.startswith("{")), "")
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


# -- item 4: a replica cut off from the store cancels its call before its claim lapses ----------

CLAIM = 1.0  # seconds: retain_claim_seconds in these tests
_OUTBOX_CALLS = ("due_retains", "claim_retain", "mark_retained", "mark_retain_failed")


class CutOffAfterFirstExtension:
    """A store whose retain outbox is out of reach once the first claim extension went through.

    Later extensions raise (``hang=False``) or never return (``hang=True``);
    every other outbox call raises. The rest of the store works (leases, adds).
    """

    def __init__(self, store, hang: bool) -> None:
        self._store = store
        self._hang = hang
        self.extensions = 0

    async def extend_retain_claim(self, entry_id: int, key: str, ttl: float) -> bool:
        self.extensions += 1
        if self.extensions == 1:
            return await self._store.extend_retain_claim(entry_id, key, ttl)
        if self._hang:
            await anyio.sleep_forever()
        raise ConnectionError("cut off from the database")

    def __getattr__(self, name: str):
        attribute = getattr(self._store, name)
        if name not in _OUTBOX_CALLS:
            return attribute

        async def cut_off(*args, **kwargs):
            if self.extensions > 1:
                raise ConnectionError("cut off from the database")
            return await attribute(*args, **kwargs)

        return cut_off


@asynccontextmanager
async def engine_cut_off(monkeypatch, store_url: str, hang: bool, **options) -> AsyncIterator:
    """An engine whose store is :class:`CutOffAfterFirstExtension`."""
    import memengine.engine

    real_open_store = memengine.engine.open_store

    @asynccontextmanager
    async def open_store(path, **kwargs):
        async with real_open_store(path, **kwargs) as store:
            yield CutOffAfterFirstExtension(store, hang)

    monkeypatch.setattr(memengine.engine, "open_store", open_store)
    try:
        engine_context = open_engine(store_url, **options)
        engine = await engine_context.__aenter__()
    finally:
        monkeypatch.setattr(memengine.engine, "open_store", real_open_store)  # for every other engine
    try:
        yield engine
    except BaseException as exc:
        if not await engine_context.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await engine_context.__aexit__(None, None, None)


class FirstCallHangs:
    """Records each call's end in order: ``("returned", first_seq)``, or ``("cancelled", first_seq)``
    for the first call, which waits for ``release`` (as a call whose reply is held up somewhere)."""

    mode = "append"

    def __init__(self) -> None:
        self.ends: list[tuple[str, int]] = []
        self.release = anyio.Event()
        self.first_called = anyio.Event()
        self.first_ended = anyio.Event()
        self.changed = anyio.Event()

    async def retain(self, batch) -> None:
        if not self.first_called.is_set():
            self.first_called.set()
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self._end("cancelled", batch.first_seq)
                raise
            finally:
                self.first_ended.set()
        self._end("returned", batch.first_seq)

    def _end(self, how: str, first_seq: int) -> None:
        self.ends.append((how, first_seq))
        self.changed.set()
        self.changed = anyio.Event()

    async def wait_until_returned(self, count: int) -> None:
        while sum(how == "returned" for how, _ in self.ends) < count:
            await self.changed.wait()


@pytest.mark.parametrize("hang", [False, True], ids=["extension-fails", "extension-hangs"])
async def test_a_call_whose_claim_cannot_be_extended_is_cancelled_before_another_process_sends(
    store_url, monkeypatch, hang: bool
) -> None:
    sink = FirstCallHangs()
    config = SessionConfig(retain_every=1, retain_claim_seconds=CLAIM, retain_retry_later=3600.0, passivate_after=None)
    async with engine_cut_off(
        monkeypatch, store_url, hang, retain_sink=sink, config=config, owner="cut-off", retain_grace=0
    ) as cut_off:
        await cut_off.session("s").add([Episode("user", "one"), Episode("user", "two")])  # batches 1 and 2
        with anyio.fail_after(GUARD):
            await sink.first_called.wait()
        # Another replica sends what the cut-off one holds, once its claim lapsed in the store.
        async with open_engine(store_url, retain_sink=sink, config=config, owner="other", retain_grace=0):
            with anyio.fail_after(GUARD):
                await sink.wait_until_returned(2)
        sink.release.set()  # had the cut-off call gone on, its reply would arrive now
        with anyio.fail_after(GUARD):
            await sink.first_ended.wait()
        cut_off_metrics = await cut_off.retain_metrics()
    assert sink.ends == [("cancelled", 1), ("returned", 1), ("returned", 2)]
    assert cut_off_metrics.delivered == 0
    assert StoreRows(store_url).query("SELECT count(*) FROM retain_outbox") == [(0,)]


class FirstCallReturnsLate:
    """The first call blocks the whole process past the claim (no checkpoint), then returns."""

    mode = "append"

    def __init__(self, block: float) -> None:
        self.block = block
        self.keys: list[tuple[int, str]] = []
        self.changed = anyio.Event()

    async def retain(self, batch) -> None:
        if not self.keys:
            time.sleep(self.block)  # noqa: ASYNC251 - a process paused mid-call (GC, swap, a stopped VM)
        self.keys.append((batch.first_seq, batch.key))
        self.changed.set()
        self.changed = anyio.Event()


async def test_a_sink_call_returning_after_the_claim_lapsed_is_not_counted_and_the_batch_is_sent_again(
    store_url,
) -> None:
    sink = FirstCallReturnsLate(block=CLAIM * 1.2)
    config = SessionConfig(retain_every=1, retain_claim_seconds=CLAIM, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        await engine.session("s").add([Episode("user", "one"), Episode("user", "two")])
        with anyio.fail_after(GUARD):
            while len(sink.keys) < 3:
                await sink.changed.wait()
            while await engine.store.pending_retains(10):  # noqa: ASYNC110 - recorded right after the sink returned
                await anyio.sleep(0.01)
        metrics = await engine.retain_metrics()
    (first_seq, first_key), again, (second_seq, _) = sink.keys
    assert (first_seq, second_seq) == (1, 2)
    assert again == (1, first_key)  # the late one was not taken as delivered: sent again, same key
    assert metrics.delivered == 2


# -- replicas do not race for a head another one holds ---------------------------------------------


async def test_a_head_another_live_process_holds_is_not_due_until_its_claim_lapses(store_url) -> None:
    async with two_processes(store_url) as (a, b):
        token, _ = await a.activate("held", 60.0)
        await append(a, "held", token, 1, Episode("user", "one"))
        await a.enqueue_retain("held", token, "append")
        token, _ = await a.activate("free", 60.0)
        await append(a, "free", token, 1, Episode("user", "two"))
        await a.enqueue_retain("free", token, "append")
        held, _ = await a.pending_retains(10)
        await a.claim_retain(held.id, held.key, 0.5)
        due = await b.due_retains(10, ignore_backoff=True)
        assert [batch.session_id for batch in due.batches] == ["free"]  # b leaves a's live claim alone
        assert due.next_due_in is not None and 0 < due.next_due_in <= 0.5  # and knows when to look again
        assert [batch.session_id for batch in (await a.due_retains(10)).batches] == ["held", "free"]  # a's own
        await anyio.sleep(0.6)  # a is gone: its claim lapses
        assert [batch.session_id for batch in (await b.due_retains(10)).batches] == ["held", "free"]


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
