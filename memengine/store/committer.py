"""Group commit, and every store operation, for both backends.

Every operation is a small function run against one connection. Operations
submitted while a transaction is being committed wait and then go into the
next transaction together: one thread hop and one commit serve every session
that wrote meanwhile, and each caller is answered once its own rows are
committed. Both drivers block, so the transactions run in a worker thread, one
at a time (never two threads on the connection at once).

No transaction holds the store for long: one takes at most
:data:`TRANSACTION_ROWS` rows (an add of more is stored in parts, see
unfinished.py), and lease renewals go into the very next transaction, ahead of
everything queued, so a burst of writes never lets a lease lapse (PostgreSQL
renews on a connection of its own, see postgres/renewals.py). An operation
that waited too long for a lock (``lock_timeout``) is refused alone; the rest
of its transaction is committed without it. A connection lost while idle is
replaced and the transaction begun again (nothing was in flight).

Reads that need no lease (recall, listings, the outbox's due batches) run on a
second, read-only connection in their own thread, so they never wait behind a
commit nor hold up a writer (SQLite in WAL mode, PostgreSQL MVCC).

The committer outlives whatever cancels the code around the engine: it runs
shielded and stops only when the store closes, after finishing what was
submitted. Closing is bounded: after ``timeout`` seconds the statement in
progress is interrupted and what is left fails with :class:`StoreError`.

The backends (sqlite/store.py, postgres/store.py) differ only in how they connect, begin a
transaction, interrupt one, insert a run of appends with one statement, and
search.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import anyio
import tenacity

from ..actor.wakeup import Wakeup
from ..episode import Episode
from ..errors import EngineClosedError, SessionBusyError, StoreError, UncertainCommitError
from ..retain.batch import RetainMode
from ..retrying import wait_jitter, with_retries_in_thread
from ..scope import Scope
from . import erasure, handover, journal, leases, orphans, outbox, owners, scoped, set_aside
from .base import (
    AppendResult,
    Completion,
    DueRetains,
    Erased,
    ExportedSession,
    OutboxEntry,
    OutboxState,
    Recalled,
    RecallIndexDamaged,
    ScopeCounts,
    SessionRow,
    SessionSnapshot,
    SetAside,
    SetAsideCounts,
)
from .dialect import Db, Dialect
from .liveness import HEARTBEAT_SECONDS

T = TypeVar("T")
Operation = Callable[[Db], T]
log = logging.getLogger("memengine.store")

_Append = tuple[str, int, int, Sequence[Episode]]  # session_id, token, first_seq, episodes
_TRANSIENT_ATTEMPTS = 8
#: After the n-th deadlock in a row: 5 ms * n, plus up to 10 ms of jitter (drawn from the engine's own random source).
_DEADLOCK_WAIT = tenacity.wait_incrementing(start=0.005, increment=0.005) + wait_jitter(0, 0.01)


class _Deadlocked(Exception):
    """The transaction deadlocked with another process's and was rolled back: it runs again."""


class _Interrupted(Exception):
    """Closing interrupted the transaction (see ``_aborted``)."""


#: Rows (episodes of an add; other operations count one) one transaction takes at most.
TRANSACTION_ROWS = 2000
#: Characters of content one transaction stores at most (a single larger episode goes alone).
TRANSACTION_CHARS = 8_000_000
#: Seconds closing waits for submitted operations before interrupting them.
CLOSE_TIMEOUT = 2.0
#: Seconds, once closing stopped waiting for the work, that the statements it interrupted get to
#: return and the connections get to close; a thread still waiting then (the server went silent)
#: is left behind, told to give its connection up (postgres/replies.py), and closes it on return.
INTERRUPT_SECONDS = 2.0


