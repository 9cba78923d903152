"""The store's commit thread: jobs run one at a time, in order, off the loop; answers come back on the loop."""

from __future__ import annotations

import threading

import anyio
import pytest

from memengine.store.commit_thread import CommitThread

pytestmark = pytest.mark.anyio

DEADLINE = 30.0  # seconds: generous, for a loaded machine; only a broken thread ever gets near it


async def test_jobs_run_in_the_thread_in_order_and_return_their_results() -> None:
    commits = CommitThread("test commits")
    seen: list[tuple[int, str]] = []

    def job(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * n

    try:
        results: dict[int, int] = {}

        async def submit(n: int) -> None:
            results[n] = await commits.run(job, n)

        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tasks:
                for n in range(50):
                    tasks.start_soon(submit, n)
                    await anyio.lowlevel.checkpoint()  # submitted in order
        assert results == {n: n * n for n in range(50)}
        assert [n for n, _ in seen] == list(range(50))
        assert {name for _, name in seen} == {"test commits"}
        assert threading.main_thread().name not in {name for _, name in seen}
    finally:
        commits.stop()


async def test_an_exception_in_a_job_is_raised_to_its_caller_and_the_thread_goes_on() -> None:
    commits = CommitThread("test commits")

    def fails() -> None:
        raise ValueError("the job failed")

    try:
        with anyio.fail_after(DEADLINE):
            with pytest.raises(ValueError, match="the job failed"):
                await commits.run(fails)
            assert await commits.run(lambda: "still serving") == "still serving"
    finally:
        commits.stop()


async def test_a_cancelled_caller_stops_waiting_but_its_job_still_runs_to_the_end() -> None:
    commits = CommitThread("test commits")
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(DEADLINE)
        finished.set()
        return "done"

    try:
        with anyio.fail_after(DEADLINE):
            async with anyio.create_task_group() as tasks:
                scope = anyio.CancelScope()

                async def caller() -> None:
                    with scope:
                        await commits.run(slow)
                    assert scope.cancelled_caught

                tasks.start_soon(caller)
                assert await anyio.to_thread.run_sync(started.wait, DEADLINE)
                scope.cancel()  # the caller returns at once, while the job is still running
            assert not finished.is_set()
            release.set()
            # The next job runs after it (one at a time): so the first ran to its end.
            assert await commits.run(finished.is_set) is True
    finally:
        release.set()
        commits.stop()


def test_a_job_that_ends_after_its_event_loop_closed_is_dropped_quietly(anyio_backend_name: str) -> None:
    """The loop's thread-safe call refuses once the run is over; the thread serves on."""
    commits = CommitThread("test commits")
    started, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,arg-type]

    def slow() -> str:
        started.set()
        release.wait(DEADLINE)
        return "late"

    async def leave_it_running() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(commits.run, slow)
            assert await anyio.to_thread.run_sync(started.wait, DEADLINE)
            tasks.cancel_scope.cancel()

    async def after() -> str:
        with anyio.fail_after(DEADLINE):
            return await commits.run(lambda: "next")

    try:
        anyio.run(leave_it_running, backend=anyio_backend_name)
        release.set()  # the job ends now, and its answer has no loop to go to
        assert anyio.run(after, backend=anyio_backend_name) == "next"
        assert errors == []
    finally:
        threading.excepthook = hook
        release.set()
        commits.stop()


async def test_a_started_job_answers_on_the_loop_in_order_and_anyio_works_in_the_answer() -> None:
    """``start`` returns at once; each answer is a callback on the caller's loop (where anyio works, as in a task)."""
    commits = CommitThread("test commits")
    loop_thread = threading.current_thread()
    answers: list[tuple[object, str | None, bool, float]] = []
    all_answered = anyio.Event()

    def answer(result: object, error: BaseException | None) -> None:
        # anyio calls that need to know the running loop: an Event, the loop's clock.
        anyio.Event().set()
        answers.append(
            (
                result,
                None if error is None else str(error),
                threading.current_thread() is loop_thread,
                anyio.current_time(),
            )
        )
        if len(answers) == 3:
            all_answered.set()

    def fails() -> None:
        raise ValueError("the job failed")

    try:
        with anyio.fail_after(DEADLINE):
            commits.start(lambda: 1, (), answer)
            commits.start(fails, (), answer)
            commits.start(lambda n: n * 2, (21,), answer)
            await all_answered.wait()
        assert [(result, error, on_loop) for result, error, on_loop, _ in answers] == [
            (1, None, True),
            (None, "the job failed", True),
            (42, None, True),
        ]
    finally:
        commits.stop()
