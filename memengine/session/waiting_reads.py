"""Reads waiting until the episodes evicted before them are summarized.

A read whose caller gave up (a timeout, a disconnect) is dropped the moment it
does: abandoned waits leave nothing behind, however many there are.
"""

from __future__ import annotations

import functools

from .messages import ReadContext


class WaitingReads:
    __slots__ = ("_reads",)

    def __init__(self) -> None:
        self._reads: dict[ReadContext, int] = {}  # the read -> the seq it waits to see summarized

    def __bool__(self) -> bool:
        return bool(self._reads)

    def __len__(self) -> int:
        return len(self._reads)

    def add(self, read: ReadContext, through_seq: int) -> None:
        self._reads[read] = through_seq
        read.reply.on_abandon(functools.partial(self._reads.pop, read, None))

    def ready(self, first_pending: float) -> list[ReadContext]:
        """Remove and return the reads whose episodes are all summarized (none pending at or before them)."""
        done = [read for read, through_seq in self._reads.items() if first_pending > through_seq]
        for read in done:
            del self._reads[read]
        return done

    def take_all(self) -> list[ReadContext]:
        reads = list(self._reads)
        self._reads.clear()
        return reads
