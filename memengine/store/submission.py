"""What the group commit queues: a submitted operation, and a read waiting for the read connection.

Shared by the committer (committer.py), the transactions it runs
(transactions.py) and the operations that submit them (operations.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..actor.wakeup import Wakeup
from ..episode import Episode
from .base import Completion
from .dialect import Db

T = TypeVar("T")
Operation = Callable[[Db], T]
Append = tuple[str, int, int, Sequence[Episode]]  # session_id, token, first_seq, episodes


class Submission:
    """One operation waiting for its transaction."""

    __slots__ = (
        "append",
        "chars",
        "done",
        "error",
        "eviction",
        "finished",
        "metadata_json",
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
        append: Append | None = None,
        size: int = 1,
        chars: int = 0,
    ) -> None:
        self.operation = operation  # None for an append: journal.append over ``append``
        self.done = done
        self.append = append  # set for appends, which can also run together (see _append_run)
        self.eviction: tuple[str, int, int] | None = None  # likewise for eviction boundaries (_eviction_run)
        #: An append's metadata JSON per episode, where its caller made it (see Store.submit_append).
        self.metadata_json: Sequence[str | None] | None = None
        self.size = size  # rows it stores (one for most operations)
        self.chars = chars  # characters of content it stores
        self.finished: Wakeup | None = None  # for the one caller that awaits the outcome
        self.result: Any = None
        self.error: BaseException | None = None
        self.refused = False  # it waited too long for a lock (or ran too long): not run again with the rest
        self.urgent = False  # a lease renewal: first in its transaction (see _enqueue)


class PendingRead(Generic[T]):
    """One read on the read connection (its identity tells whether it is the one running)."""

    __slots__ = ("abandoned", "operation")

    def __init__(self, operation: Operation[T]) -> None:
        self.operation = operation
        self.abandoned = False  # its caller gave up: if it has not started, it never does
