"""The embedded SQLite store (the default): one file, WAL mode, group commit.

The operations and the committer are shared with PostgreSQL (operations.py, committer.py,
journal.py, outbox.py, leases.py); this module opens the store (connecting
through connection.py), inserts a run of appends with one ``executemany``, and
searches with FTS5 (recall.py).
Several processes on one machine may share the file: each write transaction
takes SQLite's write lock (``BEGIN IMMEDIATE``, waiting up to the busy
timeout), and session leases keep each session to one process.
"""

from __future__ import annotations

import functools
import math
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ...episode import Episode
from ...errors import StoreError
from ...scope import Scope
from .. import journal
from ..base import AppendResult, Completion, Recalled
from ..committer import log
from ..dialect import Db, sqlite_dialect
from ..liveness import FileLiveness
from ..open_errors import driver_error, sqlite_open_failed
from ..operations import GroupCommitStore
from ..submission import Operation
from . import readonly, recall
from .checkpoints import CHECKPOINT, Checkpointer
from .connection import BUSY_TIMEOUT, connect, is_busy
from .schema import migrate

#: Episodes stored before recall's index catches up with them, in the commit after.
#: FTS5 writes a new segment per transaction and merges segments as they pile up, so
#: a larger step costs less per row (``benchmarks/sqlite_write_costs.py``, 20,000
#: 200-character rows: 3.2 us per row in steps of 2,000, 2.1 us in steps of 5,000), but
#: that one transaction takes longer (about 10 ms for 5,000 rows; the adds of that
#: commit wait for it).
RECALL_INDEX_EVERY = 5000
RECALL_CATCH_UP_STEP = RECALL_INDEX_EVERY  # rows indexed in one transaction, at most


#: Milliseconds SQLite itself waits for a lock per attempt; between attempts the store checks whether it is closing.
_BUSY_SLICE_MS = 100


