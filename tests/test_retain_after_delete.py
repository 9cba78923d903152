"""Deleting the newest, not yet handed-on episodes leaves nothing to hand on, and nothing to loop on.

A retain watermark that could only move to a live episode stayed behind when
the newest episodes were deleted: the session kept recording empty batches,
thousands of transactions a second, and never passivated. These pin that
deleted ranges count as done, on both stores and both async libraries.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import SessionConfig, open_engine

from .conftest import StoreRows
from .fakes import RecordingSink, turns

pytestmark = pytest.mark.anyio

GUARD = 10  # seconds; far more than any of these needs unless the session loops


async def wait_until_passivated(engine, session_id: str) -> None:
    with anyio.fail_after(GUARD):
        while engine.is_active(session_id):  # noqa: ASYNC110 - polling the engine's registry
            await anyio.sleep(0.01)


@pytest.mark.parametrize(
    ("retain_every", "added", "deleted", "handed_on"),
    [
        (20, 5, [5], [1, 2, 3, 4]),  # the partial batch loses its newest episode
        (2, 6, [3, 4, 5, 6], [1, 2]),  # whole batches' worth of the newest episodes go
        (3, 3, [1, 2, 3], []),  # everything goes before any batch was recorded
    ],
)
async def test_deleting_the_newest_unretained_episodes_then_closing_hands_on_the_rest_and_passivates(
    store_url: str, rows: StoreRows, retain_every: int, added: int, deleted: list[int], handed_on: list[int]
) -> None:
    sink = RecordingSink()
    config = SessionConfig(evict_to=1.0, retain_every=retain_every, passivate_after=0.05, max_episodes=100)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(added))
        assert await session.delete_episodes(deleted) == len(deleted)
        await session.close()
        await wait_until_passivated(engine, "s")
        # Reopened, nothing more is due either.
        await engine.session("s").close()
        await wait_until_passivated(engine, "s")
    seqs = [e.seq for batch in sink.batches for e in batch.episodes]
    assert seqs == handed_on
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]
    assert rows.query("SELECT retained_through FROM sessions WHERE session_id = 's'") == [(added,)]


async def test_adds_after_deleting_the_newest_are_handed_on_in_batches_as_usual(store_url: str) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=2, passivate_after=None)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(3))  # batch 1..2 recorded; 3 pending
        await session.delete_episodes([3])
        await session.add(turns(4, start=4))  # seqs 4..7
        await session.close()
    batches = [[e.seq for e in batch.episodes] for batch in sink.batches]
    assert batches == [[1, 2], [4, 5], [6, 7]]


@pytest.mark.parametrize(
    ("added", "deleted", "handed_on"),
    [
        (5, [5], [1, 2, 3, 4]),  # the newest of a partial batch
        (6, [4, 5, 6], [1, 2, 3]),  # the newest few
        (6, [2, 6], [1, 3, 4, 5]),  # one in the middle too
    ],
)
async def test_a_close_moves_the_watermark_to_the_last_seq_when_the_newest_episodes_were_deleted(
    store_url: str, rows: StoreRows, added: int, deleted: list[int], handed_on: list[int]
) -> None:
    """The close's batch holds the live episodes; the deleted ones after it are done with too, in the same write.

    The watermark stopped at the batch's last live episode: the session still
    had episodes to hand on, as it seemed, and wrote again at its next boundary.
    """
    sink = RecordingSink()
    config = SessionConfig(evict_to=1.0, retain_every=20, passivate_after=None, max_episodes=100)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(added))
        assert await session.delete_episodes(deleted) == len(deleted)
        await session.close()
        assert rows.query("SELECT retained_through FROM sessions WHERE session_id = 's'") == [(added,)]
    assert [[e.seq for e in batch.episodes] for batch in sink.batches] == [handed_on]
