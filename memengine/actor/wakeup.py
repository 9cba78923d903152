"""A one-shot wake-up for exactly one waiting task: what an actor, a reply and the committer wait on.

It does what ``anyio.Event`` does for one waiter (set once, never cleared;
waiting is a checkpoint, and cancelling the wait affects nothing else), at a
fraction of the cost: every add sets and waits on two of them (the session's
mailbox, then the caller's reply), and with ``anyio.Event`` these waits cost
more than the rest of the event loop's work per add (``benchmarks/throughput.py``).

Waiting parks the task with its event loop's own primitive: an asyncio future,
or trio's ``wait_task_rescheduled`` (what ``trio.Event`` parks on too).
:meth:`Wakeup.set` is called on the event loop's thread, never from another
thread (as for ``anyio.Event``).

This is the one module of the engine that talks to asyncio and trio rather
than to anyio alone (tests/test_layout.py keeps it so): a shim as small as the
saving is large, tested on both backends (tests/test_wakeup.py).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import anyio.lowlevel

try:
    import sniffio
except ImportError:  # anyio does without it too: then nothing but asyncio runs (trio requires sniffio)
    sniffio = None  # type: ignore[assignment]


class Wakeup:
    """Set once; one task at a time may :meth:`wait` for it."""

    __slots__ = ("_is_set", "_waiter")

    def __init__(self) -> None:
        self._is_set = False
        self._waiter: Any = None  # the parked asyncio future or trio task, while one waits

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        """Set it and wake the waiting task, if any (setting it again does nothing)."""
        if self._is_set:
            return
        self._is_set = True
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():  # done: its task was cancelled and will raise where it waits
                waiter.set_result(None)
        else:
            _trio_lowlevel().reschedule(waiter)

    async def wait(self) -> None:
        """Return once it is set (at once, after a checkpoint, if it already is).

        A checkpoint either way: cancelled, it raises as ``anyio.Event.wait``
        does, and the wake-up stays unset for a later wait.
        """
        if self._is_set:
            await anyio.lowlevel.checkpoint()
            return
        if self._waiter is not None:
            raise RuntimeError("a Wakeup has one waiter at a time")
        if _under_trio():
            lowlevel = _trio_lowlevel()
            self._waiter = lowlevel.current_task()
            await lowlevel.wait_task_rescheduled(self._abort_trio)
            return
        future = asyncio.get_running_loop().create_future()
        self._waiter = future
        try:
            await future
        finally:
            if self._waiter is future:  # cancelled before it was set
                self._waiter = None

    def _abort_trio(self, _: object) -> Any:
        self._waiter = None  # cancelled while parked: set() must not reschedule it
        return _trio_lowlevel().Abort.SUCCEEDED


def current_loop() -> object:
    """The running event loop: the asyncio loop, or trio's token for the run (one per ``trio.run``).

    What the engine compares with its own loop's, on every call, to refuse a
    call from another loop: a :class:`Wakeup` set on the engine's loop cannot
    wake a task of another loop (nor touch it safely from another thread).
    """
    if _under_trio():
        return _trio_lowlevel().current_trio_token()
    return asyncio.get_running_loop()


def call_soon_from_thread() -> Callable[..., object]:
    """How another thread asks the running event loop to call a function soon (without waiting for it).

    asyncio's ``loop.call_soon_threadsafe``, or trio's ``TrioToken.run_sync_soon``:
    what a thread that finished work for the loop uses to hand it back
    (store/commit_thread.py): ``call_soon(function, *args)``. Asked on the
    loop's thread; the function it returns may be called from any thread, and
    raises :class:`RuntimeError` once that loop has closed (trio's
    ``RunFinishedError`` is one).

    The function runs as a callback of the loop, in no task. Under trio,
    anyio knows its loop there as anywhere in the run; an asyncio callback
    runs in a context of its own (none of the asking task's variables) that
    names asyncio to sniffio, as anyio's own ``from_thread`` calls do, so the
    anyio calls it makes (an ``anyio.Event``, the current time) work as in a task.
    """
    if _under_trio():
        return _trio_lowlevel().current_trio_token().run_sync_soon  # type: ignore[no-any-return]
    loop = asyncio.get_running_loop()
    context = contextvars.Context()
    if sniffio is not None:
        context.run(sniffio.current_async_library_cvar.set, "asyncio")

    def call_soon(function: Callable[..., object], *args: Any) -> object:
        return loop.call_soon_threadsafe(function, *args, context=context)

    return call_soon


def _under_trio() -> bool:
    """Whether the running task is trio's: what ``sniffio.current_async_library()`` says, asking less.

    trio names itself in sniffio's thread-local while it runs (and trio-asyncio
    in its context variable); without either, the caller runs under asyncio.
    """
    if sniffio is None:
        return False
    name = sniffio.thread_local.name
    if name is None:
        name = sniffio.current_async_library_cvar.get()
    return name == "trio"


_lowlevel: Any = None


def _trio_lowlevel() -> Any:
    """``trio.lowlevel``, imported on first use: only trio programs use it, and they have trio already."""
    global _lowlevel
    if _lowlevel is None:
        import trio.lowlevel

        _lowlevel = trio.lowlevel
    return _lowlevel
