"""Group commit, and every store operation, for both backends.

Every operation is a small function run against one connection. Operations
submitted while a transaction is being committed wait and then go, all of them,
into the next transaction: one thread hop and one commit serve every session
that wrote meanwhile, and each caller is answered once its own rows are
committed. Both drivers block, so the transactions run in a worker thread, one
at a time (never two threads on the connection at once).

The backends (sqlite.py, postgres.py) differ only in how they connect, begin a
transaction, insert a run of appends with one statement, and search.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio

from ..episode import Episode
from ..errors import EngineClosedError, SessionBusyError, StoreError, UncertainCommitError
from ..retain.batch import RetainMode
from . import journal, leases, outbox
from .base import AppendResult, Completion, DueRetains, OutboxEntry, OutboxState, Recalled, SessionRow, SessionSnapshot
from .dialect import Db, Dialect

T = TypeVar("T")
Operation = Callable[[Db], T]
log = logging.getLogger("memengine.store")

_Append = tuple[str, int, int, Sequence[Episode]]  # session_id, token, first_seq, episodes
_TRANSIENT_ATTEMPTS = 8


def new_owner_id() -> str:
    """This process's name in lease rows: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class _Submission:
    """One operation waiting for its transaction."""

    __slots__ = ("append", "done", "error", "operation", "result", "writes")

    def __init__(
        self,
        operation: Operation[Any],
        writes: bool,
        done: Completion[Any] | None = None,
        append: _Append | None = None,
    ) -> None:
        self.operation = operation
        self.writes = writes
        self.done = done
        self.append = append  # set for appends, which can also run together (see _append_run)
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommitStore:
    """A store over one blocking DB-API connection; see :class:`~memengine.store.base.Store`.

    ``owner`` names this process in lease rows (one store per engine).
    """

    _begin = "BEGIN"

    def __init__(self, conn: Any, dialect: Dialect, owner: str | None = None) -> None:
        self._conn = conn
        self._dialect = dialect
        self.owner = owner or new_owner_id()
        self._queue: list[_Submission] = []
        self._queue_committed = anyio.Event()  # set once the queued batch is committed
        self._queue_filled = anyio.Event()
        self._closing = False
        self._thread_slot = anyio.CapacityLimiter(1)
        self._transient = False  # set (in the worker thread) when an operation met a deadlock

    # -- backend hooks -------------------------------------------------------

    def _insert_new_episodes(self, db: Db, sessions: list[str], rows: list[tuple]) -> bool:
        """Insert the rows with one statement; True if every row was new (else the caller undoes it)."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _housekeeping(self) -> Operation[Any] | None:
        """An extra operation to ride along with the next transaction, if one is due."""
        return None

    def _search(self, db: Db, query: str, session_id: str | None, limit: int) -> list[Recalled]:
        raise NotImplementedError

    # -- the committer -------------------------------------------------------

    def _enqueue(self, submission: _Submission) -> anyio.Event:
        """Queue an operation for the next transaction; the event is set once it committed."""
        if self._closing:
            raise EngineClosedError("the store is closed")
        self._queue.append(submission)
        self._queue_filled.set()
        return self._queue_committed

    async def _submit(self, operation: Operation[T], *, writes: bool = True) -> T:
        submission = _Submission(operation, writes)
        await self._enqueue(submission).wait()
        if submission.error is not None:
            raise submission.error
        return submission.result  # type: ignore[no-any-return]

    async def _run_committer(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._queue_filled = anyio.Event()
                await self._queue_filled.wait()
                continue
            batch, self._queue = self._queue, []
            extra = self._housekeeping()
            if extra is not None:
                batch.append(_Submission(extra, True))
            committed, self._queue_committed = self._queue_committed, anyio.Event()
            # Shielded: a transaction that started is finished and its callers answered.
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(self._commit, batch, limiter=self._thread_slot)
                except Exception as exc:
                    # A bug or an unexpected error: fail this batch, keep the committer (and engine) alive.
                    log.exception("a store transaction failed unexpectedly")
                    await anyio.to_thread.run_sync(self._abandon, batch, exc, limiter=self._thread_slot)
            for submission in batch:
                if submission.done is not None:
                    try:
                        submission.done(submission.result, submission.error)
                    except Exception:
                        log.exception("a store completion callback failed")
            committed.set()

    def _commit(self, batch: list[_Submission]) -> None:
        """Run a batch of operations in one transaction (in the worker thread).

        First all together; if one of them fails, the transaction is rolled back
        and the batch runs again with a savepoint around each operation, so only
        the failing one is refused.
        """
        db = Db(self._conn, self._dialect)
        for attempt in range(_TRANSIENT_ATTEMPTS):
            self._transient = False
            if self._transaction(db, batch, isolate=False) or (
                not self._transient and self._transaction(db, batch, isolate=True)
            ):
                return
            if not self._transient:
                return
            # Another process's transaction deadlocked with this one (PostgreSQL aborted ours): all again.
            log.info("a store transaction met a deadlock; retrying (attempt %d)", attempt + 2)
            time.sleep(0.005 * (attempt + 1) + random.random() * 0.01)
        for submission in batch:
            submission.result = None
            submission.error = StoreError("nothing was stored: the transaction kept deadlocking with other processes")

    def _transaction(self, db: Db, batch: list[_Submission], *, isolate: bool) -> bool:
        errors = self._dialect.errors
        try:
            db.execute(self._begin)
        except errors as exc:
            self._rollback(db)
            for submission in batch:
                submission.result = None
                submission.error = StoreError(f"could not begin a transaction: {exc}")
            return True
        index = 0
        while index < len(batch):
            if self._transient:
                self._rollback(db)
                return False
            submission = batch[index]
            if not isolate and submission.append is not None:
                end = index + 1
                while end < len(batch) and batch[end].append is not None:
                    end += 1
                if not self._append_run(db, batch[index:end]):
                    self._rollback(db)
                    return False
                index = end
                continue
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
        no id is already stored. If a lease is stale or the row count shows a
        stored id, the run is undone and each append takes the row-by-row
        path, which checks its own lease and skips stored ids.
        """
        rows = []
        first_appends = []
        held = []
        for submission in run:
            session_id, token, first_seq, episodes = submission.append  # type: ignore[misc]
            held.append((session_id, token))
            if first_seq == 1:
                first_appends.append(session_id)
            rows.extend(
                journal.episode_row(session_id, seq, episode) for seq, episode in enumerate(episodes, first_seq)
            )
        db.execute("SAVEPOINT appends")
        try:
            all_new = leases.all_held(db, held) and self._insert_new_episodes(db, first_appends, rows)
        except self._dialect.errors:
            all_new = False
        if all_new:
            db.execute("RELEASE appends")
            for submission in run:
                _, _, first_seq, episodes = submission.append  # type: ignore[misc]
                submission.result = journal.appended(first_seq, episodes)
                submission.error = None
            return True
        db.execute("ROLLBACK TO appends")
        db.execute("RELEASE appends")
        return all([self._run_one(db, submission) for submission in run])

    def _run_one(self, db: Db, submission: _Submission) -> bool:
        # Nothing of an earlier, rolled-back attempt may survive (a result would say "stored").
        submission.result = None
        submission.error = None
        try:
            submission.result = submission.operation(db)
        except self._dialect.transient as exc:
            submission.error = StoreError(str(exc))
            self._transient = True
            return False
        except self._dialect.errors as exc:
            submission.error = StoreError(str(exc))
            return False
        except Exception as exc:
            submission.error = exc
            return False
        return True

    async def aclose(self) -> None:
        self._closing = True
        self._queue_filled.set()

    @asynccontextmanager
    async def serving(self, prepare: Callable[[], object]) -> AsyncIterator[None]:
        """Prepare the connection (in a thread), then run the committer for the block's duration.

        On exit, operations already submitted are committed; the connection
        is closed whatever happened, even if ``prepare`` failed.
        """
        try:
            await anyio.to_thread.run_sync(prepare)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._run_committer)
                try:
                    yield
                finally:
                    await self.aclose()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._conn.close)

    # -- sessions --------------------------------------------------------------

    async def activate(self, session_id: str, ttl: float) -> tuple[int, SessionSnapshot]:
        activated = await self._submit(lambda db: journal.activate(db, session_id, self.owner, ttl))
        if isinstance(activated, SessionBusyError):
            raise activated
        return activated

    async def renew_leases(self, held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        return await self._submit(lambda db: leases.renew(db, self.owner, held, ttl))

    async def release_lease(self, session_id: str, token: int) -> None:
        await self._submit(lambda db: leases.release(db, session_id, token))

    async def release_leases(self) -> None:
        await self._submit(lambda db: leases.release_all(db, self.owner))

    async def load_session(self, session_id: str) -> SessionSnapshot:
        return await self._submit(lambda db: journal.load(db, session_id), writes=False)

    def submit_append(
        self, session_id: str, token: int, first_seq: int, episodes: Sequence[Episode], done: Completion[AppendResult]
    ) -> None:
        operation = functools.partial(
            journal.append, session_id=session_id, token=token, first_seq=first_seq, episodes=episodes
        )
        self._enqueue(_Submission(operation, True, done, (session_id, token, first_seq, episodes)))

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
        return await self._submit(
            lambda db: journal.sessions_needing_summary(db, self.owner, max_episodes, max_chars, orphaned_only),
            writes=False,
        )

    async def list_sessions(self) -> list[SessionRow]:
        return await self._submit(journal.list_sessions, writes=False)

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
        self._enqueue(_Submission(operation, True, done))

    async def enqueue_retain(self, session_id: str, token: int, mode: RetainMode) -> int:
        return await self._submit(lambda db: outbox.enqueue(db, session_id, token, mode))

    async def enqueue_all_retains(self, mode: RetainMode, *, orphaned_only: bool = False) -> list[str]:
        return await self._submit(lambda db: outbox.enqueue_all(db, self.owner, mode, orphaned_only))

    async def pending_retains(self, limit: int) -> list[OutboxEntry]:
        return await self._submit(lambda db: outbox.pending(db, limit, journal.episode_from_row), writes=False)

    async def due_retains(self, limit: int, *, ignore_backoff: bool = False) -> DueRetains:
        return await self._submit(lambda db: outbox.due(db, self.owner, limit, ignore_backoff), writes=False)

    async def claim_retain(self, entry_id: int, key: str, ttl: float) -> OutboxEntry | outbox.Unclaimable:
        return await self._submit(lambda db: outbox.claim(db, entry_id, key, self.owner, ttl, journal.episode_from_row))

    async def extend_retain_claim(self, entry_id: int, key: str, ttl: float) -> bool:
        return await self._submit(lambda db: outbox.extend_claim(db, entry_id, key, self.owner, ttl))

    async def mark_retained(self, entry_id: int, key: str) -> None:
        await self._submit(lambda db: outbox.mark_delivered(db, entry_id, key))

    async def mark_retain_failed(self, entry_id: int, key: str, error: str, retry_in: float = 0.0) -> None:
        await self._submit(lambda db: outbox.mark_failed(db, entry_id, key, self.owner, error, retry_in))

    async def outbox_state(self) -> OutboxState:
        return await self._submit(outbox.state, writes=False)

    async def recall(self, query: str, session_id: str | None, limit: int) -> list[Recalled]:
        return await self._submit(lambda db: self._search(db, query, session_id, limit))
