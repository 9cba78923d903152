"""Faults at every edge: the store, the summarizer and the retain sink fail, stall or talk nonsense.

After each fault the tests check what a user observes: the caller whose own
operation failed gets a clear :class:`MemEngineError` (usually
:class:`StoreError`); nothing acknowledged is lost (asserted on the rows in the
database file and on what the sink received); other sessions, and the same
session afterwards, are served; summaries and hand-offs finish once the fault
clears.

Store faults are injected below the store, into its sqlite3 connection
(:class:`FaultyConnection`): a chosen statement raises
``sqlite3.OperationalError`` or stalls in the store's worker thread, exactly
as a full disk, an I/O error or a slow disk would. The store's own code runs
unchanged above it.

The engine bugs these tests found (store errors in delivery taking the
engine down, a failed passivation hand-off reported as EngineClosedError, no
timeout on summarizer calls) are fixed; their tests guard against a return.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from memengine import (
    Engine,
    EngineClosedError,
    Episode,
    MemEngineError,
    Session,
    SessionClosedError,
    SessionConfig,
    StoreError,
    SummaryError,
    open_engine,
)
from memengine.actor.wakeup import call_soon_from_thread

from .conftest import StoredRows
from .fakes import RecordingSink, RecordingSummarizer, add_each, context_once_summarized, covered, fold, turns

pytestmark = pytest.mark.anyio

GUARD = 10  # seconds: no test waits this long unless the engine hangs
STALL_LIMIT = 30  # seconds a stalled statement waits for release before giving up on the test

# Retries in milliseconds, so a fault that clears is noticed at once; faults here clear by themselves,
# so work is never set aside (test_set_aside.py and test_set_aside_retain.py cover that).
FAST = {
    "summarize_attempts": 1,
    "summarize_backoff": 0.001,
    "summarize_backoff_max": 0.001,
    "summarize_retry_later": 0.01,
    "retain_attempts": 1,
    "retain_backoff": 0.001,
    "retain_backoff_max": 0.001,
    "retain_retry_later": 0.01,
    "passivate_after": None,
    "summarize_set_aside_after": None,
    "retain_set_aside_after": None,
}


# -- injecting store faults ------------------------------------------------------------


class StatementFault:
    """Statements starting with ``sql`` (and, with ``session``, only those naming it) fail and/or stall.

    ``skip`` lets that many matching statements through first; ``times`` limits
    how many are hit (``None``: every one, until healed). A stalled statement
    blocks the store's worker thread, and with it the whole store, until
    :meth:`release`.
    """

    def __init__(self, sql: str, *, session: str | None, fail: bool, stall: bool, skip: int, times: int | None) -> None:
        self.sql = sql.upper()
        self.session = session
        self.fail = fail
        self.stall = stall
        self.skip = skip
        self.times = times
        self.hits = 0
        self._released = threading.Event()
        self._hit = anyio.Event()
        self._call_soon = call_soon_from_thread()  # made on the event loop; struck in the store's commit thread

    def matches(self, sql: str, rows: Sequence[Any]) -> bool:
        if not sql.lstrip().upper().startswith(self.sql):
            return False
        return self.session is None or any(self.session in row for row in rows)

    def release(self) -> None:
        """Let stalled statements go on (and fail, if this fault fails)."""
        self._released.set()

    async def wait_for_hits(self, count: int = 1) -> None:
        while self.hits < count:
            await self._hit.wait()

    def _count_hit(self) -> None:  # on the event loop
        self.hits += 1
        self._hit.set()
        self._hit = anyio.Event()

    def strike(self) -> None:  # in the store's worker thread
        self._call_soon(self._count_hit)
        if self.stall and not self._released.wait(STALL_LIMIT):
            raise AssertionError("a stalled statement was never released")
        if self.fail:
            raise sqlite3.OperationalError("disk I/O error (injected)")


class FaultyConnection:
    """Stands in for the store's sqlite3 connection, and injects faults into the statements it runs."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._faults: list[StatementFault] = []
        self._lock = threading.Lock()

    def inject(
        self,
        sql: str,
        *,
        session: str | None = None,
        fail: bool = True,
        stall: bool = False,
        skip: int = 0,
        times: int | None = None,
    ) -> StatementFault:
        fault = StatementFault(sql, session=session, fail=fail, stall=stall, skip=skip, times=times)
        with self._lock:
            self._faults.append(fault)
        return fault

    def sharing_faults_with(self, conn: sqlite3.Connection) -> FaultyConnection:
        """Another connection of the same store, hit by the same faults."""
        other = FaultyConnection(conn)
        other._faults, other._lock = self._faults, self._lock
        return other

    def heal(self) -> None:
        """Remove every fault and release every stalled statement."""
        with self._lock:
            faults = list(self._faults)
            self._faults.clear()  # the list is shared with the read connection's faults
        for fault in faults:
            fault.release()

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> sqlite3.Cursor:
        self._before(sql, [parameters])
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, rows: Any, /) -> sqlite3.Cursor:
        rows = list(rows)
        self._before(sql, rows)
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def _before(self, sql: str, rows: Sequence[Any]) -> None:
        with self._lock:
            due = None
            for fault in self._faults:
                if not fault.matches(sql, rows):
                    continue
                if fault.skip:
                    fault.skip -= 1
                    continue
                if fault.times is not None:
                    if fault.times == 0:
                        continue
                    fault.times -= 1
                due = fault
                break
        if due is not None:
            due.strike()


