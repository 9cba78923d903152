"""The engine's retries on tenacity (memengine/retrying.py): tries, waits, what they raise, on both backends."""

from __future__ import annotations

import random

import anyio
import pytest
import tenacity

import memengine.retrying
from memengine.retrying import retry_delay, wait_jitter, wait_jittered_exponential, with_retries, with_retries_in_thread

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
    told: list[int] = []
    with anyio.CancelScope() as scope:

        def cancel_the_wait(attempt: int, error: Exception, seconds: float) -> None:
            told.append(attempt)
            scope.cancel()  # the wait about to start (up to a minute) is cancelled at once

        await with_retries(call, 5, 60.0, 60.0, cancel_the_wait)
    assert scope.cancelled_caught and call.calls == 1 and told == [1]


async def test_cancelled_while_waiting_after_a_later_try_it_stops_there_too() -> None:
    call = Flaky(10)
    with anyio.CancelScope() as scope:

        def cancel_after_the_second(attempt: int, error: Exception, seconds: float) -> None:
            if attempt == 2:
                scope.cancel()

        await with_retries(call, 5, 0.001, 0.001, cancel_after_the_second)
    assert scope.cancelled_caught and call.calls == 2


async def test_a_call_that_succeeds_at_once_builds_no_retry_object(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the happy path builds nothing of tenacity's")

    monkeypatch.setattr(tenacity, "AsyncRetrying", refuse)
    assert await with_retries(Flaky(0), 3, 0.001, 0.001, lambda *failure: None) == ("answer", 1)


async def test_the_retries_after_a_failure_go_through_tenacity(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[tenacity.AsyncRetrying] = []
    real = tenacity.AsyncRetrying

    def recording(*args: object, **kwargs: object) -> tenacity.AsyncRetrying:
        built.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return built[-1]

    monkeypatch.setattr(tenacity, "AsyncRetrying", recording)
    assert await with_retries(Flaky(1), 3, 0.001, 0.001, lambda *failure: None) == ("answer", 2)
    (retrying,) = built
    assert isinstance(retrying.wait, tenacity.wait_random_exponential)
    assert isinstance(retrying.stop, tenacity.stop_after_attempt) and retrying.stop.max_attempt_number == 3
    assert retrying.statistics["attempt_number"] == 2


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
    # retry_delay(failures, attempts, ...): failure n of a round of 10 waits up to min(5, 0.5 * 2 ** (n - 1)).
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (9, 5.0)]:
        draws = [retry_delay(failures, 10, 0.5, 5.0, retry_later=99.0) for _ in range(200)]
        assert all(0 <= seconds <= ceiling for seconds in draws)
        assert max(draws) > ceiling * 0.5  # jitter spans the range, not a fixed wait


def test_after_a_rounds_last_try_the_wait_is_retry_later_then_a_new_round_begins() -> None:
    assert retry_delay(3, 3, 0.5, 5.0, retry_later=60.0) == 60.0
    assert retry_delay(6, 3, 0.5, 5.0, retry_later=60.0) == 60.0
    assert all(0 <= retry_delay(4, 3, 0.5, 5.0, retry_later=60.0) <= 0.5 for _ in range(50))  # round 2, try 1
    assert retry_delay(1, 1, 0.5, 5.0, retry_later=60.0) == 60.0  # one try per round: every failure ends one


def test_a_huge_attempt_number_waits_the_cap_not_an_overflow() -> None:
    assert all(0 <= retry_delay(10_000, 100_000, 0.5, 5.0, retry_later=60.0) <= 5.0 for _ in range(20))


def test_the_jitter_leaves_the_applications_random_state_alone() -> None:
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    wait = wait_jittered_exponential(multiplier=0.5, max=5.0)
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    for attempt in range(1, 20):
        state.attempt_number = attempt
        wait(state)
        retry_delay(attempt, 7, 0.5, 5.0, retry_later=60.0)
    assert random.random() == expected
    assert isinstance(wait, tenacity.wait_random_exponential)  # tenacity's strategy, its own source of jitter
    assert memengine.retrying._JITTER is not random._inst  # type: ignore[attr-defined]


class FlakyInThread:
    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "renewed"


def test_a_blocking_call_is_tried_again_on_the_errors_the_predicate_accepts() -> None:
    told: list[str] = []
    call = FlakyInThread([ConnectionError("dropped"), ConnectionError("dropped again")])
    result = with_retries_in_thread(
        call, 4, lambda e: isinstance(e, ConnectionError), lambda n, e: told.append(f"{n}: {e}")
    )
    assert result == "renewed" and call.calls == 3 and told == ["1: dropped", "2: dropped again"]


def test_a_blocking_call_raises_an_error_the_predicate_refuses_at_once() -> None:
    call = FlakyInThread([ValueError("bad input"), ConnectionError("never reached")])
    with pytest.raises(ValueError, match="bad input"):
        with_retries_in_thread(call, 4, lambda e: isinstance(e, ConnectionError), lambda n, e: None)
    assert call.calls == 1


def test_a_blocking_call_raises_its_last_error_after_its_attempts() -> None:
    call = FlakyInThread([ConnectionError(f"dropped {n}") for n in range(1, 10)])
    with pytest.raises(ConnectionError, match="dropped 4"):
        with_retries_in_thread(call, 4, lambda e: isinstance(e, ConnectionError), lambda n, e: None)
    assert call.calls == 4


def test_a_blocking_call_waits_as_its_tenacity_wait_says_between_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(tenacity.nap.time, "sleep", slept.append)
    call = FlakyInThread([ConnectionError("deadlock"), ConnectionError("deadlock")])
    wait = tenacity.wait_incrementing(start=1.0, increment=2.0) + wait_jitter(0, 0.5)
    assert with_retries_in_thread(call, 8, lambda e: True, lambda n, e: None, wait) == "renewed"
    assert len(slept) == 2 and 1.0 <= slept[0] <= 1.5 and 3.0 <= slept[1] <= 3.5


def test_a_blocking_call_that_succeeds_at_once_builds_no_retry_object(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the happy path builds nothing of tenacity's")

    monkeypatch.setattr(tenacity, "Retrying", refuse)
    assert with_retries_in_thread(FlakyInThread([]), 4, lambda e: True, lambda n, e: None) == "renewed"


def test_the_pause_of_a_waiting_loop_doubles_from_its_first_value_up_to_its_cap() -> None:
    from memengine.retrying import doubling_pause

    assert [doubling_pause(n, 0.02, 0.2) for n in range(1, 8)] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2])
    assert doubling_pause(40, 0.02, 0.5) == 0.5  # no overflow far down the line
