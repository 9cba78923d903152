"""The summarizer child actor: one per session, under the session's task group.

The session sends it a :class:`SummarizeBatch` (the previous summary and the
evicted episodes not yet summarized). It calls the summarizer, retrying with
tenacity (retrying.py), stores the new summary, and only *then* acknowledges to the session
with :class:`~memengine.session.messages.SummaryStored`. If it is cancelled or
crashes before that, the episodes are still unsummarized in the store and
nothing is lost. A caller waiting for a summary never awaits this actor: it
waits on its own reply from the session, so cancelling that caller cannot
cancel a summary.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import anyio
import anyio.lowlevel
import attrs

from ..actor.mailbox import Mailbox
from ..attachments import for_summarizer
from ..config import SessionConfig
from ..episode import Episode
from ..errors import LeaseLostError, SummaryError, UncertainCommitError
from ..privacy.error_text import error_label, log_content
from ..retrying import with_retries
from ..session.messages import SummaryFailed, SummaryStored
from ..store.base import Store
from ..telemetry import NO_TELEMETRY, Telemetry
from .protocol import Summarizer

log = logging.getLogger("memengine.summarizer")


@attrs.frozen
class SummarizeBatch:
    """Fold ``episodes`` into ``previous``; valid only while the session is at ``generation``.

    ``token`` is the session's lease: the summary is stored only while it holds.
    ``more``: evicted episodes wait behind this batch (a backlog), so its
    summary waits only a few milliseconds to ride along with a write (the next
    batch is sent only once this one is stored), not ``SUMMARY_RIDER_SECONDS``.
    """

    generation: int
    previous: str | None
    episodes: tuple[Episode, ...]
    token: int
    more: bool = False

    @property
    def through_seq(self) -> int:
        seq = self.episodes[-1].seq
        assert seq is not None
        return seq


class SummarizerActor:
    def __init__(
        self,
        session_id: str,
        summarizer: Summarizer,
        store: Store,
        config: SessionConfig,
        limiter: anyio.CapacityLimiter,
        acknowledge: Callable[[SummaryStored | SummaryFailed], None],
        telemetry: Telemetry = NO_TELEMETRY,
        awaited: Callable[[], bool] = lambda: False,
    ) -> None:
        self._session_id = session_id
        self._summarizer = summarizer
        self._store = store
        self._config = config
        self._limiter = limiter
        self._acknowledge = acknowledge
        #: Whether a read waits for the session's next summary (then it is committed at once, not riding along).
        self._awaited = awaited
        self._telemetry = telemetry
        self._mailbox: Mailbox[SummarizeBatch] = Mailbox()
        self._newest_generation = 0
        self._current: tuple[int, anyio.CancelScope] | None = None

    def submit(self, batch: SummarizeBatch) -> None:
        self._mailbox.put(batch)

    def abandon_before(self, generation: int) -> None:
        """Drop work computed under a generation older than ``generation``.

        The store would refuse its summary anyway; this only saves the LLM call.
        """
        self._newest_generation = max(self._newest_generation, generation)
        if self._current is not None and self._current[0] < generation:
            self._current[1].cancel()

    async def run(self) -> None:
        while True:
            await self._mailbox.wait_for_mail()
            batch = self._mailbox.take()
            assert batch is not None
            if batch.generation < self._newest_generation:
                continue
            with anyio.CancelScope() as scope:
                self._current = (batch.generation, scope)
                outcome = await self._summarize_and_store(batch)
            self._current = None
            if not scope.cancelled_caught:
                self._acknowledge(outcome)

    async def _summarize_and_store(self, batch: SummarizeBatch) -> SummaryStored | SummaryFailed:
        attempts = 1  # the try that raised, if with_retries itself raises (it counts them)

        async def call() -> str:
            # A slot per call: none is held through a backoff sleep. Taken at once when one is
            # free: acquire() would first yield to the loop twice, on every summarizer call.
            await anyio.lowlevel.checkpoint_if_cancelled()  # (what acquire() checks first; it does not yield)
            try:
                self._limiter.acquire_nowait()
            except anyio.WouldBlock:
                await self._limiter.acquire()
            try:
                return await self._summarize(batch)
            finally:
                self._limiter.release()

        def before_sleep(attempt: int, error: Exception, seconds: float) -> None:
            nonlocal attempts
            attempts = attempt + 1
            self._log_retry(attempt, error, seconds)

        try:
            config = self._config
            summary, attempts = await with_retries(
                call, config.summarize_attempts, config.summarize_backoff, config.summarize_backoff_max, before_sleep
            )
            stored = await self._store.store_summary(
                self._session_id,
                batch.token,
                batch.generation,
                batch.through_seq,
                summary,
                awaited=self._awaited(),
                backlog=batch.more,
            )
        except (LeaseLostError, UncertainCommitError) as exc:
            # Not a failure to retry: the session reloads (another process may own it now).
            log.warning("session %r: summary up to seq %d not stored: %s", self._session_id, batch.through_seq, exc)
            return SummaryFailed(batch.generation, batch.through_seq, exc, attempts)
        except Exception as exc:
            log.error(
                "session %r: summarizing episodes up to seq %d failed after %d attempt(s): %s; "
                "they stay pending and are retried in %ss",
                self._session_id,
                batch.through_seq,
                attempts,
                error_label(exc),  # its text may quote the episodes: privacy/error_text.py
                self._config.summarize_retry_later,
            )
            log_content("session %r: the last summarizer failure", self._session_id, error=exc)
            return SummaryFailed(batch.generation, batch.through_seq, exc, attempts)
        return SummaryStored(batch.generation, batch.through_seq, summary, stored)

    async def _summarize(self, batch: SummarizeBatch) -> str:
        """One summarizer call, bounded by ``summarize_timeout``; its answer made storable, or SummaryError."""
        with self._telemetry.operation("memengine.summarize", "summarize", self._session_id) as traced:
            traced.count(len(batch.episodes))
            summary = await self._summarize_untraced(batch)
            traced.content("memengine.summary", lambda: summary)
            return summary

    async def _summarize_untraced(self, batch: SummarizeBatch) -> str:
        with anyio.fail_after(self._config.summarize_timeout):
            # An image's base64 means nothing to the summarizer: it reads "[image/png, 150 KB]" instead.
            pending = self._summarizer.summarize(batch.previous, for_summarizer(batch.episodes))
            if not inspect.isawaitable(pending):
                raise SummaryError(
                    f"summarize() returned {type(pending).__name__}, not an awaitable: make it `async def summarize`"
                )
            summary = await pending
        if not isinstance(summary, str) or not storable(summary).strip():
            raise SummaryError(f"the summarizer returned {summary!r}, not a non-empty string")
        return storable(summary)

    def _log_retry(self, attempt: int, error: Exception, seconds: float) -> None:
        log.warning(
            "session %r: summarizer attempt %d failed (%s); retrying in %.2fs",
            self._session_id,
            attempt,
            error_label(error),
            seconds,
        )
        log_content("session %r: summarizer attempt %d failed", self._session_id, attempt, error=error)


def storable(summary: str) -> str:
    """The summary as every store can hold it: no NUL (PostgreSQL text refuses it), no lone surrogates (not UTF-8).

    A model that emits such characters has still summarized; they are cleaned
    (NUL dropped, a surrogate replaced by U+FFFD) rather than failing the
    batch, which would then be retried for ever.
    """
    if "\x00" in summary:
        summary = summary.replace("\x00", "")
    try:
        summary.encode("utf-8")
    except UnicodeEncodeError:
        summary = "".join("\ufffd" if 0xD800 <= ord(char) <= 0xDFFF else char for char in summary)
    return summary