#: How the store's write transactions begin (a read on the read connection begins with a plain, deferred BEGIN:
#: a fault meant to hold the writer must not stall a background read instead, which holds up no write).
WRITE_BEGIN = "BEGIN IMMEDIATE"


def install_faults(engine: Engine) -> FaultyConnection:
    """Faults for the store's write connection and its read connection alike."""
    store: Any = engine.store
    faults = FaultyConnection(store._conn)
    store._conn = faults
    if store._reader is not None:
        store._reader = faults.sharing_faults_with(store._reader)
    return faults


@asynccontextmanager
async def engine_with_faults(path: Path, **options: Any) -> AsyncIterator[tuple[Engine, FaultyConnection]]:
    async with open_engine(path, **options) as engine:
        faults = install_faults(engine)
        try:
            yield engine, faults
        finally:
            faults.heal()  # never leave the store's thread stalled, nor the way out failing


Outcome = Any  # a call's result, or the MemEngineError it raised


async def in_one_transaction(
    engine: Engine, faults: FaultyConnection, *calls: Callable[[], Awaitable[Any]], in_order: bool = False
) -> list:
    """Run ``calls`` concurrently so that their writes share one store transaction.

    The store is held in a transaction of its own (one that writes nothing, stalled at BEGIN)
    while the calls queue their writes behind it; then it is let go. Sessions
    must be active already, or their activations would take that transaction.
    With ``in_order``, each call's write is queued before the next call starts,
    so the transaction runs them in the order given.
    """
    hold = faults.inject(WRITE_BEGIN, fail=False, stall=True, times=1)
    outcomes: list[Outcome] = [None] * len(calls)

    async def run(index: int, call: Callable[[], Awaitable[Any]]) -> None:
        try:
            outcomes[index] = await call()
        except MemEngineError as error:
            outcomes[index] = error

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as callers:
            callers.start_soon(engine.store.renew_leases, [], 10.0)  # a write transaction that changes nothing
            await hold.wait_for_hits()
            for index, call in enumerate(calls):
                callers.start_soon(run, index, call)
                if in_order:
                    await anyio.wait_all_tasks_blocked()
            await anyio.wait_all_tasks_blocked()
            hold.release()
    return outcomes


async def settled(engine: Engine) -> None:
    """Return once every store transaction already under way has ended (the store runs them in order)."""
    await engine.store.list_sessions()


def adding(engine: Engine, session_id: str, *episodes: Episode) -> Callable[[], Awaitable[Any]]:
    return lambda: engine.session(session_id).add(list(episodes))


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def crash_of(group: BaseExceptionGroup, kind: type[BaseException]) -> AssertionError | None:
    """An AssertionError naming the ``kind`` error that took the engine down, if that is what happened."""
    crash = [leaf for leaf in leaves(group) if isinstance(leaf, kind)]
    return AssertionError(f"the engine went down with {crash[0]!r}") if crash else None


# -- the store fails a write -------------------------------------------------------------


async def test_a_failed_commit_fails_every_add_in_that_transaction_and_stores_none(
    db_path: Path, stored: StoredRows
) -> None:
    names = ["a", "b", "c"]
    async with engine_with_faults(db_path) as (engine, faults):
        for name in names:
            await engine.session(name).add([Episode("user", f"{name} 1")])
        commit = faults.inject("COMMIT", skip=1, times=1)  # the holding transaction commits; the next does not
        second = {name: Episode("user", f"{name} 2", id=f"{name}-second") for name in names}
        outcomes = await in_one_transaction(engine, faults, *(adding(engine, name, second[name]) for name in names))
        assert commit.hits == 1
        for outcome in outcomes:
            assert isinstance(outcome, StoreError)
            assert "commit failed, nothing was stored" in str(outcome)
        for name in names:
            assert stored.episodes(name) == [(1, f"{name} 1")]
            assert [e.seq for e in (await engine.session(name).context()).episodes] == [1]
        # The fault was transient: the same adds (same ids) now go through once, at the seq they would have had.
        for name in names:
            (retried,) = await engine.session(name).add([second[name]])
            assert retried.seq == 2
            (again,) = await engine.session(name).add([second[name]])
            assert again.seq == 2
    for name in names:
        assert stored.episodes(name) == [(1, f"{name} 1"), (2, f"{name} 2")]


