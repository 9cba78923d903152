"""A retain batch the sink refuses round after round is set aside: kept, not sent, until retried or discarded.

Other sessions' deliveries go on; the session's later batches wait behind it
(each session's batches reach the sink in order); a restart keeps it set
aside; a retry delivers it once, a discard drops it (and only it).
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import StoreRows
from .test_retain_delivery import GUARD, QUICK, ScriptedSink

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(retain_every=1, retain_attempts=2, retain_retry_later=0.01, retain_set_aside_after=2, **QUICK)


async def until_set_aside(engine, count: int) -> None:
    with anyio.fail_after(GUARD):
        while (await engine.stats()).retains_set_aside < count:  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(0.01)


async def deliver_more(engine, sink: ScriptedSink, session_id: str, turns: int) -> None:
    """Add ``turns`` batches to a healthy session, one at a time, each waited for at the sink."""
    before = len(sink.accepted.get(session_id, []))
    for n in range(1, turns + 1):
        await engine.session(session_id).add([Episode("user", f"{session_id} {n}")])
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda wanted=before + n: len(sink.accepted.get(session_id, [])) >= wanted)


async def test_a_batch_refused_every_round_is_set_aside_and_retried_once(store_url) -> None:
    rows = StoreRows(store_url)
    sink = ScriptedSink(refuse={"bad": ConnectionError("the sink refuses this batch")})
    async with open_engine(store_url, retain_sink=sink, config=CONFIG, retain_grace=0) as engine:
        await engine.session("bad").add([Episode("user", "bad 1")])
        await engine.session("bad").add([Episode("user", "bad 2")])
        await until_set_aside(engine, 1)
        # Other sessions go on, over many retry periods; the set-aside batch is not tried again.
        await deliver_more(engine, sink, "good", 5)
        assert sink.calls_of("bad") == [(1, 1)] * 4  # two rounds of two calls; its seq 2 waits behind it
        (work,) = await engine.list_set_aside()
        assert (work.kind, work.session_id, work.first_seq, work.last_seq, work.attempts) == ("retain", "bad", 1, 1, 4)
        assert "the sink refuses" in work.error
        stats = await engine.stats()
        assert (stats.retains_set_aside, stats.summaries_set_aside) == (1, 0)
        assert stats.outbox_depth >= 2  # set aside, and its session's later batch behind it
    assert rows.query("SELECT first_seq FROM retain_outbox WHERE set_aside_at IS NOT NULL") == [(1,)]

    # A restart keeps it set aside, even with a sink that would take it now.
    sink = ScriptedSink()
    async with open_engine(store_url, retain_sink=sink, config=CONFIG, retain_grace=0) as engine:
        await deliver_more(engine, sink, "good", 3)
        assert sink.calls_of("bad") == []
        assert (await engine.stats()).retains_set_aside == 1

        assert await engine.retry_set_aside("bad") == 1
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.accepted.get("bad", [])) == 2)
        assert sink.calls_of("bad") == [(1, 1), (2, 2)]  # once each, in order
        assert (await engine.stats()).retains_set_aside == 0
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_discarding_drops_only_the_set_aside_batch(store_url, caplog) -> None:
    rows = StoreRows(store_url)
    sink = ScriptedSink(refuse={"bad": ConnectionError("the sink refuses this batch")})
    async with open_engine(store_url, retain_sink=sink, config=CONFIG, retain_grace=0) as engine:
        await engine.session("bad").add([Episode("user", "bad 1")])
        await until_set_aside(engine, 1)
        await engine.session("bad").add([Episode("user", "bad 2")])
        sink.refuse.clear()
        (dropped,) = await engine.discard_set_aside()
        assert (dropped.session_id, dropped.first_seq, dropped.last_seq) == ("bad", 1, 1)
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: sink.accepted.get("bad") == [(2, 2)])
        assert await engine.discard_set_aside() == []
        assert (await engine.stats()).retains_set_aside == 0
    assert sink.calls_of("bad") == [(1, 1)] * 4 + [(2, 2)]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]
    assert any(
        "discarded the set-aside retain batch of session 'bad' seqs 1..1" in r.getMessage() for r in caplog.records
    )


async def test_never_set_aside_when_not_configured(db_path) -> None:
    config = SessionConfig(
        retain_every=1, retain_attempts=1, retain_retry_later=0.001, retain_set_aside_after=None, **QUICK
    )
    sink = ScriptedSink(refuse={"bad": ConnectionError("down")})
    async with open_engine(db_path, retain_sink=sink, config=config, retain_grace=0) as engine:
        await engine.session("bad").add([Episode("user", "bad 1")])
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.calls_of("bad")) >= 8)
        assert (await engine.stats()).retains_set_aside == 0
