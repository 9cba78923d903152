"""Exactly-once hand-off to long-term memory, asserted on what the sink received."""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import RecordingSink, StuckSink, add_each, turns

pytestmark = pytest.mark.anyio

FAST_RETRIES = {"retain_backoff": 0.001, "retain_backoff_max": 0.001, "retain_retry_later": 0.01}


def contents(count: int, start: int = 1) -> list[str]:
    return [f"turn {i}" for i in range(start, start + count)]


async def test_close_flushes_the_partial_batch_once(db_path) -> None:
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=SessionConfig(retain_every=12)) as engine:
        session = engine.session("s")
        await add_each(session, turns(8))
        await session.close()
        await sink.wait_for(1)
    assert sink.delivered_contents() == contents(8)
    (batch,) = sink.batches
    assert (batch.session_id, batch.first_seq, batch.last_seq, batch.mode) == ("s", 1, 8, "append")
    assert [e.seq for e in batch.episodes] == list(range(1, 9))


async def test_every_turn_exactly_once_across_closes_and_restarts(db_path) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=3)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(7))
        await session.close()
        await session.close()  # a second close sends nothing
        await engine.session("s").close()  # nor does closing a fresh handle
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await engine.session("s").close()  # nor a close after reopening the store
    assert sink.delivered_contents() == contents(7)
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 3), (4, 6), (7, 7)]
    assert len({b.key for b in sink.batches}) == 3
    for batch in sink.batches:  # append batches carry only the delta
        assert [e.seq for e in batch.episodes] == list(range(batch.first_seq, batch.last_seq + 1))


async def test_leaving_the_engine_flushes_every_session(db_path) -> None:
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=SessionConfig(retain_every=50)) as engine:
        for name in ("a", "b"):
            await add_each(engine.session(name), turns(4, prefix=name))
    by_session = {b.session_id: [e.content for e in b.episodes] for b in sink.batches}
    assert by_session == {"a": [f"a {i}" for i in range(1, 5)], "b": [f"b {i}" for i in range(1, 5)]}


async def test_replace_mode_sends_the_whole_session_each_time(db_path) -> None:
    sink = RecordingSink(mode="replace")
    async with open_engine(db_path, retain_sink=sink, config=SessionConfig(retain_every=3)) as engine:
        session = engine.session("s")
        await add_each(session, turns(7))
        await session.close()
        await sink.wait_for(3)
    assert [b.mode for b in sink.batches] == ["replace"] * 3
    assert [[e.content for e in b.episodes] for b in sink.batches] == [contents(3), contents(6), contents(7)]
    assert sink.batches[-1].first_seq == 1 and sink.batches[-1].last_seq == 7


async def test_a_failing_sink_gets_each_batch_once_in_order(db_path, caplog) -> None:
    sink = RecordingSink(failures=2)
    config = SessionConfig(retain_every=2, **FAST_RETRIES)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(6))
        await sink.wait_for(3)
        with anyio.fail_after(60):
            while (metrics := await engine.retain_metrics()).outbox_depth:  # noqa: ASYNC110 - a metric, no event
                await anyio.sleep(0.01)
    assert sink.delivered_contents() == contents(6)
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2), (3, 4), (5, 6)]
    assert metrics.delivery_failures == 2 and metrics.delivered == 3 and metrics.outbox_depth == 0
    # Named by its type: its text may quote the episodes (memengine/privacy/error_text.py).
    assert any("ConnectionError" in r.getMessage() for r in caplog.records if r.name == "memengine.retain")


async def test_writers_do_not_wait_for_a_stuck_sink(db_path, stored) -> None:
    sink = StuckSink()
    config = SessionConfig(retain_every=2)
    with anyio.fail_after(20):
        async with open_engine(db_path, retain_sink=sink, config=config, retain_grace=0.2) as engine:
            session = engine.session("s")
            await add_each(session, turns(40))  # 20 batches pile up behind the stuck one
            await session.close()
            metrics = await engine.retain_metrics()
            assert metrics.outbox_depth == 20
            assert metrics.oldest_undelivered_age is not None and metrics.oldest_undelivered_age >= 0
    # The engine left within its grace period; the batches wait in the outbox.
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(20,)]
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=config):
        await sink.wait_for(20)
    assert sink.delivered_contents() == contents(40)