async def test_a_write_failing_for_one_session_fails_only_its_caller(db_path: Path, stored: StoredRows) -> None:
    async with engine_with_faults(db_path) as (engine, faults):
        for name in ("bad", "good", "fine"):
            await engine.session(name).add([Episode("user", f"{name} 1")])
        broken = faults.inject("INSERT INTO episodes", session="bad")
        outcomes = await in_one_transaction(
            engine,
            faults,
            adding(engine, "good", Episode("user", "good 2")),
            adding(engine, "bad", Episode("user", "bad 2"), Episode("user", "bad 3")),
            adding(engine, "fine", Episode("user", "fine 2")),
        )
        good, bad, fine = outcomes
        assert isinstance(bad, StoreError) and "disk I/O error (injected)" in str(bad)
        assert [e.seq for e in good] == [2] and [e.seq for e in fine] == [2]
        assert stored.episodes("bad") == [(1, "bad 1")]
        assert broken.hits >= 1
        # While the fault lasts the session keeps answering, and refusing writes the same way.
        assert [e.content for e in (await engine.session("bad").context()).episodes] == ["bad 1"]
        with pytest.raises(StoreError):
            await engine.session("bad").add([Episode("user", "bad 2")])
        faults.heal()
        assert [e.seq for e in await engine.session("bad").add([Episode("user", "bad 2")])] == [2]
    assert stored.episodes("bad") == [(1, "bad 1"), (2, "bad 2")]
    assert stored.episodes("good") == [(1, "good 1"), (2, "good 2")]
    assert stored.episodes("fine") == [(1, "fine 1"), (2, "fine 2")]


async def test_an_append_that_passed_in_the_batch_but_fails_on_its_own_retry_is_not_acknowledged(
    db_path: Path, stored: StoredRows
) -> None:
    """A shared transaction fails; on the retry, one operation at a time, the append fails too.

    The append's result from the rolled-back first attempt must not survive:
    its caller is told it failed, and nothing of it is stored.
    """
    async with engine_with_faults(db_path) as (engine, faults):
        for name in ("a", "b"):
            await engine.session(name).add([Episode("user", f"{name} 1")])
        # The batch's one-statement insert goes through; a's row-by-row retry fails.
        faults.inject("INSERT INTO episodes", session="a", skip=1, times=1)
        faults.inject("DELETE FROM episodes", session="b", times=1)  # fails the shared transaction
        # In this order in one transaction: the append first (its insert passes), then the failing delete.
        added, deleted = await in_one_transaction(
            engine,
            faults,
            adding(engine, "a", Episode("user", "a 2")),
            lambda: engine.session("b").delete_episodes([1]),
            in_order=True,
        )
        assert isinstance(added, StoreError), added
        assert deleted == 1
    assert stored.episodes("a") == [(1, "a 1")]
    assert stored.episodes("b") == []


@pytest.mark.parametrize("how", ["statement fails", "method raises sqlite3 error", "method raises StoreError"])
async def test_a_failed_activation_fails_its_callers_and_a_later_call_succeeds(
    db_path: Path, stored: StoredRows, how: str
) -> None:
    async with open_engine(db_path) as engine:
        await add_each(engine.session("s"), turns(3))
    async with engine_with_faults(db_path) as (engine, faults):
        if how == "statement fails":
            faults.inject("SELECT generation, seq_floor, retained_through, evicted_through FROM sessions", session="s")
        else:
            store: Any = engine.store
            real_activate = store.activate
            error = sqlite3.OperationalError("database is locked") if "sqlite3" in how else StoreError("injected")

            async def activate_failing_once(session_id: str, ttl: float) -> Any:
                store.activate = real_activate
                raise error

            store.activate = activate_failing_once
        session = engine.session("s")
        outcomes: list[Outcome] = []

        async def call(operation: Callable[[], Awaitable[Any]]) -> None:
            try:
                outcomes.append(await operation())
            except MemEngineError as error:
                outcomes.append(error)

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:  # both wait on the same failed activation
                callers.start_soon(call, session.context)
                callers.start_soon(call, lambda: session.add([Episode("user", "during the failure")]))
        assert len(outcomes) == 2
        for outcome in outcomes:
            assert isinstance(outcome, StoreError), outcome
            assert "could not be loaded" in str(outcome)
        assert not engine.is_active("s")
        assert [e.seq for e in await engine.session("t").add([Episode("user", "t 1")])] == [1]  # still serving
        faults.heal()
        assert [e.content for e in (await session.context()).episodes] == ["turn 1", "turn 2", "turn 3"]
        assert [e.seq for e in await session.add([Episode("user", "after the failure")])] == [4]
    assert [content for _, content in stored.episodes("s")] == ["turn 1", "turn 2", "turn 3", "after the failure"]


