"""A one-shot reply slot: the only thing a caller waits on."""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


class Reply(Generic[T]):
    """Carries one answer (a value or an error) from an actor to one caller.

    The actor sets it without waiting; the caller awaits :meth:`wait`. A caller
    cancelled in :meth:`wait` stops waiting on its own reply and affects nothing
    else: the actor still handles the message and sets the reply. Setting a reply
    twice keeps the first answer.
    """

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    def set(self, value: T) -> None:
        if not self._done.is_set():
            self._value = value
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    async def wait(self) -> T:
        """Wait for the answer. This is a checkpoint; if cancelled, only this wait ends."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
