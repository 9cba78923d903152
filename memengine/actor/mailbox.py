"""An actor's mailbox: messages in arrival order, cancel-safe waiting."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class MailboxClosed(Exception):
    """The actor behind this mailbox has stopped."""


class Mailbox(Generic[T]):
    """A FIFO of messages for one actor.

    Putting never waits: every client message carries a reply its sender awaits,
    so the depth is bounded by the number of callers waiting on this session,
    and a child actor's acknowledgement can never block on its parent.

    The actor waits for mail with :meth:`wait_for_mail`, which may be cancelled
    (by an idle deadline) without losing a message: messages stay in the queue
    until :meth:`take` removes them. (A cancelled ``receive()`` on an anyio
    memory stream can drop an item already handed to the receiver.)
    """

    __slots__ = ("_arrived", "_closed", "_queue")

    def __init__(self) -> None:
        self._queue: deque[T] = deque()
        self._arrived = anyio.Event()
        self._closed = False

    def put(self, message: T) -> None:
        if self._closed:
            raise MailboxClosed
        self._queue.append(message)
        self._arrived.set()

    def take(self) -> T | None:
        """The oldest message, or ``None`` when the mailbox is empty."""
        if self._queue:
            return self._queue.popleft()
        return None

    async def wait_for_mail(self) -> None:
        """Return once the mailbox holds a message. Cancelling loses nothing."""
        while not self._queue:
            self._arrived = anyio.Event()
            await self._arrived.wait()

    def close(self) -> list[T]:
        """Refuse further messages; return those never taken."""
        self._closed = True
        left = list(self._queue)
        self._queue.clear()
        return left