async def test_failed_clear_and_delete_change_nothing_and_can_be_retried(db_path: Path, stored: StoredRows) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=2, **FAST)
    async with engine_with_faults(db_path, summarizer=RecordingSummarizer(), config=config) as (engine, faults):
        session = engine.session("s")
        await add_each(session, turns(4))
        before = await session.context(wait_for_summary=True)
        assert covered(before.summary) == ["turn 1", "turn 2"]
        generation = stored.query("SELECT generation FROM sessions WHERE session_id = 's'")
        summaries = stored.summaries("s")
        assert summaries[-1] == (2, "turn 1|turn 2")
        faults.inject("DELETE FROM episodes", session="s")

        with pytest.raises(StoreError):
            await session.clear()
        with pytest.raises(StoreError):
            await session.delete_episodes([1, 3])
        # Nothing of either was committed: rows, summary and generation are as they were.
        assert [content for _, content in stored.episodes("s")] == ["turn 1", "turn 2", "turn 3", "turn 4"]
        assert stored.summaries("s") == summaries
        assert stored.query("SELECT generation FROM sessions WHERE session_id = 's'") == generation
        assert await session.context() == before
        assert [e.seq for e in await engine.session("other").add([Episode("user", "other")])] == [1]

        faults.heal()
        assert await session.delete_episodes([1, 3]) == 2
        assert [content for _, content in stored.episodes("s")] == ["turn 2", "turn 4"]
        # The summary covered a deleted episode: gone. (The summarizer may already have summarized the
        # survivors it evicts again: a summary of "turn 2" alone.)
        assert stored.summaries("s") in ([], [(2, "turn 2")])
        await session.clear()
        assert stored.episodes("s") == [] and stored.summaries("s") == []
        assert [e.seq for e in await session.add([Episode("user", "after clear")])] == [5]  # seqs are not reused


async def test_a_delete_of_many_seqs_failing_in_a_later_statement_deletes_nothing(
    db_path: Path, stored: StoredRows
) -> None:
    """A long seq list is deleted in several statements, in one transaction: all of them or none."""
    keep_everything_raw = SessionConfig(evict_to=1.0, max_episodes=100_000, max_chars=10**9, **FAST)
    async with engine_with_faults(db_path, config=keep_everything_raw) as (engine, faults):
        session = engine.session("s")
        await session.add([Episode("user", f"turn {n}") for n in range(1, 2_501)])
        before = await session.context()
        generation = stored.query("SELECT generation FROM sessions WHERE session_id = 's'")
        # The first DELETE statement goes through; every later one fails.
        fault = faults.inject("DELETE FROM episodes", session="s", skip=1)
        with anyio.fail_after(GUARD), pytest.raises(StoreError):
            await session.delete_episodes(range(1, 2_501))
        assert fault.hits >= 1
        assert len(stored.episodes("s")) == 2_500
        assert stored.query("SELECT generation FROM sessions WHERE session_id = 's'") == generation
        assert await session.context() == before

        faults.heal()
        assert await session.delete_episodes(range(1, 2_501)) == 2_500
        assert stored.episodes("s") == []


# -- the store fails a summary or an outbox write --------------------------------------------


async def test_failed_summary_writes_keep_episodes_raw_until_the_fault_clears(
    db_path: Path, stored: StoredRows
) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=2, **FAST)
    async with engine_with_faults(db_path, summarizer=RecordingSummarizer(), config=config) as (engine, faults):
        session = engine.session("s")
        summary_write = faults.inject("INSERT INTO summaries", session="s")
        await add_each(session, turns(4))
        with anyio.fail_after(GUARD):
            await summary_write.wait_for_hits(4)  # refused more than once: the first write and a retry
        # Nothing evicted disappears from view, and writers go on as if nothing happened.
        context = await session.context()
        assert context.summary is None and context.evicted_through == 2
        assert [e.content for e in context.episodes] == ["turn 1", "turn 2", "turn 3", "turn 4"]
        assert [e.seq for e in await session.add([Episode("user", "turn 5")])] == [5]
        assert stored.summaries("s") == []
        # Another session's summaries are written meanwhile.
        await add_each(engine.session("t"), turns(3, prefix="t"))
        assert covered((await engine.session("t").context(wait_for_summary=True)).summary) == ["t 1"]

        # A reader waiting for the summary is told why it does not come, rather than kept waiting.
        with anyio.fail_after(GUARD), pytest.raises(SummaryError, match="storing the summary") as failed:
            await session.context(wait_for_summary=True)
        assert "disk I/O error (injected)" in str(failed.value)
        faults.heal()  # a reader is answered once the summary is stored
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
    assert covered(context.summary) == ["turn 1", "turn 2", "turn 3"]
    assert [e.content for e in context.episodes] == ["turn 4", "turn 5"]
    assert stored.summaries("s") == [(3, "turn 1|turn 2|turn 3")]


