"""The group commit's one-query lease check: right answers on both stores, and no scan of every lease row."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import Episode, open_engine
from memengine.store import leases
from memengine.store.dialect import Db, postgres_dialect, sqlite_dialect

from .conftest import StoreRows


def _make_schema(url: str) -> None:
    async def touch() -> None:
        async with open_engine(url) as engine:
            await engine.session("warm-up").add([Episode("user", "hello")])

    anyio.run(touch)


@contextmanager
def _db(url: str) -> Iterator[Db]:
    if url.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(url) as conn:
            yield Db(conn, postgres_dialect())
        return
    conn = sqlite3.connect(url, isolation_level=None)
    try:
        yield Db(conn, sqlite_dialect())
    finally:
        conn.close()


def _lease(db: Db, session_id: str, token: int, live: bool) -> None:
    expires = "{now} + 3600" if live else "{now} - 1"
    db.execute(
        f"INSERT INTO session_leases (session_id, owner, token, expires_at) VALUES (?, 'someone', ?, {expires})",
        (session_id, token),
    )


def test_all_held_answers_as_each_lease_row_says(store_url: str) -> None:
    _make_schema(store_url)
    with _db(store_url) as db:
        _lease(db, "a", 3, live=True)
        _lease(db, "b", 1, live=True)
        _lease(db, "old", 2, live=False)
        assert leases.all_held(db, [("a", 3), ("b", 1)])
        assert leases.all_held(db, [("a", 3), ("a", 3)])  # the same lease twice
        assert not leases.all_held(db, [("a", 2), ("b", 1)])  # a stale token
        assert not leases.all_held(db, [("a", 3), ("a", 4)])  # one session under two tokens
        assert not leases.all_held(db, [("a", 3), ("old", 2)])  # an expired lease
        assert not leases.all_held(db, [("a", 3), ("never", 1)])  # no lease row at all
        assert not leases.all_held(db, [("a", 3), ("A", 3)])  # ids are compared exactly


def test_the_lease_check_finds_its_rows_by_key_among_many(tmp_path: Path) -> None:
    """Every group commit checks its sessions' leases: with many leases in the store it must not scan them all."""
    path = str(tmp_path / "memory.db")
    _make_schema(path)
    rows = StoreRows(path)
    rows.query(  # sessions once active, now released: their lease rows stay (tokens never repeat)
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) "
        "INSERT INTO session_leases (session_id, owner, token, expires_at) SELECT 'idle-' || i, NULL, 1, 0 FROM n"
    )
    statements: list[str] = []
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("ANALYZE")  # as a long-lived store would have statistics; the plan must not need them either
        conn.set_trace_callback(statements.append)
        db = Db(conn, sqlite_dialect())
        _lease(db, "a", 1, live=True)
        _lease(db, "b", 1, live=True)
        statements.clear()
        assert leases.all_held(db, [("a", 1), ("b", 1)])
        (check,) = statements
        plan: list[Any] = conn.execute("EXPLAIN QUERY PLAN " + check).fetchall()  # (values bound in the text)
    finally:
        conn.close()
    details = " | ".join(str(row[-1]) for row in plan)
    assert "SEARCH session_leases" in details and "SCAN session_leases" not in details, details


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_lease_renewals_run_first_in_their_transaction_ahead_of_grouped_appends(tmp_path: Path, backend: str) -> None:
    """A renewal rides in the next transaction, first: a lease about to lapse is extended before any write checks it."""
    from memengine.store.open import open_store

    path = str(tmp_path / "memory.db")
    statements: list[str] = []

    async def main() -> None:
        async with open_store(path) as store:
            token, _ = await store.activate("s", 60.0)
            store._conn.set_trace_callback(statements.append)  # the committer's connection
            appended = anyio.Event()
            async with anyio.create_task_group() as tasks:
                # The committer is kept busy meanwhile, so that the renewal and the append share the next batch.
                tasks.start_soon(store._submit, lambda db: time.sleep(0.5))
                await anyio.sleep(0.1)
                tasks.start_soon(store.renew_leases, [("s", token)], 60.0)
                store.submit_append("s", token, 1, [Episode("user", "hello")], lambda result, error: appended.set())
                await appended.wait()
            store._conn.set_trace_callback(None)

    anyio.run(main, backend=backend)
    renewal = next(i for i, sql in enumerate(statements) if sql.startswith("UPDATE session_leases SET expires_at"))
    insert = next(i for i, sql in enumerate(statements) if sql.startswith("INSERT INTO episodes"))
    assert renewal < insert, statements
