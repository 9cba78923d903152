from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from trio.testing import MockClock


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def virtual_time_backends():
    """Backends for tests about time: trio with a MockClock, asyncio in real time.

    The MockClock jumps only after every task has waited 0.1 s of real time, so
    it skips idle waits but not the moments the engine waits on its SQLite
    thread (a threshold of 0 would age sessions during every commit).
    """
    return pytest.fixture(params=["asyncio", "trio"])(_virtual_time_backend)


def _virtual_time_backend(request: pytest.FixtureRequest):
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0.1)})
    return "asyncio"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def stored(db_path: Path) -> Iterator[StoredRows]:
    yield StoredRows(db_path)


class StoredRows:
    """Reads what is really in the database file, behind the engine's back."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, *params: object) -> list[tuple]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def episodes(self, session_id: str) -> list[tuple[int, str]]:
        return self.query("SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", session_id)

    def summaries(self, session_id: str) -> list[tuple[int, str]]:
        return self.query(
            "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq", session_id
        )