@asynccontextmanager
async def retain_records_failing(
    db_path: Path, sink: RecordingSink, turn_count: int
) -> AsyncIterator[tuple[Session, FaultyConnection]]:
    """Session "s" (``retain_every=2``) after ``turn_count`` single adds, every retain batch due meanwhile failing."""
    config = SessionConfig(retain_every=2, **FAST)
    async with engine_with_faults(db_path, retain_sink=sink, config=config) as (engine, faults):
        session = engine.session("s")
        outbox_write = faults.inject("INSERT INTO retain_outbox", session="s")
        await add_each(session, turns(turn_count))
        with anyio.fail_after(GUARD):
            await outbox_write.wait_for_hits()
        await settled(engine)
        yield session, faults


async def test_a_failed_retain_record_is_retried_at_the_next_add_and_handed_on_once(
    db_path: Path, stored: StoredRows
) -> None:
    sink = RecordingSink()
    async with retain_records_failing(db_path, sink, 2) as (session, faults):  # a batch was due; recording it failed
        assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]
        assert stored.query("SELECT retained_through FROM sessions WHERE session_id = 's'") == [(0,)]
        faults.heal()
        await session.add([Episode("user", "turn 3")])  # due again: the next retain_every episodes go
        with anyio.fail_after(GUARD):
            await sink.wait_for(1)
        await session.close()
    assert sink.delivered_contents() == ["turn 1", "turn 2", "turn 3"]
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2), (3, 3)]  # the tail at close
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_tail_left_by_failed_retain_records_is_handed_on_at_close_in_batches_of_retain_every(
    db_path: Path, stored: StoredRows
) -> None:
    sink = RecordingSink()
    async with retain_records_failing(db_path, sink, 5) as (session, faults):  # two batches came due, both failed
        assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]
        faults.heal()
        await session.close()  # the boundary: the whole tail, as the batches it would have been
        with anyio.fail_after(GUARD):
            await sink.wait_for(3)
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2), (3, 4), (5, 5)]
    assert sink.delivered_contents() == ["turn 1", "turn 2", "turn 3", "turn 4", "turn 5"]


async def test_a_failed_close_raises_store_error_and_loses_nothing(db_path: Path, stored: StoredRows) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=100, **FAST)
    async with engine_with_faults(db_path, retain_sink=sink, config=config) as (engine, faults):
        session = engine.session("s")
        await add_each(session, turns(3))
        faults.inject("INSERT INTO retain_outbox", session="s")
        with pytest.raises(StoreError):
            await session.close()  # close hands the partial batch on; recording it failed
        assert session.closed  # closed is closed, whatever became of the hand-off
        with pytest.raises(SessionClosedError):
            await session.context()
        assert [e.seq for e in (await engine.session("s").context()).episodes] == [1, 2, 3]
        assert sink.batches == []
        faults.heal()
        await engine.session("s").close()
        with anyio.fail_after(GUARD):
            await sink.wait_for(1)
    assert sink.delivered_contents() == ["turn 1", "turn 2", "turn 3"]  # once: leaving sent nothing again
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_store_failure_on_the_way_out_is_logged_and_the_tail_handed_on_next_time(
    db_path: Path, stored: StoredRows, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=100, **FAST)
    # Leaving does not raise for work the next start redoes (nothing acknowledged is at stake); it says so.
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await add_each(engine.session("s"), turns(3))
        install_faults(engine).inject("INSERT INTO retain_outbox")  # lasts while the engine exits
    assert any(
        "recording the retain tails failed" in r.getMessage() and "injected" in r.getMessage() for r in caplog.records
    )
    assert sink.batches == []
    assert [content for _, content in stored.episodes("s")] == ["turn 1", "turn 2", "turn 3"]
    async with open_engine(db_path, retain_sink=sink, config=config):
        pass  # a new start hands on what the last exit could not
    assert sink.delivered_contents() == ["turn 1", "turn 2", "turn 3"]


DELIVERY_STATEMENTS = {
    "reading the outbox": ("SELECT o.id, o.session_id, o.key FROM retain_outbox", 0),
    "recording a delivery": ("DELETE FROM retain_outbox WHERE id", 0),
    "recording a failed delivery": ("UPDATE retain_outbox SET attempts", 1),
}


