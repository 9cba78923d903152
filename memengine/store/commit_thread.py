"""The committer's own thread: where every store transaction runs, one at a time.

A commit is a blocking call (sqlite3, psycopg), so it runs off the event loop.
anyio's worker pool serves any call, which costs it a capacity limiter, a
future and a cancel scope per call; a thread of the store's own, fed through a
queue and answering with one thread-safe call back into the loop, hops there
and back in about two thirds of that time (measured: 110-120 us against
150-185 us on asyncio and trio, on a shared 2-core machine), and a single add
waits for exactly one such hop.

A job is either awaited (:meth:`CommitThread.run`) or started with a
function that receives its outcome on the loop (:meth:`CommitThread.start`):
the committer starts a transaction from whatever task submitted to an idle
store, and answers its callers from that callback, so a single add waits for
no task switch of the committer's on either side of its commit.

One job at a time, in the order submitted, so one thread is ever on the
write connection. A caller cancelled while it waits only stops waiting (as
``abandon_on_cancel``): the job still runs, and its result is dropped. The
thread is a daemon: a statement stuck on a silent server when the engine
closes is left behind (committer.py) and never holds up the interpreter's exit.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..actor.wakeup import Wakeup, call_soon_from_thread, current_loop

T = TypeVar("T")
log = logging.getLogger("memengine.store")


#: What a started job's outcome is handed to, on the event loop: ``answer(result, error)``.
Answer = Callable[[Any, "BaseException | None"], object]


class _Job(Generic[T]):
    __slots__ = ("answer", "args", "call_soon", "error", "function", "result")

    def __init__(
        self, function: Callable[..., T], args: tuple[Any, ...], call_soon: Callable[..., object], answer: Answer
    ) -> None:
        self.function = function
        self.args = args
        self.answer = answer
        self.call_soon = call_soon
        self.result: T | None = None
        self.error: BaseException | None = None


class CommitThread:
    """A thread that runs the jobs it is given one at a time, answering each on the caller's event loop."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0  # the process that started the thread: a forked child has no such thread, and starts its own
        self._loop: object = None  # the event loop that last gave a job, and how to call into it from the thread
        self._call_soon: Callable[..., object] = _no_loop

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` in the thread; return its result, or raise what it raised."""
        done = Wakeup()
        outcome: list[Any] = []

        def answer(result: T, error: BaseException | None) -> None:
            outcome[:] = (result, error)
            done.set()

        self.start(function, args, answer)
        await done.wait()  # cancelled: the job runs on, and nobody reads its result
        result, error = outcome
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]

    @property
    def started(self) -> bool:
        """Whether this process's thread is running (then :meth:`start` only queues the job)."""
        return self._thread is not None and self._pid == os.getpid()

    def start(self, function: Callable[..., T], args: tuple[Any, ...], answer: Answer) -> None:
        """Have ``function(*args)`` run in the thread, then ``answer(result, error)`` called on this event loop.

        Called on the event loop's thread; returns at once. ``answer`` runs as
        a callback of the loop (not in a task), after every job given before.
        """
        if self._thread is None or self._pid != os.getpid():
            self._start()
        loop = current_loop()
        if loop is not self._loop:  # (asked once per loop, not per job: it makes a context and a function)
            self._loop, self._call_soon = loop, call_soon_from_thread()
        self._jobs.put(_Job(function, args, self._call_soon, answer))

    def stop(self) -> None:
        """Let the thread end once the jobs already given have run (it is not waited for)."""
        if self._thread is not None and self._pid == os.getpid():
            self._jobs.put(None)
            self._thread = None

    def _start(self) -> None:
        self._jobs = queue.SimpleQueue()  # after a fork: jobs queued in the parent are the parent's
        self._loop, self._call_soon = None, _no_loop
        self._pid = os.getpid()
        self._thread = threading.Thread(target=_serve, args=(self._jobs,), name=self._name, daemon=True)
        self._thread.start()


def _no_loop(function: Callable[..., object], *args: Any) -> object:
    raise RuntimeError("no event loop gave this job")


def _serve(jobs: queue.SimpleQueue[_Job[Any] | None]) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.result = job.function(*job.args)
        except BaseException as exc:  # handed to the caller, whatever it is
            job.error = exc
        try:
            job.call_soon(job.answer, job.result, job.error)
        except RuntimeError:
            pass  # the caller's event loop has closed: nobody waits for this job any more
        except Exception:  # never let the thread end while the store may still give it jobs
            log.exception("answering a store transaction's caller failed")
        del job  # hold nothing of it while waiting for the next
