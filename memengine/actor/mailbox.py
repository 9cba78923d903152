"""An actor's mailbox: messages in arrival order, cancel-safe waiting, bounded for clients."""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio

from .wakeup import Wakeup

T = TypeVar("T")


class Ahead(enum.Enum):
    """What :meth:`Mailbox.take_ahead` does with a message."""

    TAKE = enum.auto()
    PASS = enum.auto()
    STOP = enum.auto()


class MailboxClosed(Exception):
    """The actor behind this mailbox has stopped."""


class Mailbox(Generic[T]):
    """A FIFO of messages for one actor.

    Clients :meth:`send`: when ``capacity`` messages from clients wait
    unhandled, a further sender waits for room (back-pressure; cancelling that
    wait sends nothing). The actor's own traffic (a child's acknowledgement, a
    tick, a message handed on from an earlier activation) is :meth:`put`
    without waiting, so it can never block on its parent.

    The actor waits for mail with :meth:`wait_for_mail`, which may be cancelled
    (by an idle deadline) without losing a message: messages stay in the queue
    until :meth:`take` removes them. (A cancelled ``receive()`` on an anyio
    memory stream can drop an item already handed to the receiver.)
    """

    __slots__ = ("_arrived", "_capacity", "_closed", "_from_clients", "_queue", "_room")

    def __init__(self, capacity: int = 1_000_000) -> None:
        self._queue: deque[tuple[T, bool]] = deque()
        self._arrived = Wakeup()
        self._room: anyio.Event | None = None  # made only when a sender must wait (many may)
        self._capacity = capacity
        self._from_clients = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def empty(self) -> bool:
        return not self._queue

    @property
    def depth(self) -> int:
        """How many messages wait in the queue (clients' and the actor's own)."""
        return len(self._queue)

    def has_room(self) -> bool:
        return self._from_clients < self._capacity

    def put(self, message: T) -> None:
        """Queue the actor's own traffic (never waits; not counted against the capacity)."""
        self._append(message, False)

    def put_if_open(self, message: T) -> bool:
        """:meth:`put`, unless the actor has stopped (the mailbox closed): then drop it and return False.

        For notices that mean nothing to a stopped actor (a tick, a lost lease,
        a child's answer), which may arrive in the same moment it stops.
        """
        if self._closed:
            return False
        self._append(message, False)
        return True

    def send_now(self, message: T) -> None:
        """Queue a client's message; the caller has checked :meth:`has_room`."""
        self._append(message, True)
        self._from_clients += 1

    async def wait_for_room(self) -> None:
        """Return once a client message may be sent, or the mailbox closed. Cancelling loses nothing."""
        while not self.has_room() and not self._closed:
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()

    def take_ahead(self, decide: Callable[[T], Ahead], look_at: int) -> list[T]:
        """Take messages from the front on: each is taken, passed over (left in place) or ends the search.

        ``decide`` is asked about each message in order, at most ``look_at`` of them.
        """
        taken: list[T] = []
        passed: list[tuple[T, bool]] = []
        while self._queue and len(taken) + len(passed) < look_at:
            entry = self._queue[0]
            verdict = decide(entry[0])
            if verdict is Ahead.STOP:
                break
            self._queue.popleft()
            if verdict is Ahead.TAKE:
                taken.append(entry[0])
                self._from_clients -= entry[1]
            else:
                passed.append(entry)
        self._queue.extendleft(reversed(passed))
        if taken:
            self._wake_senders()
        return taken

    def take(self) -> T | None:
        """The oldest message, or ``None`` when the mailbox is empty."""
        if not self._queue:
            return None
        message, from_client = self._queue.popleft()
        if from_client:
            self._from_clients -= 1
            self._wake_senders()
        return message

    async def wait_for_mail(self) -> None:
        """Return once the mailbox holds a message. Cancelling loses nothing."""
        while not self._queue:
            self._arrived = Wakeup()
            await self._arrived.wait()

    def close(self) -> list[T]:
        """Refuse further messages; return those never taken."""
        self._closed = True
        left = [message for message, _ in self._queue]
        self._queue.clear()
        self._from_clients = 0
        self._wake_senders()
        return left

    def _append(self, message: T, from_client: bool) -> None:
        if self._closed:
            raise MailboxClosed
        self._queue.append((message, from_client))
        self._arrived.set()

    def _wake_senders(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None