@pytest.mark.parametrize("failing", sorted(DELIVERY_STATEMENTS))
async def test_a_store_failure_while_handing_on_does_not_take_the_engine_down(
    db_path: Path, stored: StoredRows, failing: str
) -> None:
    statement, sink_failures = DELIVERY_STATEMENTS[failing]
    sink = RecordingSink(failures=sink_failures)
    config = SessionConfig(retain_every=2, **FAST)
    served: list[Episode] = []
    try:
        async with engine_with_faults(db_path, retain_sink=sink, config=config) as (engine, faults):
            fault = faults.inject(statement)
            await add_each(engine.session("s"), turns(2))
            with anyio.fail_after(GUARD):
                await fault.wait_for_hits()
                await anyio.wait_all_tasks_blocked()
            served.extend(await engine.session("t").add([Episode("user", "still served")]))
            faults.heal()
            await add_each(engine.session("s"), turns(2, start=3))
            with anyio.fail_after(GUARD):
                while {e.content for b in sink.batches for e in b.episodes} < {f"turn {i}" for i in range(1, 5)}:
                    await sink.wait_for(len(sink.batches) + 1)
    except BaseExceptionGroup as group:
        raise (crash_of(group, StoreError) or group) from None
    assert [e.seq for e in served] == [1]
    # Each batch may arrive again only under the same key (the sink stored it, memengine could not record that).
    by_key: dict[str, tuple] = {}
    for batch in sink.batches:
        if batch.session_id == "s":
            assert by_key.setdefault(batch.key, (batch.first_seq, batch.last_seq)) == (batch.first_seq, batch.last_seq)
    assert sorted(by_key.values()) == [(1, 2), (3, 4)]
    # The session served during the fault was handed on too, at engine exit.
    assert [[e.content for e in b.episodes] for b in sink.batches if b.session_id == "t"] == [["still served"]]
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_a_failed_hand_off_at_passivation_does_not_tell_callers_the_engine_closed(
    db_path: Path, stored: StoredRows
) -> None:
    sink = RecordingSink()
    config = SessionConfig(retain_every=100, **{**FAST, "passivate_after": 0.05})
    outcome: list[Outcome] = []

    async def late_add() -> None:
        try:
            outcome.append(await engine.session("s").add([Episode("user", "turn 3")]))
        except MemEngineError as error:
            outcome.append(error)

    async with engine_with_faults(db_path, retain_sink=sink, config=config) as (engine, faults):
        await add_each(engine.session("s"), turns(2))
        flush = faults.inject("INSERT INTO retain_outbox", session="s", stall=True)
        with anyio.fail_after(GUARD):
            await flush.wait_for_hits()  # the idle session is handing on turns 1-2 before it passivates
            async with anyio.create_task_group() as callers:
                callers.start_soon(late_add)
                await anyio.wait_all_tasks_blocked()  # its message waits in the mailbox
                flush.release()  # ... and the hand-off fails
        faults.heal()
    (result,) = outcome
    assert not isinstance(result, EngineClosedError), f"the running engine answered {result!r}"
    if isinstance(result, StoreError):
        assert [content for _, content in stored.episodes("s")] == ["turn 1", "turn 2"]
    else:
        assert [e.seq for e in result] == [3]
    assert sink.delivered_contents() == [content for _, content in stored.episodes("s")]


# -- the store stalls ---------------------------------------------------------------------


async def test_a_read_queued_behind_a_waiting_add_is_answered_without_waiting_for_that_add(db_path: Path) -> None:
    """Turn 3 waits in the mailbox for turn 2's append; a read queued after it is answered as soon as turn 2 is
    stored, from memory (turns 1-2), while turn 3's own append is still stuck: not one commit later."""
    async with engine_with_faults(db_path) as (engine, faults):
        session = engine.session("s")
        await session.add([Episode("user", "turn 1")])
        first = faults.inject("INSERT INTO episodes", fail=False, stall=True, times=1)
        read: list[list[str]] = []
        answered = anyio.Event()

        async def reader() -> None:
            context = await session.context()
            read.append([episode.content for episode in context.episodes])
            answered.set()

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:
                callers.start_soon(session.add, [Episode("user", "turn 2")])
                await first.wait_for_hits()  # turn 2's append is in flight, stuck
                callers.start_soon(session.add, [Episode("user", "turn 3")])
                await anyio.wait_all_tasks_blocked()  # turn 3 waits for it
                callers.start_soon(reader)
                await anyio.wait_all_tasks_blocked()  # the read is queued behind turn 3
                second = faults.inject("INSERT INTO episodes", fail=False, stall=True, times=1)
                first.release()
                await second.wait_for_hits()  # turn 3's append is in flight, stuck
                await answered.wait()  # before: only after turn 3 was stored (never, here: GUARD)
                assert read == [["turn 1", "turn 2"]]
                second.release()
        assert [episode.content for episode in (await session.context()).episodes] == ["turn 1", "turn 2", "turn 3"]


