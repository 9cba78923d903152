"""The retry policy of the engine, on tenacity: the summarizer's calls, retain delivery's refused batches, renewals.

One policy, tenacity's: up to ``attempts`` tries (``stop_after_attempt``),
waiting exponentially with full jitter between them
(``wait_random_exponential``). Three shapes of use:

- :func:`with_retries`, an async call retried in place (the summarizer).
  The first try is made directly and only a failed call is handed to
  tenacity's ``AsyncRetrying``: building tenacity's retry objects for every
  call cost about a twentieth of the engine's evicting throughput
  (``benchmarks/throughput.py --evicting``), for calls that nearly always
  succeed at once. The happy path so costs one ``try``.
- :func:`retry_delay`, for failures counted in a store rather than in one
  loop (retain delivery records a refused batch with its retry time): the
  numbers come from the same tenacity ``stop`` and ``wait`` strategies.
- :func:`with_retries_in_thread`, a blocking call in a worker thread
  retried at once on the errors a predicate accepts (lease renewals on
  PostgreSQL), through tenacity's ``Retrying``, again only after a first
  failure.

Jitter is drawn from the engine's own ``random.Random``: tenacity's
``wait_random_exponential`` draws from the global ``random`` state, which
belongs to the application (Hypothesis watches it during draws and failed a
property test when the engine's threads moved it).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import tenacity

T = TypeVar("T")

#: The engine's own source of jitter: the global ``random`` state belongs to the application.
_JITTER = random.Random()


class wait_jittered_exponential(tenacity.wait_random_exponential):
    """tenacity's ``wait_random_exponential`` (full jitter), drawing from the engine's own random source.

    The window after try ``n`` fails is ``[0, min(max, multiplier * 2 ** (n - 1))]``,
    computed by tenacity's ``wait_exponential``.
    """

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        high = tenacity.wait_exponential.__call__(self, retry_state)
        return _JITTER.uniform(self.min, high)


def _policy(
    attempts: int,
    backoff: float,
    backoff_max: float,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
) -> tenacity.AsyncRetrying:
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait_jittered_exponential(multiplier=backoff, max=backoff_max),
        retry=tenacity.retry_if_exception_type(Exception),
        sleep=anyio.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


async def with_retries(
    call: Callable[[], Awaitable[T]],
    attempts: int,
    backoff: float,
    backoff_max: float,
    before_sleep: Callable[[int, Exception, float], None],
) -> tuple[T, int]:
    """``call()``'s result and the tries it took: up to ``attempts`` tries of any Exception.

    Between tries it waits exponentially with full jitter
    (:class:`wait_jittered_exponential`); ``before_sleep(attempt, error, seconds)``
    is told of each failure that is retried. The last error is raised; a
    BaseException (a cancellation, KeyboardInterrupt) is not retried. Sleeps
    through anyio, so it works on asyncio and trio; a cancellation during a
    wait ends it there (no further try is made).
    """
    try:
        return await call(), 1
    except Exception as error:
        if attempts <= 1:
            raise
        failure = error

    # Only a failed call gets here: tenacity's first try is the one made above, replayed.
    def tell(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert isinstance(error, Exception)
        assert state.next_action is not None
        before_sleep(state.attempt_number, error, state.next_action.sleep)

    async for attempt in _policy(attempts, backoff, backoff_max, tell):
        with attempt:
            if attempt.retry_state.attempt_number == 1:
                raise failure
            result = await call()
    return result, attempt.retry_state.attempt_number


def retry_delay(failures: int, attempts: int, backoff: float, backoff_max: float, retry_later: float) -> float:
    """Seconds to wait after the ``failures``-th failure in a row, in rounds of ``attempts`` tries.

    The policy of :func:`with_retries`, for failures counted in a store
    rather than in one loop: between the tries of a round, tenacity's wait
    (exponential backoff with full jitter); after a round's last try (where
    tenacity's ``stop_after_attempt`` stops), ``retry_later``; then a new round.
    """
    policy = _policy(attempts, backoff, backoff_max)
    state = tenacity.RetryCallState(policy, None, (), {})
    state.attempt_number = (failures - 1) % attempts + 1  # the try of this round that just failed
    if policy.stop(state):
        return retry_later
    return policy.wait(state)


def doubling_pause(attempt: int, first: float, cap: float) -> float:
    """The pause after poll or try number ``attempt`` (from 1): ``first``, doubling, at most ``cap``.

    tenacity's ``wait_exponential``, without jitter: for loops that wait for
    something to change (another owner's lease to lapse, a commit in doubt to
    settle) rather than for a failing call to recover.
    """
    state = tenacity.RetryCallState(None, None, (), {})
    state.attempt_number = attempt
    return tenacity.wait_exponential(multiplier=first, min=first, max=cap)(state)


class wait_jitter(tenacity.wait_random):
    """tenacity's ``wait_random``, drawing from the engine's own random source."""

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        return _JITTER.uniform(self.wait_random_min, self.wait_random_max)


def with_retries_in_thread(
    call: Callable[[], T],
    attempts: int,
    retry_on: Callable[[BaseException], bool],
    before_retry: Callable[[int, BaseException], None],
    wait: tenacity.wait.wait_base | None = None,
) -> T:
    """``call()`` in this (worker) thread: up to ``attempts`` tries while it raises errors ``retry_on`` accepts.

    For failures that a new try cures soon (a connection dropped while idle,
    a deadlock the server broke): tried again at once, or after ``wait`` (a
    tenacity wait strategy; the thread sleeps). ``before_retry(attempt, error)``
    is told of each failure that is tried again. The first try is made
    directly; tenacity's ``Retrying`` takes over only after it failed. The
    last error is raised.
    """
    try:
        return call()
    except Exception as error:
        if attempts <= 1 or not retry_on(error):
            raise
        failure: Exception | None = error

    def again() -> T:
        nonlocal failure
        if failure is not None:  # tenacity's first try is the one made above
            replayed, failure = failure, None
            raise replayed
        return call()

    def tell(state: tenacity.RetryCallState) -> None:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert error is not None
        before_retry(state.attempt_number, error)

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_none() if wait is None else wait,
        retry=tenacity.retry_if_exception(retry_on),
        before_sleep=tell,
        reraise=True,
    )
    return retrying(again)
