"""Recall finds every live episode, never a deleted one, and survives a damaged index.

Checked on what users get (the hits of ``engine.recall``, the output of
``memengine reindex``) and on the rows the store holds, on SQLite and
PostgreSQL where the store is involved, under asyncio and trio.
"""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from collections.abc import Iterable, Sequence
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.engine import Engine
from memengine.store.open import is_postgres_url

from .conftest import StoreRows

pytestmark = pytest.mark.anyio

# A window no test here overflows: no summarizer runs, recall alone is at work.
QUIET = SessionConfig(evict_to=1.0, max_episodes=100_000, max_chars=100_000_000, passivate_after=None)
QUERY_WORDS = 1_000  # recall uses the first 1,000 distinct words of a query


def words(count: int, start: int = 0) -> list[str]:
    return [f"word{n}" for n in range(start, start + count)]


async def recalled(engine: Engine, wanted: Sequence[str]) -> list[str]:
    """Every content recall finds for these words, asked a query's worth of words at a time (with repeats)."""
    contents = []
    for start in range(0, len(wanted), QUERY_WORDS):
        hits = await engine.recall(
            " ".join(wanted[start : start + QUERY_WORDS]), all_sessions=True, limit=10 * QUERY_WORDS
        )
        assert all(isinstance(hit.score, float) and math.isfinite(hit.score) for hit in hits)
        contents.extend(hit.episode.content for hit in hits)
    return contents


def missing(expected: Iterable[str], found: Iterable[str]) -> str:
    gone = sorted(set(expected) - set(found), key=lambda word: int(word.removeprefix("word")))
    return f"{len(gone)} never found, e.g. {gone[:3]}" if gone else ""


class WritesHeld:
    """Another connection holding the store's write lock (SQLite) or the episodes table (PostgreSQL)."""

    def __init__(self, url: str) -> None:
        if is_postgres_url(url):
            import psycopg

            self._conn = psycopg.connect(url)
            self._conn.execute("LOCK TABLE episodes IN EXCLUSIVE MODE")
        else:
            self._conn = sqlite3.connect(url, isolation_level=None)
            self._conn.execute("BEGIN IMMEDIATE")
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._conn.rollback()
            self._conn.close()


# -- every live episode is found -------------------------------------------------


async def test_every_episode_is_found_after_one_add_of_ten_thousand(store_url) -> None:
    stored = words(10_000)
    async with open_engine(store_url, config=QUIET) as engine:
        await engine.session("bulk").add([Episode("user", word) for word in stored])

        found = await recalled(engine, stored)
        assert not missing(stored, found), missing(stored, found)
        assert len(found) == len(stored)  # each once
        assert [hit.episode.content for hit in await engine.recall("word9999", all_sessions=True)] == ["word9999"]
    async with open_engine(store_url, config=QUIET) as engine:
        assert [hit.episode.content for hit in await engine.recall("word4000 word9998", all_sessions=True)] in (
            ["word4000", "word9998"],
            ["word9998", "word4000"],
        )


async def test_every_episode_is_found_after_thousands_of_appends_pile_up_before_one_commit(store_url) -> None:
    sessions, each = 60, 100
    async with open_engine(store_url, config=QUIET) as engine:
        handles = [engine.session(f"s{n}") for n in range(sessions)]
        for handle in handles:
            await handle.context()  # activated now, so that the adds below only append
        held = WritesHeld(store_url)
        try:
            async with anyio.create_task_group() as adders:
                for n, handle in enumerate(handles):
                    adders.start_soon(handle.add, [Episode("user", word) for word in words(each, n * each)])
                await anyio.wait_all_tasks_blocked()  # every add waits behind the held lock: 6,000 appends pile up
                held.release()
        finally:
            held.release()

        stored = words(sessions * each)
        found = await recalled(engine, stored)
        assert not missing(stored, found), missing(stored, found)
        assert len(found) == len(stored)


