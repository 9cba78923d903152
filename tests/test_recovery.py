"""Reopening the store restores each session; schema work happens once, at open."""

from __future__ import annotations

import sqlite3

import pytest

from memengine import Episode, SessionConfig, StoreError, open_engine
from memengine.store.sqlite import open_sqlite_store
from memengine.store.sqlite.schema import SCHEMA_VERSION

from .fakes import RecordingSummarizer, add_each, covered, turns

pytestmark = pytest.mark.anyio

SMALL_WINDOW = SessionConfig(evict_to=1.0, max_episodes=3)


async def test_reopen_restores_summary_and_window(db_path) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(9))
        before = await session.context(wait_for_summary=True)
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        after = await engine.session("s").context()
    assert after == before
    assert covered(after.summary) == [f"turn {i}" for i in range(1, 7)]
    assert [e.seq for e in after.episodes] == [7, 8, 9]


async def _load_cost(store, session_id: str) -> int:
    """SQLite virtual-machine steps spent loading a session: a deterministic cost measure."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    reader = store._reader  # loading a session is a read: it runs on the store's read connection
    reader.set_progress_handler(count, 10)
    try:
        await store.load_session(session_id)
    finally:
        reader.set_progress_handler(None, 0)
    return steps


async def test_recovery_reads_the_window_not_the_history(db_path) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=SMALL_WINDOW) as engine:
        for session_id, history in (("short", 40), ("long", 4000)):
            session = engine.session(session_id)
            for start in range(1, history + 1, 500):
                await session.add(turns(min(500, history - start + 1), start=start))
            context = await session.context(wait_for_summary=True)
            assert len(context.episodes) == 3
    async with open_sqlite_store(db_path) as store:
        short, long = await _load_cost(store, "short"), await _load_cost(store, "long")
    # 100x the history may cost a few extra index levels, nothing proportional.
    assert long < short * 2, (short, long)


async def test_schema_is_created_once_not_per_session(db_path) -> None:
    statements: list[str] = []
    async with open_engine(db_path) as engine:
        engine.store._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        for name in ("a", "b", "c"):
            await engine.session(name).add([Episode("user", "hi")])
            await engine.session(name).clear()
        engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    assert statements
    # FTS5 reads "PRAGMA 'main'.data_version" to check its cache (when a clear reaches the index): not schema work.
    schema_work = [
        s
        for s in statements
        if s.lstrip().upper().startswith(("CREATE", "ALTER", "DROP", "PRAGMA")) and "data_version" not in s
    ]
    assert schema_work == []
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()


async def test_a_newer_schema_is_refused(db_path) -> None:
    async with open_engine(db_path):
        pass
    conn = sqlite3.connect(db_path)
    # A version ahead whose compatibility window does not reach back to this code.
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.execute("UPDATE memengine_schema SET compatible_back = 0")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        async with open_engine(db_path):
            pass


async def test_memory_store_works(anyio_backend) -> None:
    async with open_engine(":memory:", config=SMALL_WINDOW) as engine:
        session = engine.session("s")
        await add_each(session, turns(5))
        context = await session.context(wait_for_summary=True)
        assert [e.seq for e in context.episodes] == [3, 4, 5]
        assert context.summarized_through == 2


async def test_full_synchronous_mode_is_accepted_and_nonsense_refused(db_path) -> None:
    async with open_engine(db_path, synchronous="FULL") as engine:
        (episode,) = await engine.session("s").add([Episode("user", "fsynced")])
        assert episode.seq == 1
        assert engine.store._conn.execute("PRAGMA synchronous").fetchone() == (2,)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="synchronous"):
        async with open_engine(db_path, synchronous="SOMETIMES"):
            pass
