"""The store commits concurrent writes together, and one failing write fails alone."""

from __future__ import annotations

import threading

import anyio
import anyio.abc
import pytest

from memengine import Episode, StoreError, open_engine
from memengine.store import committer
from memengine.store.sqlite import open_sqlite_store

from .test_eviction_boundary_rides_along import Transactions

pytestmark = pytest.mark.anyio

DEADLINE = 30.0  # seconds: generous, for a loaded machine; only a broken committer gets near it


async def test_concurrent_adds_share_transactions(db_path, stored) -> None:
    statements: list[str] = []
    async with open_engine(db_path) as engine:
        sessions = [engine.session(f"s{n}") for n in range(50)]
        for session in sessions:
            await session.context()  # activate first: count only the adds' transactions
        engine.store._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        async with anyio.create_task_group() as writers:
            for session in sessions:
                writers.start_soon(session.add, [Episode("user", f"hello from {session.id}")])
        engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    commits = [s for s in statements if s == "COMMIT"]
    assert 1 <= len(commits) <= 5  # 50 adds, a handful of transactions
    assert stored.query("SELECT count(*) FROM episodes") == [(50,)]


async def test_a_write_to_an_idle_store_starts_committing_before_the_submitter_yields(db_path, stored) -> None:
    """An idle store starts the transaction from the submitter's own step: no task switch of the committer's first.

    The loop is held (a blocking wait, no checkpoint) right after the submit:
    only a transaction started by the submit itself can run meanwhile.
    """
    in_thread = threading.Event()
    answered: list[object] = []
    done = anyio.Event()

    def answer(result: object, error: BaseException | None) -> None:
        answered.append(error)
        done.set()

    async with open_sqlite_store(db_path) as store:
        token, _ = await store.activate("s", 60.0)
        await store.load_session("s")  # the committer is idle, parked
        store._conn.set_trace_callback(lambda statement: in_thread.set())  # type: ignore[attr-defined]
        store.submit_append("s", token, 1, [Episode("user", "hello")], answer)
        assert in_thread.wait(DEADLINE)  # (the loop does not run until this returns)
        store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
        with anyio.fail_after(DEADLINE):
            await done.wait()
    assert answered == [None]
    assert stored.query("SELECT session_id, seq, content FROM episodes") == [("s", 1, "hello")]


async def test_a_write_right_after_a_transaction_the_committer_started_also_starts_at_once(db_path, stored) -> None:
    """Once the committer has started a transaction itself (a write came while another ran), it parks again.

    A one-at-a-time writer submits its next write as soon as it is answered,
    before the committer's task has had a turn: that write must still start
    its transaction from the submitter's step (it used to wait for that
    turn, a task switch on every later add of such a writer).
    """
    in_thread = threading.Event()
    answers: dict[int, anyio.Event] = {seq: anyio.Event() for seq in (1, 2, 3)}
    errors: list[object] = []

    def answer(seq: int):
        def done(result: object, error: BaseException | None) -> None:
            errors.append(error)
            answers[seq].set()

        return done

    async with open_sqlite_store(db_path) as store:
        token, _ = await store.activate("s", 60.0)
        await store.load_session("s")  # the committer is idle, parked
        store.submit_append("s", token, 1, [Episode("user", "one")], answer(1))  # starts at once
        store.submit_append("s", token, 2, [Episode("user", "two")], answer(2))  # waits: the committer starts it
        with anyio.fail_after(DEADLINE):
            await answers[2].wait()
        # Straight from the answer, with no checkpoint in between, as an agent's next turn comes.
        store._conn.set_trace_callback(lambda statement: in_thread.set())  # type: ignore[attr-defined]
        store.submit_append("s", token, 3, [Episode("user", "three")], answer(3))
        assert in_thread.wait(DEADLINE)  # (the loop does not run until this returns)
        store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
        with anyio.fail_after(DEADLINE):
            await answers[3].wait()
    assert errors == [None, None, None]
    assert stored.query("SELECT seq, content FROM episodes ORDER BY seq") == [(1, "one"), (2, "two"), (3, "three")]


