"""The retry policy shared by the summarizer and retain delivery actors."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

#: The engine's own source of jitter: the global ``random`` state belongs to the application.
_JITTER = random.Random()


async def with_retries(
    call: Callable[[], Awaitable[T]],
    attempts: int,
    backoff: float,
    backoff_max: float,
    before_sleep: Callable[[int, Exception, float], None],
) -> tuple[T, int]:
    """``call()``'s result and the tries it took: up to ``attempts`` tries of any Exception.

    Between tries it waits exponentially with full jitter (see :func:`backoff`);
    ``before_sleep(attempt, error, seconds)`` is told of each failure that is
    retried. The last error is raised. Sleeps through anyio, so it works (and
    is cancellable) on asyncio and trio.

    The policy of tenacity's ``wait_random_exponential`` with
    ``stop_after_attempt``, written out: tenacity builds its actions anew on
    every try, which cost the summarizer a twentieth of the engine's evicting
    throughput (``benchmarks/throughput.py --evicting``) for calls that
    nearly always succeed at once.
    """
    attempt = 1
    while True:
        try:
            return await call(), attempt
        except Exception as error:
            if attempt >= attempts:
                raise
            seconds = backoff_seconds(attempt, backoff, backoff_max)
            before_sleep(attempt, error, seconds)
        await anyio.sleep(seconds)
        attempt += 1


def backoff_seconds(failed_attempt: int, backoff: float, backoff_max: float) -> float:
    """How long to wait after try number ``failed_attempt`` failed: exponential, with full jitter.

    Jitter spreads the retries of many sessions hitting the same failing service.
    """
    return _JITTER.uniform(0, min(backoff_max, backoff * 2.0 ** min(failed_attempt - 1, 64)))


def retry_delay(failures: int, attempts: int, backoff: float, backoff_max: float, retry_later: float) -> float:
    """Seconds to wait after the ``failures``-th failure in a row, in rounds of ``attempts`` tries.

    The same policy as :func:`with_retries`, for failures counted in a
    store rather than in one loop: between the tries of a round, exponential
    backoff with full jitter; after a round's last try, ``retry_later``; then
    a new round.
    """
    tried = failures % attempts
    if tried == 0:
        return retry_later
    return backoff_seconds(tried, backoff, backoff_max)
