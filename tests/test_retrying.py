"""The summarizer's retry loop (memengine/retrying.py): tries, waits, what it raises, on both backends."""

from __future__ import annotations

import anyio
import pytest

from memengine.retrying import backoff_seconds, with_retries

pytestmark = pytest.mark.anyio


class Flaky:
    """Fails the first ``failures`` calls, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if self.calls <= self.failures:
            raise ValueError(f"failure {self.calls}")
        return "answer"


async def test_a_call_that_succeeds_at_once_is_made_once_and_tells_no_one() -> None:
    told: list[object] = []
    call = Flaky(0)
    assert await with_retries(call, 3, 0.001, 0.001, lambda *failure: told.append(failure)) == ("answer", 1)
    assert call.calls == 1 and told == []


async def test_failures_are_retried_with_the_attempt_error_and_wait_told() -> None:
    told: list[tuple[int, str, float]] = []
    call = Flaky(2)
    result = await with_retries(call, 3, 0.004, 0.004, lambda n, e, s: told.append((n, str(e), s)))
    assert result == ("answer", 3) and call.calls == 3
    assert [(n, e) for n, e, _ in told] == [(1, "failure 1"), (2, "failure 2")]
    assert all(0 <= seconds <= 0.004 for _, _, seconds in told)


async def test_the_last_error_is_raised_after_the_last_attempt() -> None:
    told: list[int] = []
    call = Flaky(10)
    with pytest.raises(ValueError, match="failure 3"):
        await with_retries(call, 3, 0.001, 0.001, lambda n, e, s: told.append(n))
    assert call.calls == 3 and told == [1, 2]  # no wait after the last one


async def test_one_attempt_means_no_retry() -> None:
    call = Flaky(1)
    with pytest.raises(ValueError, match="failure 1"):
        await with_retries(call, 1, 0.001, 0.001, lambda *failure: pytest.fail("nothing is retried"))
    assert call.calls == 1


async def test_cancelled_while_waiting_to_retry_it_stops_there() -> None:
    call = Flaky(10)
    with anyio.move_on_after(0.2) as scope:
        await with_retries(call, 5, 60.0, 60.0, lambda *failure: None)  # a wait of up to a minute
    assert scope.cancelled_caught and call.calls == 1


async def test_base_exceptions_are_not_retried() -> None:
    calls = 0

    async def interrupted() -> str:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await with_retries(interrupted, 3, 0.001, 0.001, lambda *failure: None)
    assert calls == 1


def test_backoff_grows_exponentially_up_to_its_cap_with_full_jitter() -> None:
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (100, 5.0)]:
        draws = [backoff_seconds(attempt, 0.5, 5.0) for _ in range(200)]
        assert all(0 <= seconds <= ceiling for seconds in draws)
        assert max(draws) > ceiling * 0.5  # jitter spans the range, not a fixed wait