def new_owner_id() -> str:
    """This process's name in lease rows: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Submission:
    """One operation waiting for its transaction."""

    __slots__ = (
        "append",
        "chars",
        "done",
        "error",
        "eviction",
        "finished",
        "operation",
        "refused",
        "result",
        "size",
        "urgent",
    )

    def __init__(
        self,
        operation: Operation[Any] | None,
        done: Completion[Any] | None = None,
        append: _Append | None = None,
        size: int = 1,
        chars: int = 0,
    ) -> None:
        self.operation = operation  # None for an append: journal.append over ``append``
        self.done = done
        self.append = append  # set for appends, which can also run together (see _append_run)
        self.eviction: tuple[str, int, int] | None = None  # likewise for eviction boundaries (_eviction_run)
        self.size = size  # rows it stores (one for most operations)
        self.chars = chars  # characters of content it stores
        self.finished: Wakeup | None = None  # for the one caller that awaits the outcome
        self.result: Any = None
        self.error: BaseException | None = None
        self.refused = False  # it waited too long for a lock (or ran too long): not run again with the rest
        self.urgent = False  # a lease renewal: first in its transaction (see _enqueue)


class _Read(Generic[T]):
    """One read on the read connection (its identity tells whether it is the one running)."""

    __slots__ = ("abandoned", "operation")

    def __init__(self, operation: Operation[T]) -> None:
        self.operation = operation
        self.abandoned = False  # its caller gave up: if it has not started, it never does


class GroupCommitStore:
    """A store over one blocking DB-API connection; see :class:`~memengine.store.base.Store`.

    ``owner`` names this process in lease rows (one store per engine).
    ``reader`` is a second connection for reads, or ``None`` to read through
    the committer (an in-memory SQLite database has no second connection).
    """

    #: Where the store is, as messages and reprs show it (a URL without its password); set by the opener.
    location = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    def __init__(self, conn: Any, dialect: Dialect, owner: str | None = None, reader: Any | None = None) -> None:
        self._conn = conn
        self._reader = reader
        self._dialect = dialect
        self.owner = owner or new_owner_id()
        self._pid = os.getpid()  # a forked child renews nothing of its parent's (see forked)
        self._queue: deque[_Submission] = deque()
        self._urgent: list[_Submission] = []  # lease renewals: into the next transaction, first
        self._queue_filled = Wakeup()
        self._closing = False
        self._aborted = False  # read by the worker thread: stop starting transactions
        # Whether the worker thread is in a transaction, and whether closing gave up on it (then the
        # thread closes the connection itself when it returns). Guarded by _thread_state.
        self._thread_state = threading.Lock()
        self._thread_busy = False
        self._thread_left_behind = False
        self._reader_left_behind = False
        self._committer_scope = anyio.CancelScope(shield=True)
        self._committer_done = anyio.Event()
        self._thread_slot = anyio.CapacityLimiter(1)
        self._reader_slot = anyio.CapacityLimiter(1)  # closing the reader waits for no other thread
        self._read_slot = anyio.CapacityLimiter(1)  # reads, one at a time (as the read connection takes them)
        self._read_lock = threading.Lock()
        self._read_lock_state = threading.Lock()
        self._running_read: _Read[Any] | None = None
        self._reads_in_flight = 0
        self._transient = False  # set (in the worker thread) when an operation met a deadlock
        self._reconnected = False  # whether the batch being committed already got a new connection
        self._liveness: owners.Liveness | None = None  # once held (see start_liveness)
        self._alive_until = math.inf  # see alive_until
        self._reaped_until = -math.inf  # reaped while its lock was lost: memory is not the store until then
        self._registration_due = False  # the lock was taken back and not yet registered again (see keep_alive)
        self._registration_unsure = False  # a registration since then failed or was given up on: it may have committed
        self._longest_ttl = 0.0  # of the leases this store took (see keep_alive)
        self._liveness_slot = anyio.CapacityLimiter(1)
        self._close_by: float | None = None  # time.monotonic() by which closing ends (see _closing_wait)

    # -- backend hooks -------------------------------------------------------

    def _begin(self, db: Db) -> None:
        """Begin a write transaction (in the worker thread)."""
        db.execute("BEGIN")

    def _begin_read(self, db: Db) -> None:
        """Begin a read-only transaction on the read connection."""
        db.execute("BEGIN")

    def _insert_new_episodes(self, db: Db, sessions: list[str], rows: list[tuple]) -> bool:
        """Insert the rows with one statement; True if every row was new (else the caller undoes it)."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _interrupt(self) -> None:
        """Make the statement running in the worker thread fail soon (called from the event loop)."""

    def _interrupt_reads(self) -> None:
        """Make the statement running on the read connection fail soon (called from the event loop)."""

    def _interrupted(self, error: BaseException) -> bool:
        """Whether ``error`` is what an interrupt makes a statement raise."""
        return False

    def _give_up(self, conn: Any) -> None:
        """Make a thread still waiting on ``conn`` after an interrupt return soon (it is left behind). Any thread."""

    def _reader_connection(self) -> Any:
        """The read connection, reconnected if it was lost."""
        return self._reader

    def _reader_lost(self) -> bool:
        """Whether the read connection is gone (the server dropped it): a read is tried again on a new one."""
        return False

    def _reconnect(self) -> None:
        """Replace the write connection, which was lost (in the worker thread, outside a transaction)."""
        raise NotImplementedError

    async def _side_work(self) -> None:
        """Work of the backend's own beside the committer, while the store serves (cancelled at close)."""

    def _close_side_work(self) -> None:
        """Close what :meth:`_side_work` used (in a thread, after it was cancelled)."""

    def _close_own_connections(self, wait: float) -> None:
        """Close the backend's further connections (in a thread), waiting ``wait`` seconds at most for one in use."""

    def _committed(self) -> None:
        """A transaction committed (called on the event loop)."""

    def _new_liveness(self) -> Any:
        """This engine's liveness lock (store/liveness.py), not yet held; None where there is none."""
        return None

    def _housekeeping(self) -> Operation[Any] | None:
        """An extra operation to ride along with the next transaction, if one is due."""
        return None

    async def _catch_up_recall_index(self) -> None:
        """Index what is stored but not indexed yet (nothing, for a backend that indexes as it writes)."""

    def _search(self, db: Db, query: str, scope: Scope, limit: int) -> list[Recalled]:
        """Search the recall index; a read. Raises :class:`RecallIndexDamaged` if the index is damaged."""
        raise NotImplementedError

    def _rebuild_recall_index(self, db: Db) -> int:
        """Rebuild the recall index from the journal; return how many episodes it holds."""
        raise NotImplementedError

    # -- the committer -------------------------------------------------------

    def _enqueue(self, submission: _Submission, *, urgent: bool = False) -> None:
        """Queue an operation for the next transaction (an urgent one ahead of the rest)."""
        if self._closing:
            raise EngineClosedError("the store is closed")
        submission.urgent = urgent
        (self._urgent if urgent else self._queue).append(submission)
        self._queue_filled.set()

    async def _submit(self, operation: Operation[T], *, urgent: bool = False) -> T:
        """Run ``operation`` in a write transaction; return its result once committed.

        If the caller is cancelled while waiting, the operation still runs.
        """
        submission = _Submission(operation)
        submission.finished = Wakeup()
        self._enqueue(submission, urgent=urgent)
        await submission.finished.wait()
        if submission.error is not None:
            raise submission.error
        return submission.result  # type: ignore[no-any-return]

    async def _read(self, operation: Operation[T]) -> T:
        """Run ``operation`` in a read-only transaction on the read connection.

        A checkpoint. If the caller is cancelled, the read is interrupted and
        left behind (a read changes nothing), so a read stuck on a lock never
        holds up its caller's cancellation, nor the engine's exit.
        """
        if self._reader is None:
            return await self._submit(operation)
        if self._closing:
            raise EngineClosedError("the store is closed")
        read = _Read(operation)
        self._reads_in_flight += 1
        try:
            # One thread slot of their own: reads queued for the read connection hold no slot of
            # anyio's shared pool (renewals, the app's own threads), only this one.
            return await anyio.to_thread.run_sync(self._run_read, read, limiter=self._read_slot, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with self._read_lock_state:
                read.abandoned = True
                still_running = self._running_read is read
            if still_running:
                self._interrupt_reads()
            raise
        finally:
            self._reads_in_flight -= 1

    def _run_read(self, read: _Read[T]) -> T:
        with self._read_lock:  # one thread at a time on the read connection (an abandoned read may still run)
            for attempt in (1, 2):
                with self._read_lock_state:
                    if read.abandoned:
                        raise StoreError("the read was abandoned by its caller")  # nobody receives this
                    self._running_read = read
                try:
                    db = Db(self._reader_connection(), self._dialect)
                    self._begin_read(db)
                    try:
                        return read.operation(db)
                    finally:
                        db.execute("ROLLBACK")  # it wrote nothing
                except self._dialect.errors as exc:
                    if attempt == 1 and self._interrupted(exc) and not read.abandoned:
                        continue  # hit by the interrupt meant for an abandoned read before it: once more
                    if attempt == 1 and self._reader_lost():
                        # Dropped while idle (a server restart, a failover, a pooler): a read changes nothing,
                        # so it simply runs again on a new connection.
                        log.info("the store's read connection was lost (%s); reconnecting", exc)
                        continue
                    raise StoreError(f"reading the store failed: {exc}") from exc
                finally:
                    with self._read_lock_state:
                        self._running_read = None
                        left_behind = self._reader_left_behind
                    if left_behind and self._reader is not None:  # the store closed without it: ours to close
                        with contextlib.suppress(Exception):
                            self._reader.close()
            raise AssertionError("unreachable")

    def _take_batch(self) -> list[_Submission]:
        """The next transaction's operations: every urgent one, then queued ones up to the bounds."""
        batch, self._urgent = self._urgent, []
        rows = chars = 0
        queue = self._queue
        while queue:
            submission = queue[0]
            if batch and (rows + submission.size > TRANSACTION_ROWS or chars + submission.chars > TRANSACTION_CHARS):
                break
            batch.append(queue.popleft())
            rows += submission.size
            chars += submission.chars
        return batch

    async def _run_committer(self) -> None:
        in_flight: list[_Submission] = []
        try:
            # Shielded: the code around the engine may be cancelled, but what
            # the engine does on its way out still needs the store.
            with self._committer_scope:
                while True:
                    if not self._queue and not self._urgent:
                        if self._closing:
                            return
                        self._queue_filled = Wakeup()
                        await self._queue_filled.wait()
                        continue
                    if self._aborted:
                        return
                    batch = in_flight = self._take_batch()
                    extra = self._housekeeping()
                    if extra is not None:
                        batch.append(_Submission(extra))
                    try:
                        with self._thread_state:
                            self._thread_busy = True
                        # Abandoned only when closing gave up on an interrupted statement (see aclose).
                        await anyio.to_thread.run_sync(
                            self._commit_in_thread, batch, limiter=self._thread_slot, abandon_on_cancel=True
                        )
                    except Exception as exc:
                        # A bug or an unexpected error: fail this batch, keep the committer (and engine) alive.
                        log.exception("a store transaction failed unexpectedly")
                        await anyio.to_thread.run_sync(self._abandon, batch, exc, limiter=self._thread_slot)
                    in_flight = []
                    self._committed()
                    for submission in batch:
                        self._finish(submission)
        finally:
            # Stopped early (an interrupted close): nobody may wait for ever.
            for submission in in_flight:
                submission.result = None
                submission.error = UncertainCommitError(
                    "the store stopped while this operation was being committed; it may or may not be stored"
                )
                self._finish(submission)
            left = [*self._urgent, *self._queue]
            self._urgent, self._queue = [], deque()
            for submission in left:
                submission.result = None
                submission.error = StoreError("the store closed before this operation ran; nothing of it was stored")
                self._finish(submission)
            self._committer_done.set()

    def _finish(self, submission: _Submission) -> None:
        if submission.done is not None:
            try:
                submission.done(submission.result, submission.error)
            except Exception:
                log.exception("a store completion callback failed")
        if submission.finished is not None:
            submission.finished.set()

    def _commit_in_thread(self, batch: list[_Submission]) -> None:
        try:
            self._commit(batch)
        finally:
            with self._thread_state:
                self._thread_busy = False
                left_behind = self._thread_left_behind
            if left_behind:  # closing gave up on this thread: the connection is its to close
                with contextlib.suppress(Exception):
                    self._conn.close()

    def _commit(self, batch: list[_Submission]) -> None:
        """Run a batch of operations in one transaction (in the worker thread).

        First all together; if one of them fails, the transaction is rolled back
        and the batch runs again with a savepoint around each operation, so only
        the failing one is refused. A transaction another process's deadlocked
        with (PostgreSQL aborted ours) is run again, all of it, after a short
        jittered pause (retrying.py, on tenacity).
        """
        self._reconnected = False
        try:
            with_retries_in_thread(
                lambda: self._commit_once(batch),
                _TRANSIENT_ATTEMPTS,
                lambda exc: isinstance(exc, _Deadlocked) and not self._aborted,
                lambda attempt, _: log.info("a store transaction met a deadlock; retrying (attempt %d)", attempt + 1),
                _DEADLOCK_WAIT,
            )
        except (_Deadlocked, _Interrupted):
            reason = (
                "the store was closing and interrupted it"
                if self._aborted
                else "the transaction kept deadlocking with other processes"
            )
            for submission in batch:
                submission.result = None
                submission.error = StoreError(f"nothing was stored: {reason}")

    def _commit_once(self, batch: list[_Submission]) -> None:
        """One go at the batch; raises _Deadlocked if it must run again, _Interrupted if closing stopped it."""
        if self._aborted:
            raise _Interrupted
        self._transient = False
        if self._transaction([s for s in batch if not s.refused], isolate=False):
            return
        if self._aborted:
            raise _Interrupted
        # Without the operation that waited too long, if one did: it would only wait again.
        if not self._transient and self._transaction([s for s in batch if not s.refused], isolate=True):
            return
        if self._aborted:
            raise _Interrupted
        if self._transient:
            raise _Deadlocked

    def _transaction(self, batch: list[_Submission], *, isolate: bool) -> bool:
        errors = self._dialect.errors
        db = Db(self._conn, self._dialect)
        try:
            self._begin(db)
        except errors as exc:
            self._rollback(db)
            if self._connection_lost() and not self._reconnected:
                # Dropped while idle, or during the attempt before (which the server then rolled
                # back): nothing is in flight, so the transaction is simply begun on a new connection.
                self._reconnected = True
                log.info("the store's connection was lost (%s); reconnecting", exc)
                try:
                    self._reconnect()
                except errors as again:
                    exc = again
                else:
                    return self._transaction(batch, isolate=isolate)
            for submission in batch:
                submission.result = None
                submission.error = StoreError(f"could not begin a transaction: {exc}")
            return True
        rest = batch
        if not isolate:
            # Renewals first (a lease about to lapse is extended before anything checks it), then
            # appends, all in one statement, then eviction boundaries, all in another: they commute
            # with every other operation a transaction can hold (a session's own deletes, clears and
            # reads wait for its append; retain batches and summaries only read what an earlier
            # commit stored), so their order among the rest does not matter.
            for submission in [submission for submission in batch if submission.urgent]:
                if not self._run_one(db, submission):
                    self._rollback(db)
                    return False
            appends = [submission for submission in batch if submission.append is not None]
            evictions = [submission for submission in batch if submission.eviction is not None]
            if appends and not self._append_run(db, appends):
                self._rollback(db)
                return False
            if evictions and not self._eviction_run(db, evictions):
                self._rollback(db)
                return False
            rest = [
                submission
                for submission in batch
                if not submission.urgent and submission.append is None and submission.eviction is None
            ]
        index = 0
        while index < len(rest):
            if self._transient or self._aborted:
                self._rollback(db)
                return False
            submission = rest[index]
            index += 1
            if not isolate:
                if not self._run_one(db, submission):
                    self._rollback(db)
                    return False
                continue
            db.execute("SAVEPOINT operation")
            if self._run_one(db, submission):
                db.execute("RELEASE operation")
            elif self._transient:
                continue  # the whole transaction is retried (see the top of the loop)
            else:
                db.execute("ROLLBACK TO operation")
                db.execute("RELEASE operation")
        if self._transient:
            self._rollback(db)
            return False
        try:
            db.execute("COMMIT")
        except errors as exc:
            self._rollback(db)
            if self._connection_lost():
                # The server may have committed before the connection went: say so.
                error: StoreError = UncertainCommitError(
                    f"the connection was lost while committing; the operation may or may not be stored ({exc})"
                )
            else:
                error = StoreError(f"commit failed, nothing was stored: {exc}")
            for submission in batch:
                submission.result = None
                submission.error = error
        return True

    def _connection_lost(self) -> bool:
        return False

    def _rollback(self, db: Db) -> None:
        """Roll back whatever is open; a connection that is gone has nothing open."""
        try:
            if self._in_transaction():
                db.execute("ROLLBACK")
        except self._dialect.errors:
            if not self._connection_lost():
                raise

    def _abandon(self, batch: list[_Submission], error: BaseException) -> None:
        self._rollback(Db(self._conn, self._dialect))
        for submission in batch:
            submission.result = None
            submission.error = StoreError(f"nothing was stored: {error!r}")

    def _append_run(self, db: Db, run: list[_Submission]) -> bool:
        """Store consecutive appends (of different sessions) with one statement.

        One query checks every lease; seqs are numbered on the assumption that
        no id is already stored. If a lease is stale, each append takes the
        row-by-row path, which checks its own lease and skips stored ids; if
        the row count shows a stored id, the transaction is run again with
        each operation on its own (see _run_together).
        """
        rows: list[Any] = []
        first_appends = []
        held = []
        for submission in run:
            session_id, token, first_seq, episodes = submission.append  # type: ignore[misc]
            held.append((session_id, token))
            if first_seq == 1:
                first_appends.append(session_id)
            rows += [journal.episode_row(session_id, seq, episode) for seq, episode in enumerate(episodes, first_seq)]
        return self._run_together(
            db,
            run,
            lambda: leases.all_held(db, held),
            lambda: self._insert_new_episodes(db, first_appends, rows),
            lambda submission: journal.appended(submission.append[2], submission.append[3]),  # type: ignore[index]
        )

    def _eviction_run(self, db: Db, run: list[_Submission]) -> bool:
        """Store the eviction boundaries of several sessions with one lease query and one statement.

        If a lease is stale, each boundary takes its own path
        (journal.record_eviction), which refuses only the stale one.
        """
        evictions: list[tuple[str, int, int]] = [submission.eviction for submission in run]  # type: ignore[misc]

        def write() -> bool:
            journal.record_evictions(db, evictions)
            return True

        return self._run_together(
            db,
            run,
            lambda: leases.all_held(db, [(session_id, token) for session_id, token, _ in evictions]),
            write,
            lambda submission: None,
        )

    def _run_together(
        self,
        db: Db,
        run: list[_Submission],
        check: Callable[[], bool],
        write: Callable[[], bool],
        result: Callable[[_Submission], Any],
    ) -> bool:
        """Run ``write``, one statement for the whole ``run``, and give each its ``result``.

        ``check`` (a read: every lease held) comes first: if it says no,
        nothing is written yet and each operation runs on its own (_run_one),
        which fails only the one at fault. If ``write`` says no (a row already
        stored) or fails, it may have written part of the run: False, so the
        transaction is rolled back and run again with each operation on its
        own (see _commit). No savepoint guards the usual case: SQLite copies
        every page a savepoint's statements change to a statement journal
        (1.5 times the cost per inserted row: benchmarks/sqlite_write_costs.py).
        """
        try:
            if not check():
                return all([self._run_one(db, submission) for submission in run])
            written = write()
        except self._dialect.transient:
            self._transient = True  # the whole transaction is tried again (see _commit)
            return False
        except self._dialect.errors:
            return False
        if not written:
            return False
        for submission in run:
            submission.result = result(submission)
            submission.error = None
        return True

    def _run_one(self, db: Db, submission: _Submission) -> bool:
        # Nothing of an earlier, rolled-back attempt may survive (a result would say "stored").
        submission.result = None
        submission.error = None
        try:
            if submission.operation is None:  # an append, run on its own (see _append_run for the usual way)
                session_id, token, first_seq, episodes = submission.append  # type: ignore[misc]
                submission.result = journal.append(db, session_id, token, first_seq, episodes)
            else:
                submission.result = submission.operation(db)
        except self._dialect.transient as exc:
            submission.error = StoreError(str(exc))
            self._transient = True
            return False
        except self._dialect.too_slow as exc:
            if self._aborted:
                submission.error = StoreError(str(exc))
            else:
                submission.refused = True
                submission.error = StoreError(
                    "nothing was stored: a statement waited too long, for a lock another transaction holds (that "
                    f"process may be frozen or cut off mid-write) or for the database ({exc})"
                )
            return False
        except self._dialect.errors as exc:
            submission.error = StoreError(str(exc))
            return False
        except Exception as exc:
            submission.error = exc
            return False
        return True

    async def aclose(self, grace: float = CLOSE_TIMEOUT) -> bool:
        """Finish the operations already submitted, then stop; True if all of them ran.

        Takes at most ``grace`` seconds (and a moment to interrupt the
        statement in progress): what is left then fails with :class:`StoreError`.
        Shielded: a cancelled caller still gets a store that has stopped.
        """
        if self._aborted:
            # Closed already, by an interrupt: all ran only if no worker thread was left behind.
            return self._committer_done.is_set() and not self._thread_left_behind
        self._closing = True
        self._queue_filled.set()
        with anyio.CancelScope(shield=True):
            try:
                return await self._finish_or_interrupt(grace)
            finally:
                if self._reads_in_flight:
                    # Nothing waits for a read once the store closes; one stuck on a lock must not hold it open.
                    self._interrupt_reads()
        raise AssertionError("unreachable: a shielded scope nobody cancels swallows nothing")

    async def _finish_or_interrupt(self, grace: float) -> bool:
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(max(grace, 0.0)):
                await self._committer_done.wait()
                self._close_by = time.monotonic() + INTERRUPT_SECONDS
                return True
            self._close_by = time.monotonic() + INTERRUPT_SECONDS
            pending = len(self._queue) + len(self._urgent)
            log.warning(
                "the store did not finish its work in time (%.1f s; the database may be locked or unreachable); "
                "interrupting it: %d queued operations are dropped, and unfinished work is redone at the next start",
                grace,
                pending,
            )
            self._aborted = True
            self._interrupt()
            with anyio.move_on_after(INTERRUPT_SECONDS):
                await self._committer_done.wait()
                return True
            with self._thread_state:
                left_behind = self._thread_left_behind = self._thread_busy
            if left_behind:
                # Its connection stays open (the thread may still use it); the thread closes it on return.
                log.error("the store's worker thread did not return after an interrupt; leaving it behind")
                self._give_up(self._conn)
            self._committer_scope.cancel()  # abandons the thread, if it is still running
            await self._committer_done.wait()
            return not left_behind
        raise AssertionError("unreachable: a shielded scope nobody cancels swallows nothing")

    @asynccontextmanager
    async def serving(self, prepare: Callable[[], object]) -> AsyncIterator[None]:
        """Prepare the connection (in a thread), then run the committer for the block's duration.

        On exit, operations already submitted are committed (within
        :data:`CLOSE_TIMEOUT`); the connections are closed whatever happened,
        even if ``prepare`` failed, unless a worker thread is still using one.
        Closing them takes :data:`INTERRUPT_SECONDS` at most, counted from when
        closing stopped waiting for the work: they are closed side by side, and
        one still in use then is left to the thread using it.
        """
        finished = True
        try:
            await anyio.to_thread.run_sync(prepare)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._run_committer)
                side = anyio.CancelScope()
                tasks.start_soon(self._run_side_work, side)
                try:
                    yield
                finally:
                    finished = await self.aclose()
                    side.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                wait = self._closing_wait()
                async with anyio.create_task_group() as closing:
                    closing.start_soon(_in_thread, self._close_side_work)
                    closing.start_soon(_in_thread, functools.partial(self._close_own_connections, wait))
                    if finished:
                        closing.start_soon(_in_thread, self._conn.close)
                    if self._reader is not None:
                        closing.start_soon(_in_thread, functools.partial(self._close_reader, wait), self._reader_slot)
                    if self._liveness is not None:
                        # Not in the liveness slot: an abandoned check may hold it until it returns (trio).
                        closing.start_soon(_in_thread, functools.partial(self._liveness.release, wait))

    def _closing_wait(self) -> float:
        """Seconds closing the connections may still wait for one in use."""
        if self._close_by is None:
            return INTERRUPT_SECONDS
        return max(self._close_by - time.monotonic(), 0.0)

    async def _run_side_work(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self._side_work()

    def _close_reader(self, wait: float) -> None:
        # After a read still running has returned (it was interrupted); one that does not is left
        # behind, and closes the connection itself when it returns.
        if not self._read_lock.acquire(timeout=wait):
            with self._read_lock_state:
                self._reader_left_behind = True
            if not self._read_lock.acquire(blocking=False):
                log.error("a read of the store did not return after an interrupt; leaving it behind")
                self._give_up(self._reader)
                return
        try:
            with contextlib.suppress(Exception):
                if self._reader is not None:
                    self._reader.close()
        finally:
            self._read_lock.release()

    # -- sessions --------------------------------------------------------------

    async def activate(self, session_id: str, ttl: float) -> tuple[int, SessionSnapshot]:
        self._longest_ttl = max(self._longest_ttl, ttl)
        activated = await self._submit(lambda db: journal.activate(db, session_id, self.owner, ttl))
        if isinstance(activated, SessionBusyError):
            raise activated
        return activated

    async def renew_leases(self, held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        if self.forked():
            return set()  # the parent's leases: never renewed from a forked child
        # Urgent: a lease must never lapse because writes were queued ahead of its renewal.
        return await self._submit(lambda db: leases.renew(db, self.owner, held, ttl), urgent=True)

    async def release_lease(self, session_id: str, token: int) -> None:
        await self._submit(lambda db: leases.release(db, session_id, token))

    async def release_leases(self) -> None:
        liveness = self._liveness

        def release(db: Db) -> None:
            leases.release_all(db, self.owner)
            if liveness is not None:
                owners.unregister(db, liveness)

        await self._submit(release)

    # -- liveness (store/owners.py) --------------------------------------------

    async def start_liveness(self) -> None:
        liveness = self._new_liveness()
        if liveness is None:
            return
        try:
            await anyio.to_thread.run_sync(liveness.hold, limiter=self._liveness_slot)
        except Exception as exc:
            log.warning(
                "this engine cannot hold a liveness lock (%s): if it dies, its sessions wait for their leases "
                "to expire",
                exc,
            )
            return
        asked_at = anyio.current_time()
        await self._submit(lambda db: owners.register(db, self.owner, liveness))
        self._liveness = liveness
        self._alive_until = self._alive_after(asked_at)

    def alive_until(self) -> float:
        if anyio.current_time() < self._reaped_until:
            return -math.inf  # every read renews its lease first: those reaped fail (keep_alive)
        return self._alive_until

    def _alive_after(self, asked_at: float) -> float:
        """How long after a check that found the liveness lock held (asked at ``asked_at``) it may be counted on.

        Another process reaps this one no sooner than ``grace`` after it saw the lock gone (which was
        after ``asked_at``); two heartbeats are kept as a margin for noticing and cancelling.
        """
        assert self._liveness is not None
        grace = self._liveness.grace
        return math.inf if grace == 0 else asked_at + grace - 2 * HEARTBEAT_SECONDS

    def forked(self) -> bool:
        """Whether this is a forked child of the process that opened the store: its leases are the parent's."""
        return os.getpid() != self._pid

    async def keep_alive(self) -> bool:
        liveness = self._liveness
        if liveness is None or self.forked():
            return True
        asked_at = anyio.current_time()
        held = await anyio.to_thread.run_sync(liveness.check, limiter=self._liveness_slot, abandon_on_cancel=True)
        if not held:
            self._registration_due = True  # until a registration commits: a failed one is made again next time
        if self._registration_due:
            # Back among the living. If it was reaped meanwhile, its leases may have been released and taken:
            # no lease known valid by this process's clock before now may be counted on. Every one was
            # renewed before now and lasts at most the longest ttl: until then, every read renews first.
            # Assumed until a registration says otherwise: one that failed or was given up on (cancelled)
            # may have committed unseen, and then the next one finds the registration there.
            before = self._reaped_until
            self._reaped_until = max(before, anyio.current_time() + self._longest_ttl)
            proof = not self._registration_unsure
            self._registration_unsure = True
            registered = await self._submit(lambda db: owners.register(db, self.owner, liveness))
            self._registration_due = self._registration_unsure = False
            if registered and proof:
                self._reaped_until = before
            elif not registered:
                log.warning("this engine was taken for dead while its liveness lock was lost: checking its leases")
            asked_at = anyio.current_time()  # counted from now: it was not held all along
        self._alive_until = self._alive_after(asked_at)
        return bool(held)

    async def wanted_sessions(self) -> list[str]:
        return await self._read(lambda db: handover.wanted(db, self.owner))

    async def reap_dead_owners(self, among: Sequence[str] | None = None) -> owners.Reaped:
        liveness = self._liveness
        if liveness is None:
            return owners.NOTHING_REAPED
        dead, others = await self._read(lambda db: owners.dead_owners(db, liveness, self.owner, among))
        if not dead:
            return owners.Reaped(others=others)
        reaped = await self._submit(lambda db: owners.reap(db, liveness, self.owner, dead))
        if reaped.incarnations:  # committed: nobody checks them again
            await anyio.to_thread.run_sync(liveness.forget, reaped.incarnations)
        return reaped

    async def load_session(self, session_id: str) -> SessionSnapshot:
        return await self._read(lambda db: journal.load(db, session_id))

    def submit_append(
        self, session_id: str, token: int, first_seq: int, episodes: Sequence[Episode], done: Completion[AppendResult]
    ) -> None:
        chars = len(episodes[0].content) if len(episodes) == 1 else sum([len(e.content) for e in episodes])
        if len(episodes) > TRANSACTION_ROWS or chars > TRANSACTION_CHARS:
            _AppendInParts(self, session_id, token, first_seq, episodes, done).start()
            return
        self._enqueue(_Submission(None, done, (session_id, token, first_seq, episodes), len(episodes), chars))

    def submit_eviction(self, session_id: str, token: int, through_seq: int, done: Completion[None]) -> None:
        operation = functools.partial(
            journal.record_eviction, session_id=session_id, token=token, through_seq=through_seq
        )
        submission = _Submission(operation, done)
        submission.eviction = (session_id, token, through_seq)  # so that evictions run together (_eviction_run)
        self._enqueue(submission)

    async def store_summary(self, session_id: str, token: int, generation: int, through_seq: int, summary: str) -> bool:
        return await self._submit(
            lambda db: journal.store_summary(db, session_id, token, generation, through_seq, summary)
        )

    async def delete_episodes(self, session_id: str, token: int, seqs: Sequence[int]) -> tuple[int, SessionSnapshot]:
        return await self._submit(lambda db: journal.delete_episodes(db, session_id, token, seqs))

    async def clear_session(self, session_id: str, token: int) -> SessionSnapshot:
        return await self._submit(lambda db: journal.clear_session(db, session_id, token))

    async def sessions_needing_summary(
        self, max_episodes: int, max_chars: int, *, orphaned_only: bool = False
    ) -> list[str]:
        return await self._read(
            lambda db: journal.sessions_needing_summary(db, self.owner, max_episodes, max_chars, orphaned_only)
        )

    async def release_orphans(self, max_episodes: int, max_chars: int, *, retaining: bool) -> int:
        released = 0
        after: str | None = None
        while True:
            step, after = await self._submit(
                functools.partial(
                    orphans.release_handled,
                    max_episodes=max_episodes,
                    max_chars=max_chars,
                    retaining=retaining,
                    after=after,
                )
            )
            released += step
            if after is None:
                return released

    async def list_sessions(self) -> list[SessionRow]:
        return await self._read(journal.list_sessions)

    # -- retain outbox and recall ---------------------------------------------

    def submit_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None,
        limit: int | None,
        done: Completion[int],
    ) -> None:
        operation = functools.partial(
            outbox.enqueue, session_id=session_id, token=token, mode=mode, through_seq=through_seq, limit=limit
        )
        self._enqueue(_Submission(operation, done))

    async def enqueue_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None = None,
        *,
        batch_size: int | None = None,
    ) -> int:
        return await self._submit(
            lambda db: outbox.enqueue(db, session_id, token, mode, through_seq, batch_size=batch_size)
        )

    async def enqueue_all_retains(
        self, mode: RetainMode, *, orphaned_only: bool = False, batch_size: int | None = None
    ) -> list[str]:
        # A step of at most a hundred sessions per transaction: renewals and writers go in between.
        handled: list[str] = []
        after: str | None = None
        while True:
            step, after = await self._submit(
                functools.partial(
                    outbox.enqueue_all,
                    owner=self.owner,
                    mode=mode,
                    orphaned_only=orphaned_only,
                    after=after,
                    batch_size=batch_size,
                )
            )
            handled.extend(step)
            if after is None:
                return handled

    async def pending_retains(self, limit: int) -> list[OutboxEntry]:
        return await self._read(lambda db: outbox.pending(db, limit, journal.episode_from_row))

    async def due_retains(self, limit: int, *, ignore_backoff: bool = False) -> DueRetains:
        return await self._read(lambda db: outbox.due(db, self.owner, limit, ignore_backoff))

    async def claim_retain(self, entry_id: int, key: str, ttl: float) -> OutboxEntry | outbox.Unclaimable:
        return await self._submit(lambda db: outbox.claim(db, entry_id, key, self.owner, ttl, journal.episode_from_row))

    async def extend_retain_claim(self, entry_id: int, key: str, ttl: float) -> bool:
        return await self._submit(lambda db: outbox.extend_claim(db, entry_id, key, self.owner, ttl))

    async def mark_retained(self, entry_id: int, key: str) -> None:
        await self._submit(lambda db: outbox.mark_delivered(db, entry_id, key))

    async def mark_retain_failed(
        self, entry_id: int, key: str, error: str, retry_in: float = 0.0, *, set_aside: bool = False
    ) -> None:
        await self._submit(lambda db: outbox.mark_failed(db, entry_id, key, self.owner, error, retry_in, set_aside))

    async def handed_on(self, session_id: str) -> tuple[int, tuple[Episode, ...]]:
        return await self._read(lambda db: outbox.handed_on(db, session_id, journal.episode_from_row))

    async def outbox_state(self) -> OutboxState:
        return await self._read(outbox.state)

    # -- work set aside ---------------------------------------------------------

    async def set_summary_aside(
        self, session_id: str, token: int, generation: int, through_seq: int, attempts: int, error: str
    ) -> bool:
        return await self._submit(
            lambda db: set_aside.set_summary_aside(db, session_id, token, generation, through_seq, attempts, error)
        )

    async def lift_summary_set_aside(self, session_id: str, token: int | None) -> bool:
        return await self._submit(lambda db: set_aside.clear_summary_mark(db, session_id, token))

    async def summary_set_aside(self, session_id: str) -> SetAside | None:
        return await self._read(lambda db: set_aside.summary_of(db, session_id))

    async def list_set_aside(self, session_id: str | None = None, limit: int = 1000) -> list[SetAside]:
        return await self._read(lambda db: set_aside.listing(db, session_id, limit))

    async def set_aside_counts(self) -> SetAsideCounts:
        return await self._read(set_aside.counts)

    async def retry_set_aside_retains(self, session_id: str | None = None) -> int:
        return await self._submit(lambda db: set_aside.retry_retains(db, session_id))

    async def discard_set_aside_retains(self, session_id: str | None = None) -> list[SetAside]:
        return await self._submit(lambda db: set_aside.discard_retains(db, session_id))

    async def recall(self, query: str, scope: Scope, limit: int) -> list[Recalled]:
        """Search ``scope``: index what waits (in bounded steps), then read; rebuild a damaged index."""
        search = functools.partial(self._search, query=query, scope=scope, limit=limit)
        try:
            await self._catch_up_recall_index()
            return await self._read(search)
        except RecallIndexDamaged as damage:
            log.warning("%s; rebuilding it from the journal", damage)
            await self.rebuild_recall_index()
            return await self._read(search)

    async def rebuild_recall_index(self) -> int:
        return await self._submit(self._rebuild_recall_index)

    # -- scopes: listing, export, erasure (scoped.py, erasure.py) -------------

    async def scope_session_ids(self, scope: Scope, after: str | None, limit: int) -> list[str]:
        return await self._read(lambda db: scoped.session_ids(db, scope, after, limit))

    async def scope_counts(self, scope: Scope) -> ScopeCounts:
        return await self._read(lambda db: scoped.counts(db, scope))

    async def exported_session(self, session_id: str) -> ExportedSession:
        return await self._read(lambda db: scoped.exported_session(db, session_id))

    async def episodes_after(self, session_id: str, after_seq: int, limit: int) -> list[Episode]:
        return await self._read(lambda db: scoped.episodes_after(db, session_id, after_seq, limit))

    async def erase_session(self, session_id: str, token: int) -> Erased:
        # Steps of at most an add's transaction: other sessions' writes and renewals go in between.
        episodes = summaries = batches = 0
        while True:
            step = await self._submit(
                functools.partial(erasure.erase_step, session_id=session_id, token=token, limit=TRANSACTION_ROWS)
            )
            episodes += step.episodes
            summaries += step.summaries
            batches += step.outbox_batches
            if step.complete:
                return Erased(episodes, summaries, batches, traces_left=step.traces_left)


