"""An append under a lease another process has taken is refused, and leaves nothing behind.

Two engines on one database stand for two processes. The first is "paused past
its lease": its lease row is expired behind its back (its renewals, every
third of a long ``lease_ttl``, never come due during a test), so the second
takes the session over through the ordinary activation path. The only thing
that can stop the first engine's write is the store's fence.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, LeaseLostError, SessionConfig, open_engine

from .fakes import turns

pytestmark = pytest.mark.anyio

# A long lease: no renewal may notice the takeover before the write meets the fence.
CONFIG = SessionConfig(passivate_after=None, lease_ttl=60.0, lease_wait=1.0)


def stored(rows) -> list[tuple[str, int, str]]:
    return rows.query("SELECT session_id, seq, content FROM episodes ORDER BY session_id, seq")


def lease(rows, session_id: str) -> tuple[str | None, int]:
    ((owner, token),) = rows.query("SELECT owner, token FROM session_leases WHERE session_id = ?", session_id)
    return owner, token


def pause_past_the_lease(rows, session_id: str) -> None:
    rows.query("UPDATE session_leases SET expires_at = 0 WHERE session_id = ?", session_id)


async def test_an_append_after_a_takeover_is_refused_and_the_next_call_reloads(store_url, rows) -> None:
    async with open_engine(store_url, config=CONFIG, owner="first") as first:
        session = first.session("s")
        await session.add(turns(2))
        pause_past_the_lease(rows, "s")
        async with open_engine(store_url, config=CONFIG, owner="second") as second:
            await second.session("s").context()  # takes the session over
            assert lease(rows, "s") == ("second", 2)

            with pytest.raises(LeaseLostError):
                await session.add([Episode("user", "from the stale owner")])
            assert stored(rows) == [("s", 1, "turn 1"), ("s", 2, "turn 2")]

            (theirs,) = await second.session("s").add([Episode("user", "from the new owner")])
            assert theirs.seq == 3
        # The second process has exited (and let the session go): the next call
        # activates the session anew, from what the store holds.
        (mine,) = await session.add([Episode("user", "after the takeover")])
        assert mine.seq == 4
        assert lease(rows, "s") == ("first", 3)
        context = await session.context()
        assert [e.content for e in context.episodes] == ["turn 1", "turn 2", "from the new owner", "after the takeover"]
    assert stored(rows) == [
        ("s", 1, "turn 1"),
        ("s", 2, "turn 2"),
        ("s", 3, "from the new owner"),
        ("s", 4, "after the takeover"),
    ]


async def test_a_stale_append_committed_together_with_live_ones_refuses_only_itself(store_url, rows) -> None:
    async with open_engine(store_url, config=CONFIG, owner="first") as first:
        for session_id in ("a", "s", "z"):
            await first.session(session_id).add(turns(1))
        pause_past_the_lease(rows, "s")
        async with open_engine(store_url, config=CONFIG, owner="second") as second:
            await second.session("s").context()
            refused: list[str] = []

            async def add(session_id: str) -> None:
                try:
                    await first.session(session_id).add(turns(1, start=2))
                except LeaseLostError:
                    refused.append(session_id)

            # Sent together, so that the three appends may share a group commit.
            async with anyio.create_task_group() as tasks:
                for session_id in ("a", "s", "z"):
                    tasks.start_soon(add, session_id)
            assert refused == ["s"]
    assert stored(rows) == [
        ("a", 1, "turn 1"),
        ("a", 2, "turn 2"),
        ("s", 1, "turn 1"),
        ("z", 1, "turn 1"),
        ("z", 2, "turn 2"),
    ]
