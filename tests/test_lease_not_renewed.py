"""A lease the engine's renewal left out is confirmed by its session before the session gives up.

A renewal of every active lease can leave one out without its being lost:
on PostgreSQL its row may have been locked at that moment (another replica's
activation, this process's own write), and a renewal that cannot wait for a
row returns the others. Giving such a session up reloads it for nothing
(and cancels its summarizer child). The session renews its lease alone
first, and gives up only if the store refuses that.
"""

from __future__ import annotations

import pytest

from memengine import Episode, LeaseLostError, SessionConfig, open_engine
from memengine.session.messages import LeaseNotRenewed

from .conftest import StoreRows

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(passivate_after=None, lease_ttl=60.0, lease_wait=0.5)


def not_renewed(engine, session_id: str) -> None:
    """What the engine's renewal sends a session it did not renew."""
    actor = engine._actors[session_id]
    actor.mailbox.put_if_open(LeaseNotRenewed(LeaseLostError(f"session {session_id!r}: not renewed")))


async def test_a_lease_still_held_is_kept_when_a_renewal_left_it_out(store_url: str, rows: StoreRows) -> None:
    async with open_engine(store_url, config=CONFIG) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "hello")])
        not_renewed(engine, "s")
        (again,) = await session.add([Episode("user", "still here")])
        assert again.seq == 2
        assert [e.content for e in (await session.context()).episodes] == ["hello", "still here"]
    # Never given up and loaded again: its first activation's token served it to the end.
    assert rows.query("SELECT token FROM session_leases WHERE session_id = 's'") == [(1,)]


async def test_a_lease_taken_over_is_given_up_when_a_renewal_left_it_out(store_url: str, rows: StoreRows) -> None:
    async with open_engine(store_url, config=CONFIG) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "hello")])
        # Another process took the session over (its lease expired while this one was paused, say).
        rows.query("UPDATE session_leases SET owner = 'other', token = token + 1 WHERE session_id = 's'")
        not_renewed(engine, "s")
        # Given up: the next call finds the session busy with its new owner, not this activation's memory.
        with pytest.raises(Exception) as refused:
            await session.context()
        assert type(refused.value).__name__ in ("SessionBusyError", "LeaseLostError"), refused.value