async def test_a_stalled_store_delays_writers_but_loses_nothing(db_path: Path, stored: StoredRows) -> None:
    async with engine_with_faults(db_path) as (engine, faults):
        for name in ("a", "b", "c"):
            await engine.session(name).context()
        hold = faults.inject(WRITE_BEGIN, fail=False, stall=True, times=1)
        impatient = Episode("user", "b 1, whose caller gave up")
        results: dict[str, Any] = {}

        async def add(name: str, episode: Episode, scope: anyio.CancelScope | None = None) -> None:
            with scope or anyio.CancelScope():
                results[name] = await engine.session(name).add([episode])

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:
                callers.start_soon(engine.store.renew_leases, [], 10.0)  # a write transaction that changes nothing
                await hold.wait_for_hits()  # the store is stuck in a transaction
                gave_up = anyio.CancelScope()
                callers.start_soon(add, "a", Episode("user", "a 1"))
                callers.start_soon(add, "b", impatient, gave_up)
                callers.start_soon(add, "c", Episode("user", "c 1"))
                await anyio.wait_all_tasks_blocked()
                assert results == {}  # nobody is told "stored" before it is
                assert stored.query("SELECT count(*) FROM episodes") == [(0,)]
                gave_up.cancel()  # a caller's timeout: only its own wait ends
                await anyio.wait_all_tasks_blocked()
                hold.release()
        assert sorted(results) == ["a", "c"]
        # The session carried the abandoned add out; retrying it (same id) stores nothing new.
        (retried,) = await engine.session("b").add([impatient])
        assert retried.seq == 1
    assert stored.episodes("a") == [(1, "a 1")]
    assert stored.episodes("b") == [(1, "b 1, whose caller gave up")]
    assert stored.episodes("c") == [(1, "c 1")]


async def test_a_slow_read_holds_up_no_writer(db_path: Path, stored: StoredRows) -> None:
    """Reads (recall here) run on their own connection: one stuck in its query delays no add, of any session."""
    async with engine_with_faults(db_path) as (engine, faults):
        await engine.session("a").add([Episode("user", "a word to find")])
        # The recall's query, which only the read connection runs, stalls as a long scan would.
        search = faults.inject("SELECT e.session_id, e.seq", fail=False, stall=True, times=1)
        found: list = []

        async def recall() -> None:
            found.extend(await engine.recall("word", all_sessions=True))

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as readers:
                readers.start_soon(recall)
                await search.wait_for_hits()  # the recall is stuck in its query
                for name in ("a", "b"):
                    (episode,) = await engine.session(name).add([Episode("user", f"{name} added meanwhile")])
                    assert stored.episodes(name)[-1] == (episode.seq, f"{name} added meanwhile")
                assert found == []
                search.release()
        assert [hit.episode.content for hit in found] == ["a word to find"]


async def test_a_slow_activation_holds_up_only_its_own_session(db_path: Path, stored: StoredRows) -> None:
    async with open_engine(db_path) as engine:
        store: Any = engine.store
        real_activate = store.activate
        loading, loaded = anyio.Event(), anyio.Event()

        async def slow_activate(session_id: str, ttl: float) -> Any:
            if session_id == "slow":
                loading.set()
                await loaded.wait()
            return await real_activate(session_id, ttl)

        store.activate = slow_activate
        gave_up = anyio.CancelScope()

        async def impatient_add() -> None:
            with gave_up:
                await engine.session("slow").add([Episode("user", "added while loading")])

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as callers:
                callers.start_soon(impatient_add)
                await loading.wait()
                # Other sessions are served while "slow" is still loading.
                for name in ("x", "y"):
                    await add_each(engine.session(name), turns(2, prefix=name))
                    assert [e.seq for e in (await engine.session(name).context()).episodes] == [1, 2]
                gave_up.cancel()
            loaded.set()
            # The abandoned add was still carried out: the next one follows it.
            (after,) = await engine.session("slow").add([Episode("user", "added later")])
        assert after.seq == 2
        assert [e.content for e in (await engine.session("slow").context()).episodes] == [
            "added while loading",
            "added later",
        ]
    assert stored.episodes("slow") == [(1, "added while loading"), (2, "added later")]


# -- the summarizer misbehaves ----------------------------------------------------------------

MISBEHAVIOURS = {
    "raises": RuntimeError("model unavailable"),
    "hangs": None,
    "returns None": None,
    "returns bytes": b"turn 1 turn 2",
    "returns a list": ["turn 1", "turn 2"],
    "returns blank": " \n\t",
    "returns NUL only": "\x00\x00",  # nothing left once made storable
}
# Text with a NUL or a lone surrogate in it is cleaned and stored, not refused: see test_waiting_reads.py.


class MisbehavingSummarizer:
    """Misbehaves on episodes of session "s" (contents "s ...") until :meth:`recover`; folds the rest."""

    def __init__(self, misbehaviour: str) -> None:
        self.misbehaviour = misbehaviour
        self.calls = 0
        self._called = anyio.Event()
        self._recovered = anyio.Event()

    def recover(self) -> None:
        self._recovered.set()

    async def wait_until_called(self, count: int) -> None:
        while self.calls < count:
            await self._called.wait()

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> Any:
        if episodes[0].content.startswith("s ") and not self._recovered.is_set():
            self.calls += 1
            self._called.set()
            self._called = anyio.Event()
            if self.misbehaviour == "hangs":
                await self._recovered.wait()  # a call that outlives every caller's patience
            else:
                answer = MISBEHAVIOURS[self.misbehaviour]
                if isinstance(answer, Exception):
                    raise answer
                return answer
        return fold(previous, episodes)


