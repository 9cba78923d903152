"""A blocking portal whose every call, and its shutdown, is bounded in real time.

A test driving the engine from a thread (the stateful property test) waits on
the portal's futures. Under trio with an autojump ``MockClock`` a wait that
never ends leaves the loop idle, and so does a loop of tiny sleeps, each of
which costs the clock's autojump threshold in real time: either would hang the
suite. With this portal the test fails instead, and its error shows every task
of the event loop and where each one waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from types import FrameType
from typing import Any

import anyio
from anyio.from_thread import start_blocking_portal


class PortalHung(BaseException):
    """A call through the portal, or its shutdown, did not finish in time.

    Not an ``Exception``: like ``KeyboardInterrupt``, hypothesis lets it
    through at once instead of shrinking the example, which would hang again
    for the whole guard on every attempt. pytest reports the test as failed.
    """


class GuardedPortal:
    """:func:`anyio.from_thread.start_blocking_portal`, entered, with deadlines on everything.

    ``guard`` is the seconds any one call may take; :meth:`close` gives the
    tasks still running ``guard`` seconds, then cancels them.
    """

    def __init__(self, backend: str, options: dict[str, Any], guard: float) -> None:
        self.backend = backend
        self.guard = guard
        self._cm = start_blocking_portal(backend, options)
        self._portal = self._cm.__enter__()
        self._running: list[Future[Any]] = []  # every task started here and maybe not finished

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func(*args)`` in the event loop and return its result, as ``BlockingPortal.call``."""
        future = self._track(self._portal.start_task_soon(func, *args))
        self.wait_for(future, self.guard, f"{_name(func)} did not return")
        return future.result()

    def start_task(self, func: Callable[..., Any]) -> tuple[Future[Any], Any]:
        """Start ``func`` as ``BlockingPortal.start_task`` does (it must report started in time)."""
        future, value = self._portal.start_task(func)
        return self._track(future), value

    def wait_for(self, future: Future[Any], timeout: float, what: str) -> None:
        """Wait until ``future`` is done; after ``timeout`` seconds, cancel its task and raise :class:`PortalHung`.

        The error lists the event loop's tasks as they were.
        """
        if not wait([future], timeout).done:
            tasks = self.tasks()
            future.cancel()  # (the portal then cancels the task's scope)
            raise PortalHung(f"{what} within {timeout:g} s (real time); the event loop's tasks:\n{tasks}")

    def close(self) -> None:
        """Stop the portal: wait for the tasks started here, cancel those still running after ``guard`` s.

        Never waits for ever: if even cancelled tasks do not end, the loop's
        thread (a daemon) is left behind. Raises :class:`PortalHung` if any
        task had to be cancelled.
        """
        _, left = wait([future for future in self._running if not future.done()], self.guard)
        report = (
            f"{len(left)} task(s) still running {self.guard:g} s after the test ended:\n{self.tasks()}" if left else ""
        )
        stopping = threading.Thread(target=self._stop, args=(bool(left),), name="portal shutdown", daemon=True)
        stopping.start()
        stopping.join(self.guard)
        if stopping.is_alive():
            raise PortalHung(f"the event loop did not stop, even with its tasks cancelled; {report or self.tasks()}")
        if report:
            raise PortalHung(f"cancelled {report}")

    def tasks(self) -> str:
        """Every task of the event loop and the frames it waits in (or why they cannot be listed)."""
        try:
            future = self._portal.start_task_soon(_describe_tasks, self.backend)
        except RuntimeError as exc:  # the portal is stopping
            return f"(they cannot be listed: {exc})"
        if not wait([future], 10).done:
            return "(the event loop did not answer in 10 s: it is blocked)"
        if future.exception() is not None:
            return f"(listing them failed: {future.exception()!r})"
        return future.result()  # type: ignore[no-any-return]

    def _track(self, future: Future[Any]) -> Future[Any]:
        self._running = [running for running in self._running if not running.done()]
        self._running.append(future)
        return future

    def _stop(self, cancel: bool) -> None:
        if cancel:
            self._portal.call(self._portal.stop, True)
        self._cm.__exit__(None, None, None)  # (when already stopped, it only waits for the loop to end)


def _name(func: Callable[..., Any]) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


def _describe_tasks(backend: str) -> str:
    """Run in the event loop: its tasks (under trio, as the tree of nurseries) and where each waits."""
    lines = [f"(the loop's clock reads {anyio.current_time():.3f})"]
    if backend == "trio":
        import trio

        def describe(task: trio.lowlevel.Task, depth: int) -> None:
            lines.append(f"{'  ' * depth}{task.name}")
            lines.extend(f"{'  ' * depth}  {where}" for where in _waits_in(list(task.iter_await_frames())))
            for nursery in task.child_nurseries:
                for child in nursery.child_tasks:
                    describe(child, depth + 1)

        describe(trio.lowlevel.current_root_task(), 0)
    else:
        import asyncio

        for task in asyncio.all_tasks():
            lines.append(task.get_name())
            lines.extend(f"  {where}" for where in _waits_in([(f, f.f_lineno) for f in _await_frames(task.get_coro())]))
    return "\n".join(lines)


def _await_frames(coroutine: Any) -> Iterator[FrameType]:
    """The frames of a coroutine and of what it awaits, outermost first."""
    while coroutine is not None:
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
        if frame is None:
            return
        yield frame
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)


def _waits_in(frames: list[tuple[FrameType, int]]) -> list[str]:
    """Where a task waits: its frames outside the event loop's libraries, then the library call it is in."""
    shown = []
    for frame, lineno in frames:
        library = str(frame.f_globals.get("__name__")).startswith(_LIBRARIES)
        if not library or not shown or not shown[-1][2]:
            shown.append((frame, lineno, library))
    return [f"{frame.f_code.co_filename}:{lineno} in {frame.f_code.co_name}" for frame, lineno, _ in shown]


_LIBRARIES = ("trio", "anyio", "asyncio", "contextlib")
