"""A session's mailbox is bounded: callers past the bound wait for room, and a caller that gives up sent nothing.

Calls to one session are queued in its mailbox and handled in order. When the
session cannot keep up (here: another process holds its lease, so nothing is
handled yet), at most ``SessionConfig.mailbox_capacity`` calls wait in the
mailbox; further callers wait *before* sending (back-pressure), and a caller
cancelled while it waits sent nothing at all.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store.open import open_store

from .conftest import StoreRows

pytestmark = pytest.mark.anyio

GUARD = 10


async def test_callers_past_the_bound_wait_and_a_cancelled_one_sends_nothing(store_url: str, rows: StoreRows) -> None:
    config = SessionConfig(mailbox_capacity=3, lease_wait=GUARD, passivate_after=None)
    async with open_engine(store_url, config=config) as engine, open_store(store_url, owner="other") as other:
        token, _ = await other.activate("s", 60.0)  # another process holds the session: nothing is handled yet
        session = engine.session("s")
        done: list[int] = []

        async def add(number: int) -> None:
            (stored,) = await session.add([Episode("user", f"call {number}", id=f"call-{number}")])
            done.append(stored.seq)  # type: ignore[arg-type]

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:
                for number in range(3):
                    callers.start_soon(add, number)
                await anyio.wait_all_tasks_blocked()
                # The mailbox is full: a fourth caller waits before sending, and gives up.
                with anyio.move_on_after(0.05) as gave_up:
                    await session.add([Episode("user", "never sent", id="never")])
                assert gave_up.cancelled_caught
                await other.release_lease("s", token)  # the session is free: the three are handled
        assert sorted(done) == [1, 2, 3]
        (fifth,) = await session.add([Episode("user", "after", id="after")])
        assert fifth.seq == 4
    stored = [episode_id for (episode_id,) in rows.query("SELECT id FROM episodes WHERE session_id = 's' ORDER BY seq")]
    assert sorted(stored[:3]) == ["call-0", "call-1", "call-2"] and stored[3:] == ["after"]  # callers race to send
