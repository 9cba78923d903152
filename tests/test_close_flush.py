"""A session boundary (close, passivation) records the partial retain batch in the outbox, once.

The sink is stuck, so nothing is ever delivered and the outbox keeps every
batch it was given: the rows read right after the boundary are exactly what
the boundary recorded. Nothing here waits for the sink.
"""

from __future__ import annotations

import json

import anyio
import pytest

from memengine import SessionConfig, open_engine

from .fakes import GatedSummarizer, StuckSink, add_each, turns

pytestmark = pytest.mark.anyio

# Idleness in real time, on both libraries: the session is filled by one add, so
# it cannot go idle halfway; and a MockClock would have to jump through every
# lease renewal and claim extension on the way to a long virtual idle period.
IDLE = 0.05


def outbox(rows, session_id: str = "s") -> list[list[int]]:
    """The seqs of each batch waiting in the outbox, oldest batch first."""
    batches = rows.query("SELECT episodes FROM retain_outbox WHERE session_id = ? ORDER BY id", session_id)
    return [[episode["seq"] for episode in json.loads(payload)] for (payload,) in batches]


async def wait_until_passivated(engine, session_id: str) -> None:
    with anyio.fail_after(IDLE * 100):
        while engine.is_active(session_id):  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(IDLE / 10)


async def test_the_partial_batch_is_in_the_outbox_when_close_returns(store_url, rows) -> None:
    # A summary held in flight keeps the session from passivating, so the only
    # thing that can record the partial batch before the checks is close itself.
    summarizer = GatedSummarizer()
    config = SessionConfig(evict_to=1.0, max_episodes=2, retain_every=4, passivate_after=None)
    async with open_engine(
        store_url, summarizer=summarizer, retain_sink=StuckSink(), config=config, retain_grace=0
    ) as engine:
        session = engine.session("s")
        await add_each(session, turns(6))
        await summarizer.wait_until_called()

        await session.close()
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6]]

        await session.close()  # the same handle: a no-op
        await engine.session("s").close()  # another handle: a boundary with nothing new
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6]]

        summarizer.release()
        await wait_until_passivated(engine, "s")  # closed, and now idle: it goes
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6]]
    assert outbox(rows) == [[1, 2, 3, 4], [5, 6]]  # leaving the engine recorded nothing again


async def test_the_partial_batch_is_in_the_outbox_when_an_idle_session_passivates(store_url, rows) -> None:
    config = SessionConfig(retain_every=4, passivate_after=IDLE)
    async with open_engine(store_url, retain_sink=StuckSink(), config=config, retain_grace=0) as engine:
        await engine.session("s").add(turns(7))  # one full batch, 1-4, and a partial one
        await wait_until_passivated(engine, "s")
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6, 7]]

        await engine.session("s").close()  # reactivates it: nothing new to record
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6, 7]]
    assert outbox(rows) == [[1, 2, 3, 4], [5, 6, 7]]


async def test_a_tail_left_without_retaining_is_recorded_at_the_next_start_in_batches_of_retain_every(
    store_url, rows
) -> None:
    """A run that never handed its episodes on (no sink then, or it died before its exit) leaves a long tail.

    The next start records it as batches of at most ``retain_every`` episodes,
    as the session would have, not as one batch of everything.
    """
    async with open_engine(store_url) as engine:  # no sink: nothing is handed on
        await engine.session("s").add(turns(11))
    assert outbox(rows) == []
    config = SessionConfig(retain_every=4)
    async with open_engine(store_url, retain_sink=StuckSink(), config=config, retain_grace=0):
        assert outbox(rows) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    assert outbox(rows) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]


async def test_a_replace_sink_gets_one_snapshot_of_the_tail_at_the_next_start(store_url, rows) -> None:
    """A replace batch is the whole session up to its last episode: the tail's newest snapshot is enough."""
    async with open_engine(store_url) as engine:
        await engine.session("s").add(turns(11))
    config = SessionConfig(retain_every=4)
    async with open_engine(store_url, retain_sink=StuckSink(mode="replace"), config=config, retain_grace=0):
        assert outbox(rows) == [list(range(1, 12))]