async def test_deleting_episodes_never_recalled_keeps_recall_working_and_they_are_never_found(
    store_url, rows: StoreRows
) -> None:
    stored = words(10_000)
    async with open_engine(store_url, config=QUIET) as engine:
        session = engine.session("bulk")
        await session.add([Episode("user", f"common {word}") for word in stored])
        # The newest, one in the middle and the first: none of them recalled (nor indexed) yet.
        doomed = [*range(9_990, 10_001), 5_000, 1]
        assert await session.delete_episodes(doomed) == len(doomed)
        live = [word for seq, word in enumerate(stored, 1) if seq not in doomed]

        hits = await engine.recall("common", all_sessions=True, limit=10_000)
        assert sorted(hit.episode.content for hit in hits) == sorted(f"common {word}" for word in live)
        assert all(isinstance(hit.score, float) and math.isfinite(hit.score) for hit in hits)
        found = [content.split()[1] for content in await recalled(engine, stored)]
        assert sorted(found) == sorted(live)

        # And deleting episodes recall has seen, then adding over their place, keeps it exact.
        assert await session.delete_episodes([9_989, 9_988, 2]) == 3
        await session.add([Episode("user", "common newcomer")])
        hits = await engine.recall("common word9989 word9988 word1 newcomer", all_sessions=True, limit=10_000)
        assert len(hits) == len(live) - 2
        assert {"common word9988", "common word9987", "common word1"}.isdisjoint(h.episode.content for h in hits)
        assert "common newcomer" in {hit.episode.content for hit in hits}
    async with open_engine(store_url, config=QUIET) as engine:
        assert [hit.episode.content for hit in await engine.recall("word9987 word4999 word0", all_sessions=True)] == []
        assert [hit.episode.content for hit in await engine.recall("newcomer", all_sessions=True)] == [
            "common newcomer"
        ]
    if not is_postgres_url(store_url):
        # The full-text index agrees with the journal: it holds no deleted row and misses no live one.
        rows.query("INSERT INTO episodes_fts (episodes_fts, rank) VALUES ('integrity-check', 1)")


# -- a damaged index is rebuilt ---------------------------------------------------

DAMAGE = {
    "newest rows taken out of the index": (
        "DELETE FROM episodes_fts WHERE rowid > (SELECT max(rowid) - 40 FROM episodes)"
    ),
    "the index emptied": "INSERT INTO episodes_fts (episodes_fts) VALUES ('delete-all')",
    "the shadow tables emptied": (
        "DELETE FROM episodes_fts_data; DELETE FROM episodes_fts_idx; DELETE FROM episodes_fts_docsize"
    ),
    "its configuration lost": "DELETE FROM episodes_fts_config",
    "the index table dropped": "DROP TABLE episodes_fts",
    "the watermark set too high": "UPDATE fts_state SET indexed_through = indexed_through + 1000",
    "the watermark set too low": "UPDATE fts_state SET indexed_through = 0",
    "the watermark lost": "DROP TABLE fts_state",
    # What the old catch-up did: delete commands for rows that were never in the index.
    "deletes of rows never indexed": (
        "INSERT INTO episodes_fts (episodes_fts, rowid, content) "
        "SELECT 'delete', rowid + 100000, content FROM episodes WHERE rowid % 3 = 0"
    ),
}


def damage(db: Path, how: str) -> None:
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        conn.executescript(DAMAGE[how])


def index_agrees_with_journal(db: Path) -> None:
    """FTS5's own check: every live episode indexed with its content, nothing else (raises if not)."""
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("INSERT INTO episodes_fts (episodes_fts, rank) VALUES ('integrity-check', 1)")


async def add_common(engine: Engine, stored: list[str]) -> None:
    await engine.session("s").add([Episode("user", f"common {word}") for word in stored])


async def assert_all_found(engine: Engine, stored: list[str]) -> None:
    hits = await engine.recall("common", all_sessions=True, limit=10_000)
    assert sorted(hit.episode.content for hit in hits) == sorted(f"common {word}" for word in stored)
    assert all(isinstance(hit.score, float) and math.isfinite(hit.score) for hit in hits)
    found = [content.split()[1] for content in await recalled(engine, stored)]
    assert not missing(stored, found), missing(stored, found)
    assert len(found) == len(stored)


# A running engine's connection keeps the configuration FTS5 read when it opened the
# index (and works on with it): its loss shows to the next process, tested below.
@pytest.mark.parametrize("how", [how for how in DAMAGE if how != "its configuration lost"])
async def test_an_index_damaged_behind_a_running_engine_is_rebuilt_by_the_next_recall(db_path, how) -> None:
    async with open_engine(db_path, config=QUIET) as engine:
        await add_common(engine, words(300))
        await assert_all_found(engine, words(300))  # indexed up to here

        damage(db_path, how)
        await add_common(engine, words(100, 300))

        await assert_all_found(engine, words(400))
        await engine.session("s").delete_episodes([1, 400])  # deletes work on the rebuilt index
        await assert_all_found(engine, words(398, 1))
    index_agrees_with_journal(db_path)


