"""The retry policy shared by the summarizer and retain delivery actors."""

from __future__ import annotations

import random
from collections.abc import Callable

import anyio
import tenacity

#: The engine's own source of jitter: the global ``random`` state belongs to the application.
_JITTER = random.Random()


def backoff_retrying(
    attempts: int, backoff: float, backoff_max: float, before_sleep: Callable[[tenacity.RetryCallState], None]
) -> tenacity.AsyncRetrying:
    """Up to ``attempts`` tries of any Exception, waiting exponentially with full jitter.

    Jitter spreads the retries of many sessions hitting the same failing
    service. Sleeps through anyio, so it works (and is cancellable) on asyncio
    and trio; the last error is re-raised.
    """
    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=_full_jitter(backoff, backoff_max),
        retry=tenacity.retry_if_exception_type(Exception),
        sleep=anyio.sleep,
        before_sleep=before_sleep,
        reraise=True,
    )


def _full_jitter(backoff: float, backoff_max: float) -> Callable[[tenacity.RetryCallState], float]:
    """tenacity's ``wait_random_exponential``, drawing from the engine's own random source."""

    def wait(state: tenacity.RetryCallState) -> float:
        return _JITTER.uniform(0, min(backoff_max, backoff * 2.0 ** min(state.attempt_number - 1, 64)))

    return wait


def retry_delay(failures: int, attempts: int, backoff: float, backoff_max: float, retry_later: float) -> float:
    """Seconds to wait after the ``failures``-th failure in a row, in rounds of ``attempts`` tries.

    The same policy as :func:`backoff_retrying`, for failures counted in a
    store rather than in one loop: between the tries of a round, exponential
    backoff with full jitter; after a round's last try, ``retry_later``; then
    a new round.
    """
    tried = failures % attempts
    if tried == 0:
        return retry_later
    return _JITTER.uniform(0, min(backoff_max, backoff * 2.0 ** min(tried - 1, 64)))
