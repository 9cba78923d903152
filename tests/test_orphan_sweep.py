"""A dead process's sessions are swept once, then left alone.

Every ``lease_ttl`` each engine looks for sessions whose owner died (lease
expired, never released): it records their un-retained tails and summarizes
their overflowing windows. What it has handled is released, so the sweep does
not visit the same dead leases for ever (20,000 of them cost every replica a
quarter of a second per sweep), and a session that still needs work stays
found until it got it.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store.open import open_store

from .fakes import RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

QUIET = [f"quiet-{n:02d}" for n in range(30)]
#: The dead process's leases: long enough that its own appends land under load (with 0.2 s, one failed with
#: LeaseLostError at a load of 10), short enough to wait out.
DEAD_LEASE = 2.0


async def _die_holding(url: str) -> None:
    """A process (owner ``dead``) that stored episodes under short leases and never released them."""
    async with open_store(url, owner="dead") as store:
        for session_id, count in [*((s, 2) for s in QUIET), ("long", 10)]:
            token, _ = await store.activate(session_id, DEAD_LEASE)
            done = anyio.Event()
            outcome: list[object] = []

            def stored(result: object, error: BaseException | None, outcome=outcome, done=done) -> None:
                outcome.append(error)
                done.set()

            episodes = [Episode(role="user", content=f"{session_id} says {n}") for n in range(1, count + 1)]
            store.submit_append(session_id, token, 1, episodes, stored)
            await done.wait()
            assert outcome == [None]
    await anyio.sleep(DEAD_LEASE + 0.1)  # its leases expire (a lower bound: time passes whatever the load)


async def test_the_sweep_releases_what_it_handled_and_finishes_what_is_left(store_url, rows) -> None:
    await _die_holding(store_url)
    sink = RecordingSink()
    config = SessionConfig(
        evict_to=1.0, max_episodes=4, retain_every=100, lease_ttl=1.0, lease_wait=3.0, passivate_after=0.1
    )
    async with open_engine(store_url, summarizer=RecordingSummarizer(), retain_sink=sink, config=config) as engine:
        with anyio.fail_after(20):
            while rows.query("SELECT session_id FROM session_leases WHERE owner = 'dead'"):  # noqa: ASYNC110 (rows)
                await anyio.sleep(0.05)
        context = await engine.session("long").context()
    # Released only after its work was done: the tails were handed on, the long window summarized.
    delivered = {(batch.session_id, episode.content) for batch in sink.batches for episode in batch.episodes}
    assert {(s, f"{s} says {n}") for s in QUIET for n in (1, 2)} <= delivered
    assert covered(context.summary) == [f"long says {n}" for n in range(1, 7)]
