"""Deletes and clears reach the sink: exactly once, in order with the retain batches.

A sink with a ``forget`` method is told of every delete and clear that removed
episodes it may hold (in a batch delivered, or being delivered when the
delete committed), through the same outbox as the batches: after the batch it
cancels, before every batch recorded later. A sink without ``forget`` keeps
what it was handed. Both stores, both async libraries.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import ForgetRequest, SessionConfig, open_engine
from memengine.store.open import open_store

from .conftest import StoreRows
from .fakes import ForgettingSink, RecordingSink, turns
from .test_store_conformance import append, says

pytestmark = pytest.mark.anyio

GUARD = 10  # seconds; far more than any of these needs


@pytest.mark.parametrize("mode", ["append", "replace"])
async def test_add_retain_delete_clear_reaches_the_sink_as_retain_then_forgets_once_each_in_order(
    store_url: str, rows: StoreRows, mode: str
) -> None:
    sink = ForgettingSink(mode)
    config = SessionConfig(retain_every=10, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(10))
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(1)
        assert await session.delete_episodes([2, 5, 7]) == 3
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(2)
        assert sink.held["s"] == {1, 3, 4, 6, 8, 9, 10}
        await session.clear()
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(3)
        await session.close()
    assert sink.calls_made == [
        ("retain", tuple(range(1, 11))),
        ("forget", (2, 5, 7)),
        ("forget", None),
    ]
    assert sink.held["s"] == set()
    partial, whole = sink.forgets
    assert (partial.through_seq, [e.seq for e in partial.kept]) == (10, [1, 3, 4, 6, 8, 9, 10])
    assert (whole.through_seq, whole.kept) == (10, ())
    assert partial.key != whole.key and partial.key.startswith("memengine-")
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_forget_covers_only_episodes_handed_on_and_comes_before_later_batches(
    store_url: str, rows: StoreRows
) -> None:
    sink = ForgettingSink()
    config = SessionConfig(retain_every=4, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(10))  # batches 1..4 and 5..8; 9 and 10 not yet handed on
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(2)
        await session.delete_episodes([3, 6, 9])
        await session.close()  # a boundary: 10 goes out, after the forget
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(4)
        await engine.session("s").clear()
    assert sink.calls_made == [
        ("retain", (1, 2, 3, 4)),
        ("retain", (5, 6, 7, 8)),
        ("forget", (3, 6)),
        ("retain", (10,)),
        ("forget", None),
    ]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_deleting_only_episodes_not_yet_handed_on_sends_no_forget(store_url: str) -> None:
    sink = ForgettingSink()
    config = SessionConfig(retain_every=100, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(5))
        await session.delete_episodes([2])
        await session.clear()  # nothing was handed on: nothing to forget
        await session.add(turns(2, start=6))
        await session.close()
    assert sink.calls_made == [("retain", (6, 7))]


async def test_a_batch_in_flight_when_the_delete_commits_is_followed_by_a_forget_of_its_deleted_episodes(
    store_url: str, rows: StoreRows
) -> None:
    sink = ForgettingSink()
    sink.gate = anyio.Event()
    config = SessionConfig(retain_every=4, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(4))
        with anyio.fail_after(GUARD):
            while sink.entered < 1:  # noqa: ASYNC110 - the sink call has started and is held
                await anyio.sleep(0.005)
        await session.delete_episodes([1, 2, 3, 4])  # everything the batch in flight carries
        # The emptied batch keeps its place: the forget is not due while the batch is being sent.
        assert rows.query("SELECT mode, episodes FROM retain_outbox ORDER BY id") == [
            ("append", "[]"),
            ("forget", "[]"),
        ]
        sink.gate.set()
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(2)
        await session.close()
    assert sink.calls_made == [("retain", (1, 2, 3, 4)), ("forget", (1, 2, 3, 4))]
    assert sink.held["s"] == set()
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_forget_that_fails_is_retried_and_delivered_once(store_url: str) -> None:
    sink = ForgettingSink()
    config = SessionConfig(retain_every=2, max_episodes=100, passivate_after=None, retain_backoff=0.01)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(1)
        sink.failures = sink.calls + 2  # the next two calls fail
        await session.delete_episodes([1])
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(2)
        await session.close()
    assert sink.calls_made == [("retain", (1, 2)), ("forget", (1,))]
    (request,) = sink.forgets
    assert [e.seq for e in request.kept] == [2]


async def test_a_sink_without_forget_keeps_what_it_was_handed_and_the_outbox_empties(
    store_url: str, rows: StoreRows
) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=3, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(3))
        with anyio.fail_after(GUARD):
            await sink.wait_for(1)
        await session.delete_episodes([2])
        await session.clear()
        await session.add(turns(3, start=4))
        await session.close()
    assert [[e.seq for e in batch.episodes] for batch in sink.batches] == [[1, 2, 3], [4, 5, 6]]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_sink_whose_forget_is_not_async_is_refused_at_open(store_url: str) -> None:
    class PlainForget(RecordingSink):
        def forget(self, request: ForgetRequest) -> None:
            pass

    with pytest.raises(TypeError, match="forget"):
        async with open_engine(store_url, retain_sink=PlainForget()):
            pass


async def test_a_forget_is_redelivered_with_the_same_key_when_its_delivery_was_not_recorded(store_url: str) -> None:
    """Two stores stand for a process that sent a forget and died before recording it, and its successor."""
    async with open_store(store_url, owner="a") as a, open_store(store_url, owner="b") as b:
        token, _ = await a.activate("s", 60.0)
        await append(a, "s", token, 1, *says("one", "two", "three"))
        await a.enqueue_retain("s", token, "append")
        (batch,) = await a.pending_retains(10)
        await a.claim_retain(batch.id, batch.key, 60.0)
        await a.mark_retained(batch.id, batch.key)
        await a.delete_episodes("s", token, [2])
        (forget,) = await a.pending_retains(10)
        claimed = await a.claim_retain(forget.id, forget.key, 0.05)  # a sends it, then dies
        assert claimed.forget_seqs == (2,)
        through, kept = await a.handed_on("s")  # what the sink is left with
        assert (through, [e.content for e in kept]) == (3, ["one", "three"])
        with anyio.fail_after(GUARD):
            while (again := await b.claim_retain(forget.id, forget.key, 60.0)) == "busy":  # noqa: ASYNC110 - until a's claim lapses
                await anyio.sleep(0.02)
        assert again.key == claimed.key and again.forget_seqs == (2,)
        await b.mark_retained(forget.id, forget.key)
        assert await b.pending_retains(10) == []


async def test_a_forget_is_not_claimable_while_the_emptied_batch_before_it_is_held_elsewhere(store_url: str) -> None:
    async with open_store(store_url, owner="a") as a, open_store(store_url, owner="b") as b:
        token, _ = await a.activate("s", 60.0)
        await append(a, "s", token, 1, *says("one", "two"))
        await a.enqueue_retain("s", token, "append")
        (batch,) = await a.pending_retains(10)
        assert len((await b.claim_retain(batch.id, batch.key, 60.0)).episodes) == 2  # b is sending it
        await a.clear_session("s", token)
        emptied, forget = await a.pending_retains(10)
        assert (emptied.id, emptied.episodes) == (batch.id, ())
        assert (forget.mode, forget.forget_seqs, forget.last_seq) == ("forget", None, 2)
        assert await a.claim_retain(forget.id, forget.key, 60.0) == "busy"
        await b.mark_retained(batch.id, batch.key)
        assert (await a.claim_retain(forget.id, forget.key, 60.0)).mode == "forget"


async def test_what_a_forget_keeps_includes_batches_handed_on_after_the_delete_but_recorded_before_it(
    store_url: str,
) -> None:
    # A sink that rewrites a document from ``kept`` must not lose a batch that went out between the delete and
    # the forget (recorded before the delete, so ahead of the forget in the outbox).
    sink = ForgettingSink()
    sink.gate = anyio.Event()
    config = SessionConfig(retain_every=4, max_episodes=100, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(4))
        with anyio.fail_after(GUARD):
            while sink.entered < 1:  # noqa: ASYNC110 - batch 1..4 is in the sink's hands, held
                await anyio.sleep(0.005)
        await session.add(turns(4, start=5))  # batch 5..8 is recorded behind it, not handed on yet
        await session.close()
        await engine.session("s").delete_episodes([2])
        sink.gate.set()
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(3)
    assert sink.calls_made == [("retain", (1, 2, 3, 4)), ("retain", (5, 6, 7, 8)), ("forget", (2,))]
    (request,) = sink.forgets
    assert (request.through_seq, [e.seq for e in request.kept]) == (8, [1, 3, 4, 5, 6, 7, 8])
