"""A store opened read-only (what ``memengine inspect`` uses) creates nothing, writes nothing, and says so.

On SQLite the file is opened with ``mode=ro``; on PostgreSQL every connection
is a read-only session. Where there are no memengine tables, the error says
exactly that, and the place is left as it was.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

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


class Closes:
    """How many of the wrapped connections were being closed at once, at most."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = self.most = 0
        self.closed: list[str] = []

    def wrap(self, conn: Any, name: str) -> Any:
        closes = self

        class Wrapped:
            def close(self) -> None:
                with closes._lock:
                    closes.now += 1
                    closes.most = max(closes.most, closes.now)
                try:
                    time.sleep(0.05)  # (widens the moment: two closes side by side would overlap)
                    conn.close()
                finally:
                    with closes._lock:
                        closes.now -= 1
                        closes.closed.append(name)

            def __getattr__(self, attribute: str) -> Any:
                return getattr(conn, attribute)

        return Wrapped()


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
async def test_a_sqlite_store_closes_its_connections_one_after_another(tmp_path: Path, read_only: bool) -> None:
    """The last to close removes the -wal and -shm files; two closing at once may each leave them to the other."""
    path = tmp_path / "memory.db"
    async with open_engine(path) as engine:
        await engine.session("s").add([Episode("user", "hello")])
    files = sorted(os.listdir(tmp_path))
    closes = Closes()
    async with open_store(path, read_only=read_only) as store:
        await store.list_sessions()
        store._reader = closes.wrap(store._reader, "reader")  # type: ignore[attr-defined]
        store._conn = closes.wrap(store._conn, "writer")  # type: ignore[attr-defined]
        checkpointer = store._checkpointer  # type: ignore[attr-defined]
        if checkpointer is not None and checkpointer._conn is not None:
            checkpointer._conn = closes.wrap(checkpointer._conn, "checkpoints")
    assert "reader" in closes.closed and "writer" in closes.closed, closes.closed
    assert closes.most == 1, closes.closed
    if read_only:
        assert sorted(os.listdir(tmp_path)) == files  # no -wal or -shm file left behind


async def test_reading_a_sqlite_store_leaves_its_directory_and_file_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with open_engine(path) as engine:
        await engine.session("s").add([Episode("user", "hello")])
    files, content = sorted(os.listdir(tmp_path)), path.read_bytes()

    async with open_store(path, read_only=True) as store:
        await store.list_sessions()

    assert sorted(os.listdir(tmp_path)) == files  # no -wal or -shm file left behind either
    assert path.read_bytes() == content