async def test_cleared_turns_are_never_delivered(db_path) -> None:
    sink = StuckSink()  # nothing gets out before the clear
    config = SessionConfig(retain_every=2)
    async with open_engine(db_path, retain_sink=sink, config=config, retain_grace=0.1) as engine:
        session = engine.session("s")
        await add_each(session, turns(5, prefix="secret"))
        await session.clear()
        await add_each(session, turns(3, prefix="fresh"))
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await engine.session("s").close()
    delivered = sink.delivered_contents()
    assert delivered == [f"fresh {i}" for i in range(1, 4)]


async def test_deleted_turns_are_taken_out_of_undelivered_batches(db_path) -> None:
    stuck = StuckSink()
    config = SessionConfig(retain_every=3)
    async with open_engine(db_path, retain_sink=stuck, config=config, retain_grace=0.1) as engine:
        session = engine.session("s")
        await add_each(session, turns(7))
        await session.delete_episodes([2, 7])
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=config):
        pass
    assert sink.delivered_contents() == ["turn 1", "turn 3", "turn 4", "turn 5", "turn 6"]


async def test_passivation_is_a_boundary(db_path) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=100, passivate_after=0.01)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await add_each(engine.session("s"), turns(4))
        await sink.wait_for(1)  # nobody closed it: it went idle
        assert sink.delivered_contents() == contents(4)
    assert len(sink.batches) == 1  # and leaving the engine sent nothing again


async def test_recall_finds_turns_and_ranks_the_better_match_first(db_path) -> None:
    async with open_engine(db_path) as engine:
        await engine.session("alice").add(
            [
                Episode("user", "I adopted a dog named Bolo"),
                Episode("user", "My dog Bolo loves the dog park, Bolo runs all day"),
                Episode("user", "The weather in Lisbon is sunny"),
            ]
        )
        await engine.session("bob").add([Episode("user", "Bolo is also the name of a cake")])
        hits = await engine.recall("Bolo dog", all_sessions=True)
        assert [(h.session_id, h.episode.seq) for h in hits][:2] == [("alice", 2), ("alice", 1)]
        assert {h.session_id for h in hits} == {"alice", "bob"}
        assert hits[0].score >= hits[1].score
        only_bob = await engine.recall("bolo", session_id="bob")
        assert [h.episode.content for h in only_bob] == ["Bolo is also the name of a cake"]
        assert await engine.recall("nothing-matches-this", all_sessions=True) == []
        assert await engine.recall('"; DROP TABLE episodes; --', all_sessions=True) == []
        assert len(await engine.recall("bolo", all_sessions=True, limit=1)) == 1
        with pytest.raises(ValueError):
            await engine.recall("bolo", all_sessions=True, limit=0)


async def test_recall_never_finds_deleted_or_cleared_episodes(db_path) -> None:
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "my password is swordfish"), Episode("user", "keep this swordfish tale")])
        assert len(await engine.recall("swordfish", all_sessions=True)) == 2
        await session.delete_episodes([1])
        assert [h.episode.seq for h in await engine.recall("swordfish", all_sessions=True)] == [2]
        await session.clear()
        assert await engine.recall("swordfish", all_sessions=True) == []
        await session.add([Episode("user", "a new swordfish")])
        assert [h.episode.content for h in await engine.recall("swordfish", all_sessions=True)] == ["a new swordfish"]
    async with open_engine(db_path) as engine:
        assert [h.episode.content for h in await engine.recall("swordfish", all_sessions=True)] == ["a new swordfish"]


async def test_bad_sinks_are_refused(db_path) -> None:
    with pytest.raises(TypeError):
        async with open_engine(db_path, retain_sink=object()):
            pass
    sink = RecordingSink(mode="upsert")
    with pytest.raises(ValueError):
        async with open_engine(db_path, retain_sink=sink):
            pass


async def test_exit_while_delivering_sends_each_batch_once(db_path) -> None:
    class SlowSink(RecordingSink):
        async def retain(self, batch) -> None:
            await anyio.sleep(0.005)  # still delivering when the engine exits
            await super().retain(batch)

    sink = SlowSink()
    async with open_engine(db_path, retain_sink=sink, config=SessionConfig(retain_every=1)) as engine:
        for name in ("a", "b", "c"):
            await add_each(engine.session(name), turns(5, prefix=name))
    keys = [b.key for b in sink.batches]
    assert len(keys) == len(set(keys)) == 15


async def test_batches_hold_exactly_retain_every_episodes(db_path) -> None:
    sink = RecordingSink()
    async with open_engine(db_path, retain_sink=sink, config=SessionConfig(retain_every=2)) as engine:
        session = engine.session("s")
        await session.add(turns(5))  # one add, two full batches and a tail
        await sink.wait_for(2)
        await session.close()
        await sink.wait_for(3)
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2), (3, 4), (5, 5)]
