"""WAL checkpoints beside the commits and then, briefly, between two of them; never inside one.

In WAL mode, SQLite copies the log back into the database file (a
checkpoint, with an fsync of the file) by default in the commit that takes
the log past 1,000 pages: every few hundred adds, one commit, and every add
waiting on it, took several milliseconds more. Measured with
``benchmarks/add_under_slow_summary.py -n 8 -m 1 --readers 2 -l 2``: those
commits were the add latency's p99 (6.5-7 ms against 2.3-2.8 ms without).

So the writer connection does not checkpoint (``wal_autocheckpoint = 0``).
A fifth of a second after the first commit since the last checkpoint, a
connection of its own copies the log back, in a thread, beside the commits
(``PASSIVE`` waits for no reader or writer: it copies what no reader still
needs). That is most of the work (5-8 ms at ``synchronous=NORMAL``, where it
also syncs the log and the file). But SQLite starts the log over only when
a write transaction begins with all of the log copied back, and under
writes that never pause a commit always came in meanwhile: the log was never
started over, and grew by every commit's pages for as long as the writes
went on (at ``synchronous=FULL`` each commit's fsync then also grew the
file). So when the first copied all of the log it found, a second
``PASSIVE`` checkpoint follows, in the store's commit thread, between two
transactions (``Committer._upkeep_between_transactions``): it copies only
the few pages committed during the first, and the next transaction starts
the log over.

That takes a moment with no reader on the file still reading from the log
as it was before the checkpoint, and no other process's commit in between.
Reads that never pause (a recall right after another) or another process
writing to the same file without pause can still keep the log from being
started over, as before; it then grows until they pause. Other processes on
the same file checkpoint as they are configured; the last connection to
close checkpoints whatever is left (SQLite does that on its own).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable

import anyio

log = logging.getLogger("memengine.store")

#: Seconds between a commit and the checkpoint that follows it.
CHECKPOINT_DELAY = 0.2

#: The checkpoint, both beside the commits and between two of them.
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"


class Checkpointer:
    """Checkpoints one SQLite file's WAL when commits happened, a moment after the first."""

    def __init__(self, path: str, between_commits: Callable[[], Awaitable[None]]) -> None:
        self._path = path
        self._between_commits = between_commits  # the checkpoint again, between two transactions; returns once run
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
                copied_all = await anyio.to_thread.run_sync(self._checkpoint, limiter=self._slot)
            except Exception as exc:
                # Not fatal: the log grows until a later checkpoint (or the last close) copies it.
                log.warning("a WAL checkpoint failed (%s); tried again after the next commit", exc)
                continue
            if copied_all:
                # Only then: with a reader holding back most of the log, the commits would wait for
                # the whole of it to be copied once the reader lets go, not for the few pages since.
                await self._between_commits()  # (a failure there is logged by the committer)

    def _checkpoint(self) -> bool:
        """Checkpoint on this connection; whether it copied all of the log it found (no reader held it back)."""
        assert self._conn is not None
        busy, pages, copied = self._conn.execute(CHECKPOINT).fetchone()
        return not busy and pages == copied

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
