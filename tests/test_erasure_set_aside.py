"""Erasure reaches past work set aside: a set-aside retain batch never holds back a forget, nor keeps erased text.

A retain batch the sink refused round after round is set aside (not in
flight, never due). A delete, clear or ``forget`` of its session empties it
of the erased episodes (drops it when nothing is left), erases its error text
(the sink's message may quote them), and the forget recorded for the sink
goes out ahead of it. Retrying or discarding it afterwards still behaves. On
both stores and both async libraries; asserted on what the sink holds, the
outbox's rows and the set-aside listing.
"""

from __future__ import annotations

import contextlib

import anyio
import attrs
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import StoreRows
from .test_retain_delivery import GUARD, QUICK

pytestmark = pytest.mark.anyio

MARKER = "passport number X1234567"
#: Never a timer tick within a test: only a wake-up gets a forget to the sink.
CONFIG = SessionConfig(retain_every=1, retain_attempts=2, retain_retry_later=3600, retain_set_aside_after=1, **QUICK)


class RefusingDictSink:
    """The README's DictSink, refusing (and quoting) any episode that holds ``refused``, while it is set."""

    mode = "append"

    def __init__(self, refused: str | None = MARKER) -> None:
        self.refused = refused
        self.sessions: dict[str, dict[int, str]] = {}
        self.forgets: list[tuple[str, tuple[int, ...] | None]] = []
        self._changed = anyio.Event()

    async def retain(self, batch) -> None:
        try:
            for episode in batch.episodes:
                if self.refused is not None and self.refused in episode.content:
                    raise ValueError(f"refusing to store {episode.content!r}")
            self.sessions.setdefault(batch.session_id, {}).update({e.seq: e.content for e in batch.episodes})
        finally:
            self._tell()

    async def forget(self, request) -> None:
        stored = self.sessions.get(request.session_id, {})
        for seq in list(stored) if request.seqs is None else request.seqs:
            stored.pop(seq, None)
        self.forgets.append((request.session_id, request.seqs))
        self._tell()

    def _tell(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_until(self, condition) -> None:
        with anyio.fail_after(GUARD):
            while not condition():
                await self._changed.wait()


async def set_aside_behind_a_delivered_one(engine, sink: RefusingDictSink, session_id: str) -> None:
    """Seq 1 delivered, seq 2 (the marker) set aside, seq 3 waiting behind it."""
    session = engine.session(session_id)
    await session.add([Episode("user", "hello")])
    await sink.wait_until(lambda: sink.sessions.get(session_id) == {1: "hello"})
    await session.add([Episode("user", f"my {MARKER}")])
    with anyio.fail_after(GUARD):
        while (await engine.stats()).retains_set_aside < 1:  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(0.01)
    await session.add([Episode("user", "bye")])
    (work,) = await engine.list_set_aside()
    assert MARKER in work.error  # the sink's own text quotes the refused episode


def marker_rows(rows: StoreRows) -> list[tuple]:
    return rows.query(
        "SELECT id, episodes, last_error FROM retain_outbox WHERE episodes LIKE ? OR last_error LIKE ?",
        f"%{MARKER}%",
        f"%{MARKER}%",
    )


@contextlib.asynccontextmanager
async def a_set_aside_batch(store_url: str, session_id: str, config: SessionConfig = CONFIG):
    """An engine whose session has seq 1 delivered, seq 2 set aside, seq 3 behind it; the outbox ends empty."""
    sink = RefusingDictSink()
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        await set_aside_behind_a_delivered_one(engine, sink, session_id)
        yield engine, sink
    assert StoreRows(store_url).query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_clear_behind_a_set_aside_batch_reaches_the_sink(store_url) -> None:
    async with a_set_aside_batch(store_url, "t/a") as (engine, sink):
        await engine.session("t/a").clear()
        await sink.wait_until(lambda: ("t/a", None) in sink.forgets)
        assert sink.sessions["t/a"] == {}
        assert await engine.list_set_aside() == []
        assert (await engine.stats()).retains_set_aside == 0
        assert marker_rows(StoreRows(store_url)) == []
        # The session goes on: its next batch is delivered (nothing set aside holds it back).
        await engine.session("t/a").add([Episode("user", "again")])
        await sink.wait_until(lambda: list(sink.sessions["t/a"].values()) == ["again"])


async def test_a_tenant_forget_behind_a_set_aside_batch_reaches_the_sink_and_leaves_no_trace(store_url) -> None:
    rows = StoreRows(store_url)
    config = attrs.evolve(CONFIG, retain_retry_later=0.05)  # test_forget_wakes_delivery.py: no timer needed
    async with a_set_aside_batch(store_url, "t/a", config) as (engine, sink):
        report = await engine.forget(tenant="t")
        assert report.sessions == 1
        await sink.wait_until(lambda: ("t/a", None) in sink.forgets)
        assert sink.sessions["t/a"] == {}
        assert await engine.list_set_aside() == []
        assert marker_rows(rows) == []
        with anyio.fail_after(GUARD):
            while rows.query("SELECT count(*) FROM retain_outbox") != [(0,)]:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        again = await engine.forget(tenant="t")
        assert again.waiting_for_sink == 0
    assert rows.query("SELECT count(*) FROM sessions") == [(0,)]


async def test_a_delete_overtakes_a_set_aside_batch_which_a_retry_then_delivers(store_url) -> None:
    async with a_set_aside_batch(store_url, "s") as (engine, sink):
        await engine.session("s").delete_episodes([1])
        await sink.wait_until(lambda: ("s", (1,)) in sink.forgets)
        assert sink.sessions["s"] == {}
        (work,) = await engine.list_set_aside()  # seq 2 is still set aside, its error text erased
        assert (work.first_seq, work.last_seq) == (2, 2)
        assert MARKER not in work.error
        sink.refused = None
        assert await engine.retry_set_aside("s") == 1
        await sink.wait_until(lambda: sink.sessions["s"] == {2: f"my {MARKER}", 3: "bye"})


async def test_deleting_the_set_aside_episode_drops_the_batch_and_its_error(store_url) -> None:
    async with a_set_aside_batch(store_url, "s") as (engine, sink):
        await engine.session("s").delete_episodes([2])
        # Seq 2 was claimed once: the sink is told to forget it; seq 3 goes out (before, as recorded before).
        await sink.wait_until(lambda: ("s", (2,)) in sink.forgets)
        assert sink.sessions["s"] == {1: "hello", 3: "bye"}
        assert await engine.list_set_aside() == []
        assert marker_rows(StoreRows(store_url)) == []


async def test_a_discard_after_a_delete_drops_only_the_set_aside_batch(store_url) -> None:
    async with a_set_aside_batch(store_url, "s") as (engine, sink):
        await engine.session("s").delete_episodes([1])
        await sink.wait_until(lambda: ("s", (1,)) in sink.forgets)
        (dropped,) = await engine.discard_set_aside("s")
        assert (dropped.first_seq, dropped.last_seq) == (2, 2)
        await sink.wait_until(lambda: sink.sessions["s"] == {3: "bye"})
