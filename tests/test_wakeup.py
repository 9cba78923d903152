"""The one-waiter wake-up behind replies, mailboxes and the committer: anyio.Event's semantics, on both backends."""

from __future__ import annotations

import anyio
import pytest

from memengine.actor.wakeup import Wakeup

pytestmark = pytest.mark.anyio


async def test_a_set_wakeup_wakes_its_waiter() -> None:
    wakeup = Wakeup()
    woken: list[str] = []

    async def waiter() -> None:
        await wakeup.wait()
        woken.append("woken")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert woken == [] and not wakeup.is_set()
        wakeup.set()
        assert wakeup.is_set()
    assert woken == ["woken"]


async def test_waiting_on_a_set_wakeup_returns_at_once_but_is_a_checkpoint() -> None:
    wakeup = Wakeup()
    wakeup.set()
    wakeup.set()  # again: nothing happens
    await wakeup.wait()
    await wakeup.wait()  # set stays set
    with anyio.CancelScope() as scope:
        scope.cancel()
        await wakeup.wait()
        pytest.fail("a cancelled scope must raise at the wait, as anyio.Event.wait does")
    assert scope.cancelled_caught


async def test_a_cancelled_wait_leaves_it_unset_and_a_later_set_reaches_a_new_waiter() -> None:
    wakeup = Wakeup()
    with anyio.move_on_after(0.01) as scope:
        await wakeup.wait()
    assert scope.cancelled_caught and not wakeup.is_set()
    wakeup.set()  # nobody waits now: must not touch the cancelled waiter
    with anyio.fail_after(60):
        await wakeup.wait()


async def test_set_and_cancel_in_the_same_step_leave_no_waiter_behind() -> None:
    """Set, then the waiter's scope cancelled before it runs: it raises (as with anyio.Event); the wake-up stays set."""
    wakeup = Wakeup()
    outcome: list[str] = []

    async def waiter(scope: anyio.CancelScope) -> None:
        with scope:
            await wakeup.wait()
            outcome.append("returned")
        if scope.cancelled_caught:
            outcome.append("cancelled")

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(waiter, scope)
        await anyio.wait_all_tasks_blocked()
        wakeup.set()
        scope.cancel()
    assert len(outcome) == 1 and outcome[0] in ("returned", "cancelled")
    assert wakeup.is_set()
    await wakeup.wait()


async def test_a_second_waiter_at_the_same_time_is_refused() -> None:
    wakeup = Wakeup()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wakeup.wait)
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="one waiter"):
            await wakeup.wait()
        wakeup.set()


async def test_a_waiter_cancelled_and_waiting_again_is_woken() -> None:
    wakeup = Wakeup()
    woken: list[int] = []

    async def waiter() -> None:
        with anyio.move_on_after(0.01):
            await wakeup.wait()
        await wakeup.wait()  # the same task waits again after its first wait was cancelled
        woken.append(1)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(waiter)
        await anyio.sleep(0.05)
        await anyio.wait_all_tasks_blocked()
        assert woken == []
        wakeup.set()
    assert woken == [1]
