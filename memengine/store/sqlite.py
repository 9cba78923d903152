"""The embedded SQLite store, with group commit.

Every operation is a small function run against the one connection. Operations
submitted while a transaction is being committed wait and then go, all of them,
into the next transaction: one thread hop and one commit serve every session
that wrote meanwhile, and each caller is answered once its own rows are
committed. sqlite3 blocks, so the transactions run in a worker thread, one at a
time (never two threads on the connection at once).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
import anyio.abc

from ..episode import Episode, stored_episode, with_seq
from ..errors import EngineClosedError, StoreError
from ..retain.batch import RetainMode
from . import sqlite_recall, sqlite_retain
from .base import AppendResult, Completion, OutboxEntry, OutboxState, Recalled, SessionRow, SessionSnapshot
from .schema import migrate

T = TypeVar("T")
Operation = Callable[[sqlite3.Connection], T]
log = logging.getLogger("memengine.store")

_EPISODE_COLUMNS = "seq, id, role, content, created_at, metadata"
RECALL_INDEX_EVERY = 2000


_Append = tuple[str, int, Sequence[Episode]]  # session_id, first_seq, episodes


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


class SQLiteStore:
    """The SQLite backend. Open it with :func:`open_sqlite_store`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._queue: list[_Submission] = []
        self._queue_committed = anyio.Event()  # set once the queued batch is committed
        self._queue_filled = anyio.Event()
        self._closing = False
        self._thread_slot = anyio.CapacityLimiter(1)
        self._unindexed = 0  # episodes appended since recall's index last caught up (this process)

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
            if self._unindexed >= RECALL_INDEX_EVERY:
                # Indexing rows in batches costs a tenth of indexing each commit's few rows.
                self._unindexed = 0
                indexing = functools.partial(sqlite_recall.index_pending, limit=RECALL_INDEX_EVERY * 2)
                batch.append(_Submission(indexing, True))
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
        if not self._transaction(batch, isolate=False):
            self._transaction(batch, isolate=True)

    def _transaction(self, batch: list[_Submission], *, isolate: bool) -> bool:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            for submission in batch:
                submission.error = StoreError(f"could not begin a transaction: {exc}")
            return True
        index = 0
        while index < len(batch):
            submission = batch[index]
            if not isolate and submission.append is not None:
                end = index + 1
                while end < len(batch) and batch[end].append is not None:
                    end += 1
                if not self._append_run(batch[index:end]):
                    conn.execute("ROLLBACK")
                    return False
                index = end
                continue
            index += 1
            if not isolate or not submission.writes:
                if not self._run_one(submission) and not isolate:
                    conn.execute("ROLLBACK")
                    return False
                continue
            conn.execute("SAVEPOINT operation")
            if self._run_one(submission):
                conn.execute("RELEASE operation")
            else:
                conn.execute("ROLLBACK TO operation")
                conn.execute("RELEASE operation")
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for submission in batch:
                submission.result = None
                submission.error = StoreError(f"commit failed, nothing was stored: {exc}")
        return True

    def _abandon(self, batch: list[_Submission], error: BaseException) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
        for submission in batch:
            submission.result = None
            submission.error = StoreError(f"nothing was stored: {error!r}")

    def _append_run(self, run: list[_Submission]) -> bool:
        """Store consecutive appends (of different sessions) with one statement.

        Seqs are numbered on the assumption that no id is already stored; if
        the row count shows otherwise, the run is undone and each append takes
        the row-by-row path, which skips stored ids.
        """
        conn = self._conn
        rows = []
        first_appends = []
        for submission in run:
            session_id, first_seq, episodes = submission.append  # type: ignore[misc]
            if first_seq == 1:
                first_appends.append((session_id,))
            rows.extend(_episode_row(session_id, seq, episode) for seq, episode in enumerate(episodes, first_seq))
        conn.execute("SAVEPOINT appends")
        try:
            if first_appends:
                conn.executemany(_INSERT_SESSION, first_appends)
            before = conn.total_changes
            conn.executemany(_INSERT_EPISODE, rows)
            all_new = conn.total_changes - before == len(rows)
        except sqlite3.Error:
            all_new = False
        if all_new:
            conn.execute("RELEASE appends")
            for submission in run:
                _, first_seq, episodes = submission.append  # type: ignore[misc]
                submission.result = tuple(
                    (with_seq(episode, seq), True) for seq, episode in enumerate(episodes, first_seq)
                )
                submission.error = None
            return True
        conn.execute("ROLLBACK TO appends")
        conn.execute("RELEASE appends")
        return all([self._run_one(submission) for submission in run])

    def _run_one(self, submission: _Submission) -> bool:
        submission.error = None
        try:
            submission.result = submission.operation(self._conn)
        except sqlite3.Error as exc:
            submission.error = StoreError(str(exc))
            return False
        except Exception as exc:
            submission.error = exc
            return False
        return True

    async def aclose(self) -> None:
        self._closing = True
        self._queue_filled.set()

    # -- operations ----------------------------------------------------------

    async def load_session(self, session_id: str) -> SessionSnapshot:
        return await self._submit(lambda conn: _load(conn, session_id), writes=False)

    def submit_append(
        self, session_id: str, first_seq: int, episodes: Sequence[Episode], done: Completion[AppendResult]
    ) -> None:
        self._unindexed += len(episodes)
        operation = functools.partial(_append, session_id=session_id, first_seq=first_seq, episodes=episodes)
        self._enqueue(_Submission(operation, True, done, (session_id, first_seq, episodes)))

    async def store_summary(self, session_id: str, generation: int, through_seq: int, summary: str) -> bool:
        now = datetime.now(UTC).isoformat()

        def write(conn: sqlite3.Connection) -> bool:
            cursor = conn.execute(
                "INSERT INTO summaries (session_id, through_seq, generation, summary, created_at) "
                "SELECT ?, ?, ?, ?, ? "
                "WHERE coalesce((SELECT generation FROM sessions WHERE session_id = ?), 0) = ? "
                "ON CONFLICT (session_id, through_seq) DO UPDATE SET "
                "generation = excluded.generation, summary = excluded.summary, created_at = excluded.created_at",
                (session_id, through_seq, generation, summary, now, session_id, generation),
            )
            return cursor.rowcount == 1

        return await self._submit(write)

    async def delete_episodes(self, session_id: str, seqs: Sequence[int]) -> tuple[int, SessionSnapshot]:
        wanted = json.dumps(sorted(set(seqs)))

        def delete(conn: sqlite3.Connection) -> tuple[int, SessionSnapshot]:
            existing = [
                seq
                for (seq,) in conn.execute(
                    "SELECT seq FROM episodes WHERE session_id = ? AND seq IN (SELECT value FROM json_each(?))",
                    (session_id, wanted),
                )
            ]
            if not existing:
                return 0, _load(conn, session_id)
            # Before deleting: the seq floor must include the rows about to go.
            _bump_generation(conn, session_id)
            conn.execute(
                "DELETE FROM episodes WHERE session_id = ? AND seq IN (SELECT value FROM json_each(?))",
                (session_id, wanted),
            )
            # A summary through k covers every live episode up to k.
            conn.execute("DELETE FROM summaries WHERE session_id = ? AND through_seq >= ?", (session_id, min(existing)))
            # Deleted means deleted: undelivered retain batches lose them too.
            sqlite_retain.revise_after_delete(conn, session_id, existing)
            return len(existing), _load(conn, session_id)

        return await self._submit(delete)

    async def clear_session(self, session_id: str) -> SessionSnapshot:
        def clear(conn: sqlite3.Connection) -> SessionSnapshot:
            _bump_generation(conn, session_id)
            conn.execute("DELETE FROM episodes WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM summaries WHERE session_id = ?", (session_id,))
            sqlite_retain.drop_session(conn, session_id)
            return _load(conn, session_id)

        return await self._submit(clear)

    async def sessions_needing_summary(self, max_episodes: int, max_chars: int) -> list[str]:
        def query(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute(
                "WITH latest AS ("
                "  SELECT s.session_id, coalesce("
                "    (SELECT max(through_seq) FROM summaries AS m WHERE m.session_id = s.session_id), 0) AS through"
                "  FROM sessions AS s) "
                "SELECT latest.session_id FROM latest "
                "JOIN episodes AS e ON e.session_id = latest.session_id AND e.seq > latest.through "
                "GROUP BY latest.session_id HAVING count(*) > ? OR sum(length(e.content)) > ?",
                (max_episodes, max_chars),
            )
            return [row[0] for row in rows]

        return await self._submit(query, writes=False)

    # -- retain outbox and recall ---------------------------------------------

    def submit_retain(
        self, session_id: str, mode: RetainMode, through_seq: int | None, limit: int | None, done: Completion[int]
    ) -> None:
        operation = functools.partial(
            sqlite_retain.enqueue, session_id=session_id, mode=mode, through_seq=through_seq, limit=limit
        )
        self._enqueue(_Submission(operation, True, done))

    async def enqueue_retain(self, session_id: str, mode: RetainMode) -> int:
        return await self._submit(lambda conn: sqlite_retain.enqueue(conn, session_id, mode))

    async def enqueue_all_retains(self, mode: RetainMode) -> list[str]:
        return await self._submit(lambda conn: sqlite_retain.enqueue_all(conn, mode))

    async def pending_retains(self, limit: int) -> list[OutboxEntry]:
        return await self._submit(lambda conn: sqlite_retain.pending(conn, limit, _episode_from_row), writes=False)

    async def retain_entry(self, entry_id: int, key: str) -> OutboxEntry | None:
        return await self._submit(
            lambda conn: sqlite_retain.entry(conn, entry_id, key, _episode_from_row), writes=False
        )

    async def mark_retained(self, entry_id: int, key: str) -> None:
        await self._submit(lambda conn: sqlite_retain.mark_delivered(conn, entry_id, key))

    async def mark_retain_failed(self, entry_id: int, key: str, error: str) -> None:
        await self._submit(lambda conn: sqlite_retain.mark_failed(conn, entry_id, key, error))

    async def outbox_state(self) -> OutboxState:
        return await self._submit(sqlite_retain.state, writes=False)

    async def recall(self, query: str, session_id: str | None, limit: int) -> list[Recalled]:
        return await self._submit(lambda conn: sqlite_recall.recall(conn, query, session_id, limit, _episode_from_row))

    async def list_sessions(self) -> list[SessionRow]:
        def query(conn: sqlite3.Connection) -> list[SessionRow]:
            rows = conn.execute(
                "SELECT s.session_id, s.generation, "
                "  (SELECT count(*) FROM episodes AS e WHERE e.session_id = s.session_id), "
                "  coalesce((SELECT max(through_seq) FROM summaries AS m WHERE m.session_id = s.session_id), 0), "
                "  max(s.seq_floor, coalesce("
                "    (SELECT max(seq) FROM episodes AS e WHERE e.session_id = s.session_id), 0)) "
                "FROM sessions AS s ORDER BY s.session_id"
            )
            return [SessionRow(*row) for row in rows]

        return await self._submit(query, writes=False)


def _episode_from_row(row: tuple[int, str, str, str, str, str]) -> Episode:
    seq, episode_id, role, content, created_at, metadata = row
    return stored_episode(role, content, episode_id, datetime.fromisoformat(created_at), json.loads(metadata), seq)


_INSERT_SESSION = "INSERT OR IGNORE INTO sessions (session_id) VALUES (?)"
_INSERT_EPISODE = (
    "INSERT OR IGNORE INTO episodes (session_id, seq, id, role, content, created_at, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)


def _episode_row(session_id: str, seq: int, episode: Episode) -> tuple[str, int, str, str, str, str, str]:
    metadata = json.dumps(episode.metadata, allow_nan=False, ensure_ascii=False) if episode.metadata else "{}"
    return (session_id, seq, episode.id, episode.role, episode.content, episode.created_at.isoformat(), metadata)


def _append(conn: sqlite3.Connection, session_id: str, first_seq: int, episodes: Sequence[Episode]) -> AppendResult:
    """Store episodes one by one, skipping (and returning) those whose id is already stored."""
    if first_seq == 1:
        # A session's row exists once it has stored anything (or was cleared).
        conn.execute(_INSERT_SESSION, (session_id,))
    results: list[tuple[Episode, bool]] = []
    seq = first_seq
    for episode in episodes:
        if conn.execute(_INSERT_EPISODE, _episode_row(session_id, seq, episode)).rowcount:
            results.append((with_seq(episode, seq), True))
            seq += 1
            continue
        existing = conn.execute(
            f"SELECT {_EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND id = ?", (session_id, episode.id)
        ).fetchone()
        if existing is None:
            # The id is new, so the seq itself was taken: the caller's idea of
            # the session is stale (only possible if another writer shares it).
            raise StoreError(f"seq {seq} of session {session_id!r} is already taken")
        results.append((_episode_from_row(existing), False))
    return tuple(results)


def _bump_generation(conn: sqlite3.Connection, session_id: str) -> None:
    conn.execute(
        "INSERT INTO sessions (session_id, generation, seq_floor) VALUES (?, 1, "
        "  coalesce((SELECT max(seq) FROM episodes WHERE session_id = ?), 0)) "
        "ON CONFLICT (session_id) DO UPDATE SET generation = generation + 1, "
        "  seq_floor = max(seq_floor, excluded.seq_floor)",
        (session_id, session_id),
    )


def _load(conn: sqlite3.Connection, session_id: str) -> SessionSnapshot:
    session = conn.execute(
        "SELECT generation, seq_floor, retained_through FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    generation, seq_floor, retained_through = session if session is not None else (0, 0, 0)
    latest = conn.execute(
        "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    summarized_through, summary = latest if latest is not None else (0, None)
    episodes = tuple(
        _episode_from_row(row)
        for row in conn.execute(
            f"SELECT {_EPISODE_COLUMNS} FROM episodes WHERE session_id = ? AND seq > ? ORDER BY seq",
            (session_id, summarized_through),
        )
    )
    (max_seq,) = conn.execute("SELECT max(seq) FROM episodes WHERE session_id = ?", (session_id,)).fetchone()
    return SessionSnapshot(
        session_id=session_id,
        generation=generation,
        last_seq=max(seq_floor, max_seq or 0),
        summary=summary,
        summarized_through=summarized_through,
        episodes=episodes,
        retained_through=retained_through,
    )


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    if path != ":memory:":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


@asynccontextmanager
async def open_sqlite_store(
    path: str | os.PathLike[str] = "memengine.db", *, synchronous: str = "NORMAL"
) -> AsyncIterator[SQLiteStore]:
    """Open (creating and migrating if needed) a SQLite store for the block's duration.

    ``synchronous`` is SQLite's ``PRAGMA synchronous`` in WAL mode: ``"NORMAL"``
    keeps every acknowledged write across a crash of the process (kill -9);
    ``"FULL"`` also across a power loss, at the cost of an fsync per commit.

    On exit, operations already submitted are committed and the file is closed.
    """
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    path = os.fspath(path)
    if not path:
        raise ValueError("the SQLite path must not be empty (use ':memory:' for a private in-memory store)")
    conn = await anyio.to_thread.run_sync(_connect, path)
    try:
        await anyio.to_thread.run_sync(conn.execute, f"PRAGMA synchronous = {synchronous}")
        await anyio.to_thread.run_sync(migrate, conn)
        store = SQLiteStore(conn)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(store._run_committer)
            try:
                yield store
            finally:
                await store.aclose()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(conn.close)
