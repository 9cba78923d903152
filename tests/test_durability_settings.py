"""The durability each store runs at, as documented, and how a user chooses another.

SQLite: ``PRAGMA synchronous`` on the writing connection, ``NORMAL`` unless
``open_engine(..., synchronous="FULL")`` (the OpenAI Agents SDK's
``SQLiteSession`` runs at SQLite's default, ``FULL``). PostgreSQL: memengine
sets no ``synchronous_commit``: the server's setting applies (``on`` by
default), and a URL option sets another for the engine's connections.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memengine import Episode, open_engine

from .conftest import postgres_schema

pytestmark = pytest.mark.anyio

SQLITE_LEVELS = {1: "NORMAL", 2: "FULL"}


def sqlite_synchronous(engine: object) -> str:
    (level,) = engine.store._conn.execute("PRAGMA synchronous").fetchone()  # type: ignore[attr-defined]
    return SQLITE_LEVELS[level]


@pytest.mark.parametrize("asked", [None, "NORMAL", "FULL"])
async def test_sqlite_runs_at_normal_unless_full_is_asked_for(tmp_path: Path, asked: str | None) -> None:
    options = {} if asked is None else {"synchronous": asked}
    async with open_engine(tmp_path / "m.db", **options) as engine:  # type: ignore[arg-type]
        await engine.session("s").add([Episode("user", "hello")])
        assert sqlite_synchronous(engine) == (asked or "NORMAL")


async def test_sqlite_refuses_a_level_it_does_not_document(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        async with open_engine(tmp_path / "m.db", synchronous="OFF"):
            pass


def postgres_synchronous_commit(engine: object) -> list[str]:
    store = engine.store  # type: ignore[attr-defined]
    return [conn.execute("SHOW synchronous_commit").fetchone()[0] for conn in (store._conn, store._reader)]


async def test_postgres_runs_at_the_servers_synchronous_commit_and_the_url_can_set_another() -> None:
    with postgres_schema() as url:
        async with open_engine(url) as engine:
            await engine.session("s").add([Episode("user", "hello")])
            assert postgres_synchronous_commit(engine) == ["on", "on"]  # the test server's, PostgreSQL's default
        async with open_engine(url + "%20-c%20synchronous_commit%3Doff") as engine:
            await engine.session("s").add([Episode("user", "again")])
            assert postgres_synchronous_commit(engine) == ["off", "off"]
