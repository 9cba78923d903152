"""Group commit for both backends: the queue, the worker thread, the read connection, closing.

Every operation is a small function run against one connection. Operations
submitted while a transaction is being committed wait and then go into the
next transaction together: one thread hop and one commit serve every session
that wrote meanwhile, and each caller is answered once its own rows are
committed. Both drivers block, so the transactions run in a thread of the
store's own (commit_thread.py), one at a time (never two threads on the
connection at once).

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

The group commit is built in layers, each a module of one concern:
backend.py (the hooks a backend fills in), transactions.py (one batch in one
transaction), this module (the queue, the worker thread, reads, closing),
side_work.py (lease renewals, liveness, reaping) and operations.py
(:class:`GroupCommitStore`: what each store method submits).
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
from typing import Any

import anyio

from ..actor.wakeup import Wakeup
from ..episode import Episode
from ..errors import EngineClosedError, StoreError, UncertainCommitError
from . import journal, owners
from .base import (
    AppendResult,
    Completion,
)
from .commit_thread import CommitThread
from .dialect import Db, Dialect
from .submission import Operation, PendingRead, Submission, T
from .transactions import Transactions

log = logging.getLogger("memengine.store")

#: Rows (episodes of an add; other operations count one) one transaction takes at most.
TRANSACTION_ROWS = 2000
#: Characters of content one transaction stores at most (a single larger episode goes alone).
TRANSACTION_CHARS = 8_000_000
#: Seconds an operation that rides along (see _ride_along) waits for a transaction before it commits on its own.
RIDER_SECONDS = 1.0
#: Seconds a summary waits to ride along with another write (an add, most often) before it commits on its own.
SUMMARY_RIDER_SECONDS = 0.05
#: The same for a summary with more of a backlog behind it: the next batch waits for it, so only a write already on
#: its way is worth waiting for.
BACKLOG_RIDER_SECONDS = 0.005
#: Seconds closing waits for submitted operations before interrupting them.
CLOSE_TIMEOUT = 2.0
#: Seconds, once closing stopped waiting for the work, that the statements it interrupted get to
#: return and the connections get to close; a thread still waiting then (the server went silent)
#: is left behind, told to give its connection up (postgres/replies.py), and closes it on return.
INTERRUPT_SECONDS = 2.0


def new_owner_id() -> str:
    """This process's name in lease rows: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Running:
    """A transaction handed to the commit thread: its operations, and when (and how) it returned."""

    __slots__ = ("batch", "done", "error", "upkeep")

    def __init__(self, batch: list[Submission], upkeep: list[anyio.Event] | None = None) -> None:
        self.batch = batch
        self.done = Wakeup()
        self.error: BaseException | None = None
        #: Not a transaction but the backend's upkeep between two (a WAL checkpoint), and who waits for it.
        self.upkeep = upkeep