class SQLiteStore(GroupCommitStore):
    """The SQLite backend. Open it with :func:`open_sqlite_store`."""

    def __init__(
        self, conn: sqlite3.Connection, owner: str | None = None, reader: sqlite3.Connection | None = None
    ) -> None:
        super().__init__(conn, sqlite_dialect(), owner, reader)
        self._path: str | None = None  # the file, for the liveness lock beside it
        self._checkpointer: Checkpointer | None = None  # for a file (not ":memory:")
        self._unindexed = 0  # about how many episodes wait for recall's index (as this process saw them)
        self._busy_timeout = BUSY_TIMEOUT

    async def _side_work(self) -> None:
        if self._checkpointer is not None:
            await self._checkpointer.run()

    def _close_side_work(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()

    def _committed(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.committed()

    def _new_liveness(self) -> FileLiveness | None:
        return None if self._path is None else FileLiveness.beside(self._path)

    def _begin(self, db: Db) -> None:
        # Take the write lock now, waiting for another process's transaction in
        # short slices, so that a store being closed stops waiting at once.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or self._aborted or time.monotonic() >= deadline:
                    raise

    def _begin_read(self, db: Db) -> None:
        db.execute("BEGIN")  # deferred: a snapshot, no lock that writers wait for (WAL)

    def _in_transaction(self) -> bool:
        return bool(self._conn.in_transaction)

    def _upkeep(self) -> None:
        self._conn.execute(CHECKPOINT).fetchall()  # between two transactions (sqlite/checkpoints.py)

    def _interrupt(self) -> None:
        self._conn.interrupt()  # safe from any thread: the running statement fails with "interrupted"

    def _interrupt_reads(self) -> None:
        if self._reader is not None:
            self._reader.interrupt()

    def _interrupted(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.OperationalError) and "interrupted" in str(error)

    def _insert_new_episodes(self, db: Db, sessions: list[str], rows: list[tuple]) -> bool:
        if sessions:
            db.executemany(journal.INSERT_SESSION, [(session_id,) for session_id in sessions])
        before = self._conn.total_changes
        db.executemany(journal.INSERT_EPISODE, rows)
        return bool(self._conn.total_changes - before == len(rows))

    def _housekeeping(self) -> Operation[Any] | None:
        if self._unindexed < RECALL_INDEX_EVERY:
            return None
        # Indexing rows in batches costs a tenth of indexing each commit's few rows. A larger
        # backlog is worked off a step per commit (and in full by the next recall).
        self._unindexed = max(0, self._unindexed - RECALL_CATCH_UP_STEP)
        return functools.partial(recall.catch_up, limit=RECALL_CATCH_UP_STEP)

    async def _catch_up_recall_index(self) -> None:
        # One bounded step per transaction, so that writers go in between. The first step
        # says how many rows wait; rows stored after it need not wait for this recall.
        step = functools.partial(recall.catch_up, limit=RECALL_CATCH_UP_STEP)
        waiting = await self._submit(step)
        for _ in range(math.ceil(waiting / RECALL_CATCH_UP_STEP)):
            waiting = await self._submit(step)
        self._unindexed = waiting

    def _search(self, db: Db, query: str, scope: Scope, limit: int) -> list[Recalled]:
        return recall.search(db, query, scope, limit, journal.episode_from_row)

    def _rebuild_recall_index(self, db: Db) -> int:
        # The old index's pages are overwritten as they are freed: the words of erased episodes
        # (Engine.forget), which FTS5 keeps in its segments until it merges them, are gone with them.
        db.execute("PRAGMA secure_delete = ON")
        try:
            return recall.rebuild(db)
        finally:
            db.execute("PRAGMA secure_delete = OFF")

    async def _rebuild_damaged_recall_index(self) -> None:
        """Rebuild a recall index found damaged at open (by an older memengine, say) before a delete meets it."""
        try:
            if await self._submit(recall.rebuild_if_damaged):
                log.warning("the recall index was damaged; rebuilt it from the journal")
        except StoreError as exc:
            # Adds and reads do not need the index, and recall will try again.
            log.warning("the recall index is damaged and could not be rebuilt: %s", exc)

    def submit_append(
        self,
        session_id: str,
        token: int,
        first_seq: int,
        episodes: Sequence[Episode],
        done: Completion[AppendResult],
        metadata_json: Sequence[str | None] | None = None,
    ) -> None:
        self._unindexed += len(episodes)
        super().submit_append(session_id, token, first_seq, episodes, done, metadata_json)


@asynccontextmanager
async def open_sqlite_store(
    path: str | os.PathLike[str] = "memengine.db",
    *,
    synchronous: str = "NORMAL",
    owner: str | None = None,
    read_only: bool = False,
    busy_timeout: float = BUSY_TIMEOUT,
) -> AsyncIterator[SQLiteStore]:
    """Open (creating and migrating if needed) a SQLite store for the block's duration.

    ``synchronous`` is SQLite's ``PRAGMA synchronous`` in WAL mode: ``"NORMAL"``
    keeps every acknowledged write across a crash of the process (kill -9);
    ``"FULL"`` also across a power loss, at the cost of an fsync per commit.

    ``busy_timeout`` is how many seconds a write waits for the write lock
    another process holds (a long transaction, a backup) before it fails
    with :class:`StoreError`, nothing of it stored.

    ``read_only`` opens an existing store for reading only (see
    readonly.py): no file is created, no table added, nothing written.

    A file that cannot be opened (a missing directory, a directory, a file
    that is not a SQLite database) raises :class:`StoreError` naming it.
    On exit, operations already submitted are committed and the file is closed.
    """
    if synchronous not in ("NORMAL", "FULL"):
        raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', not {synchronous!r}")
    if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
        raise TypeError(f"busy_timeout must be a number of seconds, not {type(busy_timeout).__name__}")
    if not 0 <= busy_timeout < math.inf:
        raise ValueError(f"busy_timeout must be >= 0 seconds, not {busy_timeout!r}")
    path = os.fspath(path)
    if not path:
        raise ValueError("the SQLite path must not be empty (use ':memory:' for a private in-memory store)")
    if read_only:
        async with open_sqlite_reader(path, owner=owner) as store:
            yield store
        return
    try:
        conn = await anyio.to_thread.run_sync(connect, path, busy_timeout)
    except sqlite3.Error as exc:
        raise sqlite_open_failed(path, exc) from exc

    def prepare() -> None:
        try:
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            migrate(conn)
            # From now on the store waits for locks in slices (see SQLiteStore._begin).
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_SLICE_MS}")
            if path != ":memory:":  # a second connection to ":memory:" would be another, empty database
                reader = connect(path, busy_timeout)
                reader.execute("PRAGMA query_only = ON")
                store._reader = reader
                # Checkpoints run beside and between the commits, not in them (sqlite/checkpoints.py).
                checkpointer = Checkpointer(path, store._upkeep_between_transactions)
                checkpointer.open()
                store._checkpointer = checkpointer
                conn.execute("PRAGMA wal_autocheckpoint = 0")
        except (sqlite3.Error, StoreError) as exc:
            raise sqlite_open_failed(path, exc) from driver_error(exc)

    store = SQLiteStore(conn, owner)
    store._busy_timeout = busy_timeout
    # Resolved now: the liveness lock beside it must not move with the working directory (store/liveness.py).
    store._path = (
        path
        if path == ":memory:" or path.startswith("file:")
        else await anyio.to_thread.run_sync(os.path.realpath, path)
    )
    store.location = path

    async with store.serving(prepare):
        await store._rebuild_damaged_recall_index()
        yield store


@asynccontextmanager
async def open_sqlite_reader(path: str, *, owner: str | None = None) -> AsyncIterator[SQLiteStore]:
    """An existing SQLite store opened read-only: reads work, any write fails; nothing is created or changed."""
    if path == ":memory:":
        raise StoreError("a new ':memory:' store has no memengine tables to read")
    try:
        conn = await anyio.to_thread.run_sync(readonly.connect, path)
    except sqlite3.Error as exc:
        raise sqlite_open_failed(path, exc) from exc
    try:
        reader = await anyio.to_thread.run_sync(readonly.connect, path)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise sqlite_open_failed(path, exc) from exc
        raise
    store = SQLiteStore(conn, owner, reader=reader)
    store.location = path

    async with store.serving(lambda: None):
        yield store