class _AppendInParts:
    """An add too large for one transaction, stored part by part (see unfinished.py).

    Each part is queued when the one before it has committed, so other
    writers and lease renewals go in between. If a part fails, the parts
    already stored are undone before the caller hears of it; if even that
    fails, the caller gets :class:`UncertainCommitError` (the session reloads,
    and its next activation undoes them).
    """

    def __init__(
        self,
        store: GroupCommitStore,
        session_id: str,
        token: int,
        first_seq: int,
        episodes: Sequence[Episode],
        done: Completion[AppendResult],
    ) -> None:
        self._store = store
        self._session_id = session_id
        self._token = token
        self._first_seq = first_seq
        self._next_seq = first_seq
        self._parts = _parts(episodes)
        self._stored = 0
        self._results: list[tuple[Episode, bool]] = []
        self._done = done

    def start(self) -> None:
        self._store._enqueue(self._part(0))  # refused at once if the store is closing: nothing stored

    def _part(self, index: int) -> _Submission:
        episodes = self._parts[index]
        operation = functools.partial(
            journal.append_part,
            session_id=self._session_id,
            token=self._token,
            first_seq=self._next_seq,
            episodes=episodes,
            add_first_seq=self._first_seq,
            first_part=index == 0,
            last_part=index == len(self._parts) - 1,
        )
        return _Submission(
            operation, self._part_stored, size=len(episodes), chars=sum(len(e.content) for e in episodes)
        )

    def _part_stored(self, results: AppendResult | None, error: BaseException | None) -> None:
        if error is None and results is not None:
            self._results.extend(results)
            self._next_seq += sum(1 for _, is_new in results if is_new)
            self._stored += 1
            if self._stored == len(self._parts):
                self._done(tuple(self._results), None)
                return
            try:
                self._store._enqueue(self._part(self._stored))
                return
            except EngineClosedError as closed:
                error = closed
        error = error or StoreError("the add was not stored")
        if self._stored == 0:
            self._done(None, error)  # the first part rolled back: nothing of the add is stored
            return
        undo = functools.partial(
            journal.undo_append, session_id=self._session_id, token=self._token, add_first_seq=self._first_seq
        )
        try:
            self._store._enqueue(_Submission(undo, functools.partial(self._undone, error)))
        except EngineClosedError:
            self._undone(error, None, StoreError("the store closed before the stored parts could be undone"))

    def _undone(self, error: BaseException, result: object, undo_error: BaseException | None) -> None:
        if undo_error is None:
            self._done(None, error)
            return
        self._done(
            None,
            UncertainCommitError(
                f"part of this add was stored and could not be undone yet ({undo_error}); it is undone when the "
                f"session is next loaded ({error})"
            ),
        )


def _parts(episodes: Sequence[Episode]) -> list[Sequence[Episode]]:
    """Split an add into runs that each fit one transaction (an episode too large for one goes alone)."""
    parts: list[Sequence[Episode]] = []
    start = chars = 0
    for index, episode in enumerate(episodes):
        length = len(episode.content)
        if index > start and (index - start >= TRANSACTION_ROWS or chars + length > TRANSACTION_CHARS):
            parts.append(episodes[start:index])
            start, chars = index, 0
        chars += length
    parts.append(episodes[start:])
    return parts


async def _in_thread(function: Callable[[], object], limiter: anyio.CapacityLimiter | None = None) -> None:
    await anyio.to_thread.run_sync(function, limiter=limiter)
