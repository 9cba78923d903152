"""An eviction boundary costs no commit of its own: it rides along with the next transaction, or commits alone later.

Every add that pushes episodes out of the window moves the session's
eviction boundary, which is stored so that a reload shows the same window.
It used to be a transaction of its own, right after the add's: the next add
then waited for it (and at ``synchronous="FULL"`` paid a second fsync per
add). Now it goes into the next transaction, whatever that holds; when none
comes for about a second (store/committer.py, ``RIDER_SECONDS``), it commits
alone; and closing the engine commits it.
"""

from __future__ import annotations

import threading

import anyio
import anyio.lowlevel
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store import committer

from .conftest import StoredRows
from .fakes import GatedSummarizer

pytestmark = pytest.mark.anyio

GUARD = 30.0  # seconds: generous, for a loaded machine; only a broken engine gets near it
# Long leases: no renewal (a transaction to ride with) comes during a test, however slow the machine.
CONFIG = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None, lease_ttl=600.0)


class Transactions:
    """The statements of every transaction the store's write connection commits (SQLite's trace callback)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: list[str] = []
        self.committed: list[list[str]] = []

    def __call__(self, statement: str) -> None:
        with self._lock:
            if statement.startswith("COMMIT"):
                self.committed.append(self._current)
                self._current = []
            elif not statement.startswith("BEGIN"):
                self._current.append(statement)

    def with_boundaries(self) -> list[list[str]]:
        with self._lock:
            return [t for t in self.committed if any(s.startswith(BOUNDARY) for s in t)]


BOUNDARY = "UPDATE sessions SET evicted_through"


def writes(statements: list[str]) -> list[str]:
    return [s for s in statements if s.split(None, 1)[0].upper() in {"INSERT", "UPDATE", "DELETE"}]


def stored_boundary(stored: StoredRows) -> int:
    return stored.query("SELECT evicted_through FROM sessions WHERE session_id = 's'")[0][0]  # type: ignore[no-any-return]


async def test_under_adds_every_eviction_boundary_goes_into_an_adds_commit(db_path, stored, monkeypatch) -> None:
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)  # never alone: only with other work
    transactions = Transactions()
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            await session.context()
            engine.store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            for turn in range(1, 21):
                await session.add([Episode("user", f"turn {turn}")])
            evicted = (await session.context()).evicted_through
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    assert evicted is not None and evicted >= 18
    with_boundaries = transactions.with_boundaries()
    assert with_boundaries, "no eviction boundary was stored while adds came"
    alone = [statements for statements in with_boundaries if all(s.startswith(BOUNDARY) for s in writes(statements))]
    assert alone == [], "eviction boundaries committed on their own"
    assert any(any(s.startswith("INSERT INTO episodes") for s in t) for t in with_boundaries)
    # Closing committed the last one.
    assert stored_boundary(stored) == evicted


async def test_an_adds_transaction_with_a_boundary_checks_the_leases_with_one_query(db_path, monkeypatch) -> None:
    """The boundary's session is the add's: one lease query covers both (a second one cost each such commit)."""
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)  # never alone: only with other work
    transactions = Transactions()
    summarizer = GatedSummarizer()  # never released: no summary (which checks its own lease) rides along
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, config=CONFIG, summarizer=summarizer) as engine:
            session = engine.session("s")
            await session.context()
            engine.store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            for turn in range(1, 11):
                await session.add([Episode("user", f"turn {turn}")])
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    with_adds = [t for t in transactions.with_boundaries() if any(s.startswith("INSERT INTO episodes") for s in t)]
    assert with_adds, "no eviction boundary rode along with an add"
    for statements in with_adds:
        assert len([s for s in statements if "FROM session_leases" in s]) == 1, statements


async def test_with_nothing_else_to_ride_with_a_boundary_commits_alone(db_path, stored) -> None:
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, config=CONFIG) as engine:
            session = engine.session("s")
            for turn in range(1, 5):
                await session.add([Episode("user", f"turn {turn}")])
            evicted = (await session.context()).evicted_through
            assert evicted is not None
            while stored_boundary(stored) != evicted:  # noqa: ASYNC110 - polls the stored row
                await anyio.sleep(0.02)
            # ... while the engine is still open, with no other write since.


async def test_closing_the_engine_commits_a_boundary_still_waiting(db_path, stored, monkeypatch) -> None:
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    summarizer = GatedSummarizer()  # never released: no summary is stored for the boundary to ride with
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, config=CONFIG, summarizer=summarizer) as engine:
            session = engine.session("s")
            for turn in range(1, 5):
                await session.add([Episode("user", f"turn {turn}")])
            evicted = (await session.context()).evicted_through
            assert evicted is not None
            assert stored_boundary(stored) < evicted  # waiting for a transaction to ride with
    assert stored_boundary(stored) == evicted
    async with open_engine(db_path, config=CONFIG) as engine:  # and a reload shows the same window
        assert (await engine.session("s").context()).evicted_through == evicted


async def test_a_boundary_moved_by_an_activation_commits_within_a_quiet_second(db_path, stored) -> None:
    """Not only after an add: reloaded into a smaller window, the session evicts at activation, and nothing else
    comes to ride with (no add, no summary, no lease renewal for minutes): the boundary still commits on its own."""
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, config=SessionConfig(max_episodes=100, passivate_after=None)) as engine:
            for turn in range(1, 11):
                await engine.session("s").add([Episode("user", f"turn {turn}")])
        assert stored_boundary(stored) == 0
        summarizer = GatedSummarizer()  # never released: no summary is stored for the boundary to ride with
        async with open_engine(db_path, config=CONFIG, summarizer=summarizer) as engine:
            evicted = (await engine.session("s").context()).evicted_through
            assert evicted is not None and evicted >= 8
            while stored_boundary(stored) != evicted:  # noqa: ASYNC110 - polls the stored row
                await anyio.sleep(0.02)


async def test_riders_taken_by_an_adds_transaction_leave_no_empty_commit_at_their_deadline(
    db_path, monkeypatch
) -> None:
    """A rider's deadline that passes after another write took it along commits nothing (no empty transaction)."""
    monkeypatch.setattr(committer, "RIDER_SECONDS", 0.05)
    transactions = Transactions()
    summarizer = GatedSummarizer()  # never released: no summary comes as a new rider meanwhile
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=summarizer, config=CONFIG) as engine:
            session, other = engine.session("s"), engine.session("t")
            await session.context()
            await other.context()
            for turn in range(1, 4):
                await session.add([Episode("user", f"turn {turn}")])  # the third evicts: a rider, due soon
            store = engine.store
            # Until the committer waits for the riders' deadline: parked, with riders, and not woken since.
            while not (store._parked and store._riders and not store._queue_filled.is_set()):  # type: ignore[attr-defined]
                await anyio.lowlevel.checkpoint()
            store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            await other.add([Episode("user", "another session's add")])  # takes the rider along
            # Past the rider's deadline (twenty times over): a committer that woke for it would have
            # committed by now. (On a machine slower than that the test can only pass, never fail.)
            await anyio.sleep(20 * committer.RIDER_SECONDS)
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    assert [statements for statements in transactions.committed if not writes(statements)] == []
    assert transactions.committed, "the add was not seen"