@pytest.mark.parametrize("misbehaviour", list(MISBEHAVIOURS))
async def test_a_misbehaving_summarizer_blocks_no_writer_and_is_summarized_after_it_recovers(
    db_path: Path, stored: StoredRows, misbehaviour: str
) -> None:
    summarizer = MisbehavingSummarizer(misbehaviour)
    config = SessionConfig(evict_to=1.0, max_episodes=2, **FAST)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(4, prefix="s"))
        with anyio.fail_after(GUARD):
            await summarizer.wait_until_called(1 if misbehaviour == "hangs" else 3)  # retried, in vain
        if misbehaviour == "hangs":
            # A reader that waits for the summary times out on its own; nothing else notices.
            with anyio.move_on_after(0.05) as patience:
                await session.context(wait_for_summary=True)
            assert patience.cancelled_caught
        else:
            # A reader that waits for the summary is told it failed (rather than waiting for ever).
            with anyio.fail_after(GUARD), pytest.raises(SummaryError):
                await session.context(wait_for_summary=True)
        context = await session.context()
        assert context.summary is None
        assert [e.content for e in context.episodes] == ["s 1", "s 2", "s 3", "s 4"]
        assert [e.seq for e in await session.add([Episode("user", "s 5")])] == [5]
        assert stored.summaries("s") == []  # nothing unusable was stored
        # Another session is summarized meanwhile.
        await add_each(engine.session("t"), turns(3, prefix="t"))
        with anyio.fail_after(GUARD):
            assert covered((await engine.session("t").context(wait_for_summary=True)).summary) == ["t 1"]

        summarizer.recover()
        with anyio.fail_after(GUARD):
            context = await context_once_summarized(session)  # a round may still fail as it recovers
    assert covered(context.summary) + [e.content for e in context.episodes] == [f"s {i}" for i in range(1, 6)]
    assert covered(context.summary) == ["s 1", "s 2", "s 3"]
    assert stored.summaries("s")[-1] == (3, "s 1|s 2|s 3")


@pytest.mark.parametrize("anyio_backend", [pytest.param(("trio", {"clock": MockClock(autojump_threshold=0.1)}))])
async def test_a_summarizer_call_that_never_returns_does_not_starve_other_sessions(db_path: Path) -> None:
    summarizer = MisbehavingSummarizer("hangs")  # forever: it never recovers
    config = SessionConfig(evict_to=1.0, max_episodes=2, **FAST)
    async with open_engine(db_path, summarizer=summarizer, config=config, max_concurrent_summaries=1) as engine:
        await add_each(engine.session("s"), turns(3, prefix="s"))
        await summarizer.wait_until_called(1)
        await add_each(engine.session("t"), turns(3, prefix="t"))
        with anyio.move_on_after(24 * 3600) as waited:  # a virtual day
            await engine.session("t").context(wait_for_summary=True)
    assert not waited.cancelled_caught, "session t was never summarized"


# -- the retain sink fails ------------------------------------------------------------------


class FlakySink(RecordingSink):
    """Refuses every batch until :meth:`recover`; counts its calls."""

    def __init__(self) -> None:
        super().__init__(failures=10**9)
        self._called = anyio.Event()

    def recover(self) -> None:
        self.failures = 0

    async def wait_until_called(self, count: int) -> None:
        while self.calls < count:
            await self._called.wait()

    async def retain(self, batch: Any) -> None:
        try:
            await super().retain(batch)
        finally:
            self._called.set()
            self._called = anyio.Event()


async def test_a_failing_sink_keeps_batches_in_the_outbox_until_it_recovers(db_path: Path, stored: StoredRows) -> None:
    sink = FlakySink()
    config = SessionConfig(retain_every=2, **FAST)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        with anyio.fail_after(GUARD):
            await add_each(session, turns(4))  # writers never wait for the sink
            await sink.wait_until_called(3)  # refused, retried, refused again
        metrics = await engine.retain_metrics()
        assert metrics.outbox_depth == 2 and metrics.delivery_failures >= 2
        assert stored.query("SELECT first_seq, last_seq FROM retain_outbox ORDER BY id") == [(1, 2), (3, 4)]
        assert sink.batches == []
        sink.recover()
        with anyio.fail_after(GUARD):
            await sink.wait_for(2)
        await add_each(session, turns(1, start=5))
        await session.close()
    assert sink.delivered_contents() == [f"turn {i}" for i in range(1, 6)]  # in order, each once
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 2), (3, 4), (5, 5)]
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]
