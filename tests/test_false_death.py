"""A live engine is never taken for dead (invariant 14: dead only on proof).

Fast, in-process checks on each store: engine B wants a session live engine A
holds (a summary in flight, so A does not hand it over when idle), and must
get :class:`SessionBusyError`. If liveness took A for dead, B would release
A's lease and take the session: on SQLite at once (no grace), on PostgreSQL
once B's shortened grace is over (5 s in production). Slower checks with real
processes (path aliases, other users, forks, PID namespaces, poolers) are in
test_liveness_*.py.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionBusyError, SessionConfig, open_engine

from .fakes import GatedSummarizer

pytestmark = pytest.mark.anyio

#: B waits this long for the session: many times its grace and its heartbeat, so a B that took A
#: for dead would have taken the session long before.
LEASE_WAIT = 4.0
#: B's grace on PostgreSQL (5 s in production; SQLite has none).
SHORT_GRACE = 0.2

HOLDING = SessionConfig(passivate_after=None, max_episodes=1, evict_to=1.0)
WANTING = SessionConfig(passivate_after=None, lease_wait=LEASE_WAIT)


async def test_an_engine_does_not_take_a_session_from_a_live_engine(store_url: str) -> None:
    await assert_a_live_engine_keeps_its_session(store_url, WANTING)


async def assert_a_live_engine_keeps_its_session(url: str, wanting: SessionConfig) -> None:
    """Engine a holds session "s" with a summary in flight; engine b, its grace short, wants it: b is refused."""
    summarizer = GatedSummarizer()
    with anyio.fail_after(120):
        async with open_engine(url, config=HOLDING, owner="a", summarizer=summarizer) as a:
            await a.session("s").add([Episode("user", "from a"), Episode("user", "evicted")])
            await summarizer.wait_until_called()  # in flight: a keeps the session (store/handover.py)
            async with open_engine(url, config=wanting, owner="b") as b:
                liveness = b.store._liveness  # type: ignore[attr-defined]
                assert liveness is not None, "b holds no liveness lock: this test would prove nothing"
                liveness.grace = min(liveness.grace, SHORT_GRACE)
                with pytest.raises(SessionBusyError) as busy:
                    await b.session("s").add([Episode("user", "from b")])
                assert busy.value.owner == "a"
                assert (await b.store.reap_dead_owners(["a"])).owners == ()
            (episode,) = await a.session("s").add([Episode("user", "a again")])
            assert episode.seq == 3  # a never lost the session
            summarizer.release()
