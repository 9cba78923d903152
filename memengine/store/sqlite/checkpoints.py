"""WAL checkpoints between the commits, never inside one of them, nor beside them.

In WAL mode, SQLite copies the log back into the database file (a
checkpoint, with an fsync of the file) by default in the commit that takes
the log past 1,000 pages: every few hundred adds, one commit, and every add
waiting on it, took several milliseconds more. Measured with
``benchmarks/add_under_slow_summary.py -n 8 -m 1 --readers 2 -l 2``: those
commits were the add latency's p99 (6.5-7 ms against 2.3-2.8 ms without).

So the writer connection does not checkpoint inside a commit
(``wal_autocheckpoint = 0``); a fifth of a second after the first commit
since the last checkpoint, the store's commit thread runs one between two
transactions: once the transaction in flight has answered its callers, and
before the next begins (``Committer._upkeep_between_transactions``).
``PASSIVE`` waits for no reader: it copies what no reader still needs, and
the next transaction starts the log over once all of it was copied.

Not on a connection of its own, beside the commits: SQLite starts the log
over only if nothing was committed after the checkpoint began, so under
writes that never paused (one add right after another) the log was never
started over; it grew by every commit's pages for as long as they went on,
and at ``synchronous=FULL`` every commit's fsync then also grew the file,
which made it cost about twice as much. Other processes on the same file
checkpoint as they are configured; the last connection to close checkpoints
whatever is left (SQLite does that on its own).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

log = logging.getLogger("memengine.store")

#: Seconds between a commit and the checkpoint that follows it.
CHECKPOINT_DELAY = 0.2

#: What the checkpoint is (run on the write connection, between two transactions).
CHECKPOINT = "PRAGMA wal_checkpoint(PASSIVE)"


class Checkpointer:
    """Asks for a checkpoint of one SQLite file's WAL when commits happened, a moment after the first."""

    def __init__(self, checkpoint: Callable[[], Awaitable[None]]) -> None:
        self._checkpoint = checkpoint  # runs it between two transactions, and returns once it ran
        self._dirty = anyio.Event()

    def committed(self) -> None:
        """A commit happened (called on the event loop): a checkpoint follows soon."""
        self._dirty.set()

    async def run(self) -> None:
        """Checkpoint after commits, for as long as the store serves (until cancelled)."""
        while True:
            await self._dirty.wait()
            await anyio.sleep(CHECKPOINT_DELAY)
            self._dirty = anyio.Event()  # commits from now on call for the next one
            await self._checkpoint()  # (a failure is logged by the committer; the log grows until the next)