async def test_a_failing_write_fails_alone(db_path, stored) -> None:
    outcomes: dict[str, object] = {}

    def record(name: str):
        def done(result, error) -> None:
            outcomes[name] = error if error is not None else [e.seq for e, _ in result]

        return done

    async with open_sqlite_store(db_path) as store:
        tokens = {name: (await store.activate(name, 60.0))[0] for name in "abc"}
        store.submit_append("a", tokens["a"], 1, [Episode("user", "a1", id="first")], record("a1"))
        await store.load_session("a")  # a1 committed
        # b1 starts a transaction of its own at once (the store is idle); the two submitted while it
        # commits share the next one: a stale seq for "a" fails, the other append must still be stored.
        store.submit_append("b", tokens["b"], 1, [Episode("user", "b1")], record("b1"))
        store.submit_append("a", tokens["a"], 1, [Episode("user", "a-stale", id="second")], record("stale"))
        store.submit_append("c", tokens["c"], 1, [Episode("user", "c1")], record("c1"))
        await store.load_session("c")
    assert outcomes["a1"] == [1] and outcomes["b1"] == [1] and outcomes["c1"] == [1]
    assert isinstance(outcomes["stale"], StoreError)
    assert stored.query("SELECT session_id, content FROM episodes ORDER BY session_id") == [
        ("a", "a1"),
        ("b", "b1"),
        ("c", "c1"),
    ]


async def test_a_group_commit_of_thousands_of_sessions_checks_their_leases_at_once(store_url: str) -> None:
    """Past one statement's worth of leases (1,000), the check still holds: the fast path is kept."""
    from memengine.store import leases
    from memengine.store.open import open_store

    from .conftest import StoreRows

    count = 2500
    async with open_store(store_url) as store:
        pass  # the schema
    StoreRows(store_url).query(
        "INSERT INTO session_leases (session_id, owner, token, expires_at) "
        "SELECT 's' || n, 'me', n, 4102444800 FROM generate_series(1, ?) AS g(n)"
        if store_url.startswith("postgresql://")
        else "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?) "
        "INSERT INTO session_leases (session_id, owner, token, expires_at) SELECT 's' || n, 'me', n, 4102444800 FROM g",
        count,
    )
    held = [(f"s{n}", n) for n in range(1, count + 1)]
    async with open_store(store_url, owner="me") as store:
        assert await store._submit(lambda db: leases.all_held(db, held))  # type: ignore[attr-defined]
        stale = [*held[:1800], ("s1801", 1), *held[1801:]]  # one token of the second statement's share is stale
        assert not await store._submit(lambda db: leases.all_held(db, stale))  # type: ignore[attr-defined]
        missing = [*held, ("never leased", 1)]
        assert not await store._submit(lambda db: leases.all_held(db, missing))  # type: ignore[attr-defined]


def _rider(n: int):
    """An operation that rides along, seen in the trace of the transaction that carried it."""
    return lambda db: db.execute(f"SELECT 'rider {n}'").fetchall()


def _riding(store, group: anyio.abc.TaskGroup, count: int) -> None:
    for n in range(count):
        group.start_soon(lambda n=n: store._submit(_rider(n), ride=3600.0))


def _riders_in(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith("SELECT 'rider")]


async def test_riders_keep_to_a_transactions_bounds(db_path, monkeypatch) -> None:
    """What rides along (summaries, eviction boundaries of many sessions at once) is split at the row bound too."""
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 5)
    transactions = Transactions()
    async with open_engine(db_path) as engine:
        store = engine.store
        store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as group:
                _riding(store, group, 12)
                await anyio.wait_all_tasks_blocked()
                store.hurry_riders()  # (only eviction boundaries riding would not be hurried; these are not)
        store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    carried = [riders for riders in map(_riders_in, transactions.committed) if riders]
    assert sorted(s for riders in carried for s in riders) == sorted(f"SELECT 'rider {n}'" for n in range(12))
    assert max(len(riders) for riders in carried) <= 5, carried


async def test_riders_take_no_room_from_the_write_they_ride_with(db_path, monkeypatch) -> None:
    """An add that fills a transaction takes the riders along: they never push it into a transaction of its own."""
    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 5)
    transactions = Transactions()
    async with open_engine(db_path) as engine:
        session = engine.session("s")
        await session.context()
        store = engine.store
        store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as group:
                _riding(store, group, 3)
                await anyio.wait_all_tasks_blocked()
                await session.add([Episode("user", f"turn {n}") for n in range(5)])  # a full transaction's rows
        store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    (with_add,) = [t for t in transactions.committed if any(s.startswith("INSERT INTO episodes") for s in t)]
    assert sorted(_riders_in(with_add)) == [f"SELECT 'rider {n}'" for n in range(3)]