@pytest.mark.parametrize("how", DAMAGE)
async def test_an_index_damaged_while_no_engine_runs_is_rebuilt(db_path, how) -> None:
    async with open_engine(db_path, config=QUIET) as engine:
        await add_common(engine, words(300))
        await assert_all_found(engine, words(300))
        await add_common(engine, words(100, 300))  # stored, not indexed yet

    damage(db_path, how)

    async with open_engine(db_path, config=QUIET) as engine:
        await engine.session("s").delete_episodes([1, 400])
        await assert_all_found(engine, words(398, 1))
    index_agrees_with_journal(db_path)


# -- memengine reindex ----------------------------------------------------------------


def reindex(db: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memengine.cli", "reindex", str(db)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
    )


def matches(db: Path, word: str) -> int:
    with closing(sqlite3.connect(db)) as conn:
        ((count,),) = conn.execute("SELECT count(*) FROM episodes_fts WHERE episodes_fts MATCH ?", (word,))
    return int(count)


async def test_reindex_rebuilds_an_index_missing_rows(db_path) -> None:
    async with open_engine(db_path, config=QUIET) as engine:
        await add_common(engine, words(300))
        await assert_all_found(engine, words(300))
    # Damage nothing else reveals: rows in the middle of the index, gone.
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        conn.execute("DELETE FROM episodes_fts WHERE rowid BETWEEN 100 AND 149")
    assert matches(db_path, "common") == 250

    result = reindex(db_path)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [f"rebuilt the recall index of {db_path}: 300 episodes indexed"]
    assert matches(db_path, "common") == 300
    index_agrees_with_journal(db_path)
    async with open_engine(db_path, config=QUIET) as engine:
        await assert_all_found(engine, words(300))


@pytest.mark.parametrize("how", ["the index table dropped", "the shadow tables emptied", "the watermark lost"])
async def test_reindex_rebuilds_a_broken_index(db_path, how) -> None:
    async with open_engine(db_path, config=QUIET) as engine:
        await add_common(engine, words(300))
    damage(db_path, how)

    result = reindex(db_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"rebuilt the recall index of {db_path}: 300 episodes indexed"]
    assert matches(db_path, "common") == 300
    index_agrees_with_journal(db_path)


async def test_reindex_rebuilds_postgresql_s_text_index(store_url) -> None:
    if not is_postgres_url(store_url):
        pytest.skip("the SQLite case has tests of its own")
    async with open_engine(store_url, config=QUIET) as engine:
        await add_common(engine, words(300))

    result = reindex(store_url)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [f"rebuilt the recall index of {store_url}: 300 episodes indexed"]
    async with open_engine(store_url, config=QUIET) as engine:
        await assert_all_found(engine, words(300))


def test_reindex_of_a_missing_file_fails_in_one_line_without_creating_it(tmp_path: Path) -> None:
    absent = tmp_path / "absent.db"

    result = reindex(absent)

    assert result.returncode == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"memengine reindex: cannot read {absent}: no such file"]
    assert list(tmp_path.iterdir()) == []


def test_reindex_leaves_other_sqlite_databases_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE things (name TEXT)")

    result = reindex(other)

    assert result.returncode == 3
    assert len(result.stderr.splitlines()) == 1 and "not a memengine store" in result.stderr
    with closing(sqlite3.connect(other)) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("things",)]


def test_reindex_of_an_unreachable_server_fails_in_one_line() -> None:
    result = reindex("postgresql://nobody@127.0.0.1:1/nothing")

    assert result.returncode == 3
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "memengine reindex: cannot connect to PostgreSQL at postgresql://nobody@127.0.0.1:1"
    )


# -- long queries -------------------------------------------------------------------


async def test_a_query_of_seventy_thousand_words_uses_its_first_thousand_distinct_words(store_url) -> None:
    async with open_engine(store_url, config=QUIET) as engine:
        await engine.session("s").add(
            [Episode("user", word) for word in ("word0", "word999", "word1000", "word69999", "unrelated")]
        )

        def found(hits) -> set[str]:
            return {hit.episode.content for hit in hits}

        assert found(await engine.recall(" ".join(words(70_000)), all_sessions=True, limit=100)) == {"word0", "word999"}
        # Distinct words count, case aside: a repeated word is one word.
        repeated = " ".join(["WORD69999", "word69999"] * 35_000 + ["word1000"])
        assert found(await engine.recall(repeated, all_sessions=True, limit=100)) == {"word69999", "word1000"}
        in_session = await engine.recall(" ".join(reversed(words(70_000))), session_id="s", limit=100)
        assert found(in_session) == {"word69999"}  # word69000..word69999, the first thousand
