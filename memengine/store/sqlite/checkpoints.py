"""WAL checkpoints beside the committer, never inside one of its commits.

In WAL mode, SQLite copies the log back into the database file (a
checkpoint, with an fsync of the file) by default in the commit that takes
the log past 1,000 pages: every few hundred adds, one commit, and every add
waiting on it, took several milliseconds more. Measured with
``benchmarks/add_under_slow_summary.py -n 8 -m 1 --readers 2 -l 2``: those
commits were the add latency's p99 (6.5-7 ms against 2.3-2.8 ms without).

So the writer connection does not checkpoint (``wal_autocheckpoint = 0``);
a connection of its own does, in a thread, a fifth of a second after the
first commit since its last checkpoint. ``PASSIVE`` never waits for readers
or writers: it copies what no reader still needs, and the writer starts the
log over once all of it was copied. Other processes on the same file
checkpoint as they are configured; the last connection to close checkpoints
whatever is left (SQLite does that on its own).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3

import anyio

log = logging.getLogger("memengine.store")

#: Seconds between a commit and the checkpoint that follows it.
CHECKPOINT_DELAY = 0.2


class Checkpointer:
    """Checkpoints one SQLite file's WAL, on a connection of its own, when commits happened."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._dirty = anyio.Event()
        self._slot = anyio.CapacityLimiter(1)

    def open(self) -> None:
        """Open the connection (in a thread, before the store serves)."""
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 100")
        self._conn = conn

    def committed(self) -> None:
        """A commit happened (called on the event loop): a checkpoint follows soon."""
        self._dirty.set()

    async def run(self) -> None:
        """Checkpoint after commits, for as long as the store serves (until cancelled)."""
        while True:
            await self._dirty.wait()
            await anyio.sleep(CHECKPOINT_DELAY)
            self._dirty = anyio.Event()  # commits from now on call for the next one
            try:
                await anyio.to_thread.run_sync(self._checkpoint, limiter=self._slot)
            except Exception as exc:
                # Not fatal: the log grows until a later checkpoint (or the last close) copies it.
                log.warning("a WAL checkpoint failed (%s); tried again after the next commit", exc)

    def _checkpoint(self) -> None:
        assert self._conn is not None
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
