"""A one-shot reply slot: the only thing a caller waits on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .wakeup import Wakeup

T = TypeVar("T")


class Reply(Generic[T]):
    """Carries one answer (a value or an error) from an actor to one caller.

    The actor sets it without waiting; the caller awaits :meth:`wait`. A caller
    cancelled in :meth:`wait` stops waiting on its own reply and affects nothing
    else: the actor still handles the message and sets the reply. Setting a reply
    twice keeps the first answer.

    A caller that gave up (cancelled before the answer came) marks the reply
    :attr:`abandoned`, and the actor's :meth:`on_abandon` callback, if any,
    runs: an actor holding the message for later (a read waiting for a
    summary) lets it go at once.
    """

    __slots__ = ("_answered", "_done", "_error", "_on_abandon", "_value", "abandoned")

    def __init__(self) -> None:
        self._done = Wakeup()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._on_abandon: Callable[[], object] | None = None
        self.abandoned = False
        self._answered = False  # a plain flag: asked on every answer, cheaper than the event

    @property
    def answered(self) -> bool:
        return self._answered

    def set(self, value: T) -> None:
        if not self._answered:
            self._answered = True
            self._value = value
            self._on_abandon = None
            self._done.set()

    def fail(self, error: BaseException) -> None:
        if not self._answered:
            self._answered = True
            self._error = error
            self._on_abandon = None
            self._done.set()

    def on_abandon(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (once) if the caller gives up before the answer."""
        if self.abandoned:
            callback()
        else:
            self._on_abandon = callback

    async def wait(self) -> T:
        """Wait for the answer. This is a checkpoint; if cancelled, only this wait ends."""
        try:
            await self._done.wait()
        except BaseException:
            if not self._answered:
                self.abandoned = True
                callback, self._on_abandon = self._on_abandon, None
                if callback is not None:
                    callback()
            raise
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
