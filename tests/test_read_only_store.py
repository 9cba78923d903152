"""A store opened read-only (what ``memengine inspect`` uses) creates nothing, writes nothing, and says so.

On SQLite the file is opened with ``mode=ro``; on PostgreSQL every connection
is a read-only session. Where there are no memengine tables, the error says
exactly that, and the place is left as it was.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from memengine import Episode, StoreError, open_engine
from memengine.store.open import open_store

from .conftest import POSTGRES_SERVER, postgres_schema

pytestmark = pytest.mark.anyio


def postgres_tables(url: str) -> int:
    import psycopg

    schema = url.rsplit("%3D", 1)[1]
    with psycopg.connect(POSTGRES_SERVER) as conn:
        (count,) = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)).fetchone()
    return int(count)


async def test_a_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"

    with pytest.raises(StoreError, match="has no memengine tables"):
        async with open_store(path, read_only=True):
            pass

    assert os.listdir(tmp_path) == []


async def test_an_empty_sqlite_file_gains_no_tables(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()

    with pytest.raises(StoreError, match=r"has no memengine tables \(an empty file\)"):
        async with open_store(path, read_only=True):
            pass

    assert path.stat().st_size == 0


async def test_another_sqlite_database_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE things (name TEXT)")

    with pytest.raises(StoreError, match="has no memengine tables"):
        async with open_store(path, read_only=True):
            pass

    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("things",)]


async def test_an_empty_postgres_schema_gains_no_tables() -> None:
    with postgres_schema() as url:
        with pytest.raises(StoreError, match="has no memengine tables") as raised:
            async with open_store(url, read_only=True):
                pass

        assert postgres_tables(url) == 0
        assert "cannot open the PostgreSQL store at" in str(raised.value)


async def test_a_store_opened_read_only_reads_what_an_engine_wrote(store_url: str) -> None:
    async with open_engine(store_url) as engine:
        await engine.session("s").add([Episode("user", "hello")])

    async with open_store(store_url, read_only=True) as store:
        (row,) = await store.list_sessions()
        snapshot = await store.load_session("s")

    assert row.session_id == "s"
    assert [episode.content for episode in snapshot.episodes] == ["hello"]


async def test_reading_a_sqlite_store_leaves_its_directory_and_file_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with open_engine(path) as engine:
        await engine.session("s").add([Episode("user", "hello")])
    files, content = sorted(os.listdir(tmp_path)), path.read_bytes()

    async with open_store(path, read_only=True) as store:
        await store.list_sessions()

    assert sorted(os.listdir(tmp_path)) == files  # no -wal or -shm file left behind either
    assert path.read_bytes() == content
