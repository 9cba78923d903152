"""One batch of submissions in one transaction: all together, else one by one; runs of appends in one statement.

The committer (committer.py) hands a batch to :meth:`Transactions._commit` in
its worker thread. The batch runs in one transaction; if an operation fails,
the transaction is rolled back and run again with a savepoint around each
operation, so only the failing one is refused. Appends (and eviction
boundaries) of several sessions are stored with one statement (a run). A
transaction that deadlocked with another process's runs again, all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tenacity

from ..errors import StoreError, UncertainCommitError
from ..retrying import wait_jitter, with_retries_in_thread
from . import journal, leases
from .backend import BackendHooks
from .dialect import Db, Dialect
from .submission import Submission

log = logging.getLogger("memengine.store")

_TRANSIENT_ATTEMPTS = 8
#: New connections one batch may get when BEGIN finds its connection gone (nothing in flight then).
_RECONNECTS = 3
#: After the n-th deadlock in a row: 5 ms * n, plus up to 10 ms of jitter (drawn from the engine's own random source).
_DEADLOCK_WAIT = tenacity.wait_incrementing(start=0.005, increment=0.005) + wait_jitter(0, 0.01)


class _Deadlocked(Exception):
    """The transaction deadlocked with another process's and was rolled back: it runs again."""


class _Interrupted(Exception):
    """Closing interrupted the transaction (see ``_aborted``)."""


class Transactions(BackendHooks):
    """How the worker thread runs a batch; the committer (committer.py) queues and hands them over."""

    def __init__(self, conn: Any, dialect: Dialect, reader: Any | None = None) -> None:
        super().__init__(conn, dialect, reader)
        self._aborted = False  # read by the worker thread: stop starting transactions
        self._transient = False  # set (in the worker thread) when an operation met a deadlock
        self._reconnects = 0  # new connections the batch being committed got (at most _RECONNECTS)

    def _commit(self, batch: list[Submission]) -> None:
        """Run a batch of operations in one transaction (in the worker thread).

        First all together; if one of them fails, the transaction is rolled back
        and the batch runs again with a savepoint around each operation, so only
        the failing one is refused. A transaction another process's deadlocked
        with (PostgreSQL aborted ours) is run again, all of it, after a short
        jittered pause (retrying.py, on tenacity).
        """
        self._reconnects = 0
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

    def _commit_once(self, batch: list[Submission]) -> None:
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

    def _transaction(self, batch: list[Submission], *, isolate: bool) -> bool:
        errors = self._dialect.errors
        db = Db(self._conn, self._dialect)
        try:
            self._begin(db)
        except errors as exc:
            self._rollback(db)
            if self._connection_lost() and self._reconnects < _RECONNECTS:
                # Dropped while idle, or during the attempt before (which the server then rolled
                # back): nothing is in flight, so the transaction is simply begun on a new connection.
                # More than once: the fault that dropped one connection (a failover, an operator
                # ending a replica's sessions) may drop the next as it is made.
                self._reconnects += 1
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
            # One lease query for both runs: the appends' covers the boundaries' sessions too (most often
            # the same ones: a boundary rides along with the next add); if it says no, each run checks its own.
            boundaries = [(session_id, token) for session_id, token, _ in (s.eviction for s in evictions)]  # type: ignore[misc]
            checked: bool | None = False
            if appends:
                checked = self._append_run(db, appends, boundaries)
                if checked is None:
                    self._rollback(db)
                    return False
            if evictions and not self._eviction_run(db, evictions, checked is True):
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

    def _abandon(self, batch: list[Submission], error: BaseException) -> None:
        self._rollback(Db(self._conn, self._dialect))
        for submission in batch:
            submission.result = None
            submission.error = StoreError(f"nothing was stored: {error!r}")

    def _append_run(self, db: Db, run: list[Submission], also: list[tuple[str, int]]) -> bool | None:
        """Store consecutive appends (of different sessions) with one statement.

        One query checks every lease, and those of ``also`` (the eviction
        boundaries of the same transaction); seqs are numbered on the
        assumption that no id is already stored. If a lease is stale, each
        append takes the row-by-row path, which checks its own lease and skips
        stored ids; if the row count shows a stored id, the transaction is run
        again with each operation on its own (see _run_together). Whether the
        one query found every lease held (``also``'s too); ``None`` if the run failed.
        """
        rows: list[Any] = []
        first_appends = []
        held = []
        for submission in run:
            session_id, token, first_seq, episodes = submission.append  # type: ignore[misc]
            held.append((session_id, token))
            if first_seq == 1:
                first_appends.append(session_id)
            encoded = submission.metadata_json
            if encoded is None:
                rows += [journal.episode_row(session_id, s, episode) for s, episode in enumerate(episodes, first_seq)]
            else:
                rows += [
                    journal.episode_row(session_id, first_seq + n, episode, metadata)
                    for n, (episode, metadata) in enumerate(zip(episodes, encoded, strict=True))
                ]
        checked = [False]

        def check() -> bool:
            checked[0] = leases.all_held(db, held + also if also else held)
            return checked[0]

        if not self._run_together(
            db,
            run,
            check,
            lambda: self._insert_new_episodes(db, first_appends, rows),
            lambda submission: journal.appended(submission.append[2], submission.append[3]),  # type: ignore[index]
        ):
            return None
        return checked[0]

    def _eviction_run(self, db: Db, run: list[Submission], checked: bool = False) -> bool:
        """Store the eviction boundaries of several sessions with one lease query and one statement.

        The query is left out when the same transaction checked these leases
        already (``checked``, see _append_run). If a lease is stale, each
        boundary takes its own path (journal.record_eviction), which refuses
        only the stale one.
        """
        evictions: list[tuple[str, int, int]] = [submission.eviction for submission in run]  # type: ignore[misc]

        def write() -> bool:
            journal.record_evictions(db, evictions)
            return True

        return self._run_together(
            db,
            run,
            (lambda: True) if checked else lambda: leases.all_held(db, [(s, token) for s, token, _ in evictions]),
            write,
            lambda submission: None,
        )

    def _run_together(
        self,
        db: Db,
        run: list[Submission],
        check: Callable[[], bool],
        write: Callable[[], bool],
        result: Callable[[Submission], Any],
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

    def _run_one(self, db: Db, submission: Submission) -> bool:
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
