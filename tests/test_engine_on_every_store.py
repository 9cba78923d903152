"""The engine behaves the same on every store backend (SQLite and PostgreSQL).

The engine-level promises, run through ``open_engine(store_url)`` on both
backends and both async libraries, checked on what callers get and on the
rows the store holds.
"""

from __future__ import annotations

import anyio
import attrs
import pytest

from memengine import Episode, LeaseLostError, SessionBusyError, SessionConfig, open_engine
from memengine.store.open import open_store

from .fakes import RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

SMALL = SessionConfig(evict_to=1.0, max_episodes=3, retain_every=4, passivate_after=None)


def turns(count: int, start: int = 1) -> list[Episode]:
    return [Episode("user", f"turn {n}") for n in range(start, start + count)]


async def test_a_window_and_summary_without_gap_or_overlap_survive_a_restart(store_url, rows) -> None:
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=SMALL) as engine:
        session = engine.session("s")
        for episode in turns(8):
            await session.add([episode])
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 6)]
        assert [e.seq for e in context.episodes] == [6, 7, 8]
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=SMALL) as engine:
        context = await engine.session("s").context()
        assert covered(context.summary) + [e.content for e in context.episodes] == [f"turn {n}" for n in range(1, 9)]
        (again,) = await engine.session("s").add([context.episodes[0]])  # idempotent by id
        assert again.seq == 6
    assert rows.query("SELECT count(*) FROM episodes") == [(8,)]


async def test_clear_and_delete_leave_no_summary_of_removed_text(store_url, rows) -> None:
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=SMALL) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "secret"), *turns(4)])
        await session.context(wait_for_summary=True)
        assert await session.delete_episodes([1]) == 1
        context = await session.context(wait_for_summary=True)
        assert "secret" not in (context.summary or "")
        await session.clear()
        assert (await session.context()).episodes == ()
        (episode,) = await session.add([Episode("user", "after clear")])
        assert episode.seq == 6
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]
    assert rows.query("SELECT seq, content FROM episodes") == [(6, "after clear")]


async def test_retain_hands_every_episode_on_once_in_order(store_url, rows) -> None:
    sink = RecordingSink()
    async with open_engine(store_url, retain_sink=sink, config=SMALL) as engine:
        session = engine.session("s")
        for episode in turns(10):
            await session.add([episode])
        await session.close()
    assert sink.delivered_contents() == [f"turn {n}" for n in range(1, 11)]
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 4), (5, 8), (9, 10)]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_recall_searches_every_session(store_url) -> None:
    async with open_engine(store_url) as engine:
        await engine.session("a").add([Episode("user", "my cat is called Miso"), Episode("user", "hello")])
        await engine.session("b").add([Episode("user", "the cat sleeps all day")])
        found = await engine.recall("cat", all_sessions=True)
        assert {(hit.session_id, hit.episode.content) for hit in found} == {
            ("a", "my cat is called Miso"),
            ("b", "the cat sleeps all day"),
        }
        assert [hit.episode.content for hit in await engine.recall("cat", session_id="b")] == ["the cat sleeps all day"]


async def test_leases_are_released_when_the_engine_exits(store_url, rows) -> None:
    async with open_engine(store_url, owner="first") as engine:
        await engine.session("s").add(turns(1))
        assert rows.query("SELECT owner FROM session_leases WHERE session_id = ?", "s") == [("first",)]
    assert rows.query("SELECT owner FROM session_leases WHERE session_id = ?", "s") == [(None,)]
    async with open_engine(store_url, owner="second", config=SessionConfig(lease_wait=0)) as engine:
        (episode,) = await engine.session("s").add(turns(1, start=2))  # no wait: the lease was released
        assert episode.seq == 2


async def test_a_session_whose_lease_was_taken_refuses_the_write_and_reloads_for_the_next(store_url, rows) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=3, passivate_after=None, lease_wait=0.2)
    async with open_engine(store_url, config=config, owner="first") as engine:
        session = engine.session("s")
        await session.add(turns(2))
        # Another process takes the session over (as after this one was paused past its lease) and writes.
        token = rows.query(
            "UPDATE session_leases SET owner = 'other', token = token + 1, expires_at = expires_at + 600 "
            "WHERE session_id = ? RETURNING token",
            "s",
        )[0]
        rows.query(
            "INSERT INTO episodes (session_id, seq, id, role, content, created_at, metadata) "
            "VALUES (?, 3, 'from-other', 'user', 'written by the other process', '2026-01-01T00:00:00+00:00', '{}')",
            "s",
        )
        with pytest.raises(LeaseLostError, match="nothing was stored"):
            await session.add([Episode("user", "from a stale owner")])
        with pytest.raises(SessionBusyError, match="other"):
            await engine.session("s").add([Episode("user", "while the other owns it")])
        rows.query("UPDATE session_leases SET owner = NULL, expires_at = 0 WHERE session_id = ?", "s")
        (episode,) = await engine.session("s").add([Episode("user", "after the other let go")])
        assert episode.seq == 4  # reloaded from the store: the other's episode 3 is there
        context = await engine.session("s").context()
        assert [e.content for e in context.episodes][-2:] == ["written by the other process", "after the other let go"]
        assert token[0] > 1
    assert [content for (content,) in rows.query("SELECT content FROM episodes ORDER BY seq")] == [
        "turn 1",
        "turn 2",
        "written by the other process",
        "after the other let go",
    ]


async def test_a_batch_stays_claimed_while_a_slow_sink_call_outlasts_the_claim(store_url) -> None:
    entered, release = anyio.Event(), anyio.Event()

    class SlowSink:
        mode = "append"

        def __init__(self) -> None:
            self.batches: list = []

        async def retain(self, batch) -> None:
            entered.set()
            await release.wait()
            self.batches.append(batch)

    sink = SlowSink()
    async with (
        open_engine(store_url, retain_sink=sink, config=attrs.evolve(SMALL, retain_claim_seconds=0.6)) as engine,
        open_store(store_url, owner="other process") as other,
    ):
        await engine.session("s").add(turns(4))  # one full batch
        await entered.wait()
        await anyio.sleep(1.5)  # well past the first claim
        (entry,) = await other.pending_retains(10)
        assert await other.claim_retain(entry.id, entry.key, 60.0) == "busy"
        release.set()
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 4)]