class Committer(Transactions):
    """The group commit: a queue of submissions, one worker thread committing them, a read connection.

    Backends are subclasses (through operations.py's :class:`GroupCommitStore`);
    ``owner`` names this process in lease rows (one store per engine).
    """

    #: Where the store is, as messages and reprs show it (a URL without its password); set by the opener.
    location = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    def __init__(self, conn: Any, dialect: Dialect, owner: str | None = None, reader: Any | None = None) -> None:
        super().__init__(conn, dialect, reader)
        self.owner = owner or new_owner_id()
        self._pid = os.getpid()  # a forked child renews nothing of its parent's (see forked)
        self._longest_ttl = 0.0  # of the leases this store took: each part of a large add extends its own by it
        self._queue: deque[Submission] = deque()
        self._urgent: list[Submission] = []  # lease renewals: into the next transaction, first
        self._riders: list[Submission] = []  # into the next transaction, whenever one runs (see _ride_along)
        self._riders_due = math.inf  # anyio.current_time() by which the riders commit, alone if need be
        self._queue_filled = Wakeup()
        self._parked = False  # the committer waits for work, and a submission may start a transaction itself
        self._running: _Running | None = None  # the transaction in the thread, until its callers are answered
        self._upkeep_waiting: list[anyio.Event] = []  # callers of _upkeep_between_transactions not yet served
        self._closing = False
        # Whether the worker thread is in a transaction, and whether closing gave up on it (then the
        # thread closes the connection itself when it returns). Guarded by _thread_state.
        self._thread_state = threading.Lock()
        self._thread_busy = False
        self._thread_left_behind = False
        self._reader_left_behind = False
        self._committer_scope = anyio.CancelScope(shield=True)
        self._committer_done = anyio.Event()
        self._commit_thread = CommitThread("memengine store commits")  # one transaction at a time
        self._reader_slot = anyio.CapacityLimiter(1)  # closing the reader waits for no other thread
        self._read_slot = anyio.CapacityLimiter(1)  # reads, one at a time (as the read connection takes them)
        self._read_lock = threading.Lock()
        self._read_lock_state = threading.Lock()
        self._running_read: PendingRead[Any] | None = None
        self._reads_in_flight = 0
        self._liveness: owners.Liveness | None = None  # once held (see side_work.py's start_liveness)
        self._close_by: float | None = None  # time.monotonic() by which closing ends (see _closing_wait)

    # -- the committer -------------------------------------------------------

    def _enqueue(self, submission: Submission, *, urgent: bool = False) -> None:
        """Queue an operation for the next transaction (an urgent one ahead of the rest)."""
        if self._closing:
            raise EngineClosedError("the store is closed")
        submission.urgent = urgent
        (self._urgent if urgent else self._queue).append(submission)
        if self._parked and self._running is None and not self._aborted and self._commit_thread.started:
            # An idle store: the transaction (or upkeep asked for, see _start_batch) starts now, from the
            # submitter's task, not a task switch later; the committer stays parked (its callback wakes
            # the committer if more comes meanwhile).
            # (Only a thread already running: starting one may fail, and that is the committer's to meet.)
            self._start_batch()
        elif self._parked and self._running is None:
            self._queue_filled.set()
        # (Otherwise the committer is on its way, or waits for the transaction in flight, then looks.)

    def _ride_along(self, submission: Submission, within: float | None = None) -> None:
        """Queue an operation for the next transaction that runs for another reason (or as the store closes).

        For what may wait (an eviction boundary, which may even be lost in a
        crash; a summary, whose episodes stay shown raw until it is stored):
        under load it costs no commit of its own; when nothing else comes
        within ``within`` seconds (:data:`RIDER_SECONDS`), it commits alone.
        """
        if self._closing:
            raise EngineClosedError("the store is closed")
        self._riders.append(submission)
        due = anyio.current_time() + (RIDER_SECONDS if within is None else within)
        if due < self._riders_due:
            # A committer waiting for work waits until the riders are due: start (or shorten) its clock.
            self._riders_due = due
            self._queue_filled.set()

    def hurry_riders(self) -> None:
        """A read waits for a summary: a summary riding along commits now (with the other riders), alone if need be.

        Only eviction boundaries riding: nothing (a summary still being made is submitted unhurried then,
        see SummarizeBatch), so they are not committed alone for nothing.
        """
        now = anyio.current_time()
        if self._riders_due > now and any(rider.eviction is None for rider in self._riders):
            self._riders_due = now
            self._queue_filled.set()  # a parked committer looks again, and finds them due

    async def _submit(self, operation: Operation[T], *, urgent: bool = False, ride: float | None = None) -> T:
        """Run ``operation`` in a write transaction; return its result once committed.

        With ``ride``, it rides along with the next transaction, or commits
        alone ``ride`` seconds later (see _ride_along). If the caller is
        cancelled while waiting, the operation still runs.
        """
        submission = Submission(operation)
        submission.finished = Wakeup()
        if ride is None:
            self._enqueue(submission, urgent=urgent)
        else:
            self._ride_along(submission, ride)
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
        read = PendingRead(operation)
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

    def _run_read(self, read: PendingRead[T]) -> T:
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

    def _take_batch(self) -> list[Submission]:
        """The next transaction's operations: urgent ones, riders (up to TRANSACTION_ROWS), queued ones to bounds."""
        batch, self._urgent = self._urgent, []
        if self._riders:
            # Riders take no room from queued work (they ride along with it), but are bounded on their own:
            # many sessions' summaries may ride at once.
            riders = self._riders
            taken = rows = 0
            for rider in riders:
                if taken and rows + rider.size > TRANSACTION_ROWS:
                    break
                rows += rider.size
                taken += 1
            batch.extend(riders[:taken])
            if taken == len(riders):
                self._riders = []
                self._riders_due = math.inf
            else:
                del riders[:taken]  # still due: they go in the next transaction
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
        try:
            # Shielded: the code around the engine may be cancelled, but what
            # the engine does on its way out still needs the store.
            with self._committer_scope:
                while True:
                    if self._running is None:
                        if not self._queue and not self._urgent and not (self._closing and self._riders):
                            if self._closing:
                                return
                            if not await self._wait_for_work():
                                continue
                            if not (self._riders or self._queue or self._urgent):
                                continue  # a submission's transaction took the riders meanwhile
                            # Nothing came for the riders to ride along with: they go on their own.
                        if self._aborted:
                            return
                        if self._running is None:  # (a submission may have started one while we waited)
                            self._start_batch()
                    running = self._running
                    assert running is not None
                    if not (running.done.is_set() or self._closing or self._riders_waiting_out()):
                        # Parked while it runs, as while idle: it returns to no task of ours unless there is
                        # more to do (see _batch_done), and the next submission to an idle store starts its
                        # own transaction (_enqueue), without waiting for this task's turn.
                        await self._wait_for_work()
                        continue
                    await running.done.wait()
                    if running.error is not None:
                        # A bug or an unexpected error: fail this batch, keep the committer (and engine) alive.
                        log.error("a store transaction failed unexpectedly", exc_info=running.error)
                        await self._commit_thread.run(self._abandon, running.batch, running.error)
                        self._answer_batch(running)
                        if self._running is None and self._upkeep_waiting and not self._closing:
                            self._start_upkeep()  # asked for meanwhile: between this transaction and the next
        finally:
            # Stopped early (an interrupted close): nobody may wait for ever.
            running, self._running = self._running, None
            for submission in running.batch if running is not None else ():
                submission.result = None
                submission.error = UncertainCommitError(
                    "the store stopped while this operation was being committed; it may or may not be stored"
                )
                self._finish(submission)
            # No more transactions: nothing to do upkeep between (nor to wait for one left running).
            for waiter in [*self._upkeep_waiting, *(running.upkeep or () if running is not None else ())]:
                waiter.set()
            self._upkeep_waiting = []
            left = [*self._urgent, *self._riders, *self._queue]
            self._urgent, self._riders, self._queue = [], [], deque()
            self._riders_due = math.inf
            for submission in left:
                submission.result = None
                submission.error = StoreError("the store closed before this operation ran; nothing of it was stored")
                self._finish(submission)
            self._committer_done.set()

    async def _wait_for_work(self) -> bool:
        """Park until something is submitted; False if it was, True if the riders waited out their time.

        While parked, a submission starts its transaction itself (see _enqueue).
        """
        self._queue_filled = Wakeup()
        self._parked = True
        try:
            if not self._riders:
                await self._queue_filled.wait()
                return False
            with anyio.move_on_after(self._riders_due - anyio.current_time()) as waited:
                await self._queue_filled.wait()
            return waited.cancelled_caught
        finally:
            self._parked = False

    def _riders_waiting_out(self) -> bool:
        """Whether riders are due: then the committer waits for the transaction in flight, and sends them next."""
        return bool(self._riders) and self._riders_due <= anyio.current_time()

    def _start_batch(self) -> None:
        """Take the next transaction's operations and start committing them in the thread (no waiting).

        Upkeep asked for meanwhile goes first; its return wakes the committer for the transaction.
        """
        if self._upkeep_waiting and not self._closing:
            self._start_upkeep()
            return
        batch = self._take_batch()
        extra = self._housekeeping()
        if extra is not None:
            batch.append(Submission(extra))
        running = self._running = _Running(batch)
        self._hand_to_thread(functools.partial(self._commit, batch), running)

    def _hand_to_thread(self, work: Callable[[], None], running: _Running) -> None:
        """Hand ``work`` (a transaction, or upkeep) to the commit thread; ``_batch_done`` hears of its return."""
        with self._thread_state:
            self._thread_busy = True
        # Abandoned only when closing gave up on an interrupted statement (see aclose).
        self._commit_thread.start(self._work_in_thread, (work,), functools.partial(self._batch_done, running))

    async def _upkeep_between_transactions(self) -> None:
        """Run the backend's upkeep (:meth:`_upkeep`) in the commit thread, between two transactions; wait for it.

        For work that must not run inside a transaction, nor beside the
        writes: SQLite's WAL checkpoint, which the writer starts the log over
        after only if no commit came in between (sqlite/checkpoints.py). It
        runs once the transaction in flight has answered its callers, and the
        next one waits for it. Not while closing: the store's close does it.
        """
        if self._closing:
            return
        done = anyio.Event()
        self._upkeep_waiting.append(done)
        if self._running is None:
            self._start_upkeep()
        await done.wait()

    def _start_upkeep(self) -> None:
        waiting, self._upkeep_waiting = self._upkeep_waiting, []
        running = self._running = _Running([], waiting)
        self._hand_to_thread(self._upkeep, running)

    def _batch_done(self, running: _Running, _: object, error: BaseException | None) -> None:
        """A transaction has returned (a callback on the event loop): answer its callers now.

        They are answered here, not a task switch later in the committer's
        task, which only moves on to the next transaction. A batch the
        committer stopped waiting for (closing gave up on it) was failed already.
        """
        if self._running is not running:
            return
        running.error = error
        try:
            if running.upkeep is not None:
                self._upkeep_done(running, error)
            elif error is None:
                self._answer_batch(running)
        finally:
            running.done.set()  # after the callers: their tasks run first
            if error is not None or self._queue or self._urgent or self._closing:
                # A committer parked during a transaction started by a submission (see _enqueue) has work now.
                self._queue_filled.set()
            if self._running is None and self._upkeep_waiting and not self._closing:
                self._start_upkeep()  # its callers are answered: the next transaction waits for the upkeep

    def _upkeep_done(self, running: _Running, error: BaseException | None) -> None:
        self._running = None
        running.error = None  # nothing to answer, nothing to abandon: the committer goes on
        if error is not None:
            # Not fatal (the SQLite WAL grows until a later checkpoint copies it): say so, and go on.
            log.warning("the store's upkeep between transactions failed: %r", error)
        for waiter in running.upkeep or ():
            waiter.set()

    def _answer_batch(self, running: _Running) -> None:
        """The transaction is over (committed, or failed and abandoned): answer each of its operations."""
        self._running = None
        try:
            self._committed()
        except Exception:  # (nothing may escape the commit callback, _batch_done: trio would end the run)
            log.exception("a store commit hook failed")
        for submission in running.batch:
            self._finish(submission)

    def _finish(self, submission: Submission) -> None:
        if submission.done is not None:
            try:
                submission.done(submission.result, submission.error)
            except Exception:
                log.exception("a store completion callback failed")
        if submission.finished is not None:
            submission.finished.set()

    def _work_in_thread(self, work: Callable[[], None]) -> None:
        try:
            work()
        finally:
            with self._thread_state:
                self._thread_busy = False
                left_behind = self._thread_left_behind
            if left_behind:  # closing gave up on this thread: the connection is its to close
                with contextlib.suppress(Exception):
                    self._conn.close()

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
            pending = len(self._queue) + len(self._urgent) + len(self._riders)
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
                    self._commit_thread.stop()
                    side.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                wait = self._closing_wait()
                async with anyio.create_task_group() as closing:
                    closing.start_soon(self._close_store_connections, wait, finished)
                    closing.start_soon(_in_thread, functools.partial(self._close_own_connections, wait))
                    if self._liveness is not None:
                        # Not in the liveness slot: an abandoned check may hold it until it returns (trio).
                        closing.start_soon(_in_thread, functools.partial(self._liveness.release, wait))

    async def _close_store_connections(self, wait: float, finished: bool) -> None:
        """Close the connections to the store's own database: the side work's, the reader, the writer.

        One after another, not side by side: SQLite's last connection to close
        removes the ``-wal`` and ``-shm`` files, and two closing at once may
        each find the other still open and leave both files behind (a
        read-only store then changes the directory it only looked at). Only
        the reader may wait (``wait`` seconds, for a read still running).
        """
        await _in_thread(self._close_side_work)
        if self._reader is not None:
            await _in_thread(functools.partial(self._close_reader, wait), self._reader_slot)
        if finished:
            await _in_thread(self._conn.close)

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

    # -- the two operations that run together (see transactions.py) ---------

    def submit_append(
        self,
        session_id: str,
        token: int,
        first_seq: int,
        episodes: Sequence[Episode],
        done: Completion[AppendResult],
        metadata_json: Sequence[str | None] | None = None,
    ) -> None:
        chars = len(episodes[0].content) if len(episodes) == 1 else sum([len(e.content) for e in episodes])
        if len(episodes) > TRANSACTION_ROWS or chars > TRANSACTION_CHARS:
            _AppendInParts(self, session_id, token, first_seq, episodes, done).start()  # (its rows encode their own)
            return
        submission = Submission(None, done, (session_id, token, first_seq, episodes), len(episodes), chars)
        if metadata_json is not None:
            assert len(metadata_json) == len(episodes), (len(metadata_json), len(episodes))
            submission.metadata_json = metadata_json
        self._enqueue(submission)

    def submit_eviction(self, session_id: str, token: int, through_seq: int, done: Completion[None]) -> None:
        operation = functools.partial(
            journal.record_eviction, session_id=session_id, token=token, through_seq=through_seq
        )
        submission = Submission(operation, done)
        submission.eviction = (session_id, token, through_seq)  # so that evictions run together (_eviction_run)
        # No commit of its own: with the next add, or anything else (a lost boundary is applied again, see
        # session/activation_state.py _keep_boundary). An fsync less per eviction at synchronous=FULL.
        self._ride_along(submission)


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
        store: Committer,
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

    def _part(self, index: int) -> Submission:
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
            ttl=self._store._longest_ttl,
        )
        return Submission(operation, self._part_stored, size=len(episodes), chars=sum(len(e.content) for e in episodes))

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
            self._store._enqueue(Submission(undo, functools.partial(self._undone, error)))
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
