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
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel
import attrs

from ..actor.mailbox import Mailbox
from ..attachments import for_summarizer
from ..config import SessionConfig
from ..episode import Episode, stored_episode
from ..errors import LeaseLostError, SummaryError, UncertainCommitError
from ..privacy.error_text import error_label, log_content
from ..retrying import with_retries
from ..session.messages import SummaryFailed, SummaryStored
from ..store.base import Composed, Store
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
    ``segment``: the session is segmented (store/segments.py): the batch is
    summarized on its own (``previous`` is None) and stored as a new leaf.
    """

    generation: int
    previous: str | None
    episodes: tuple[Episode, ...]
    token: int
    more: bool = False
    segment: bool = False

    @property
    def through_seq(self) -> int:
        seq = self.episodes[-1].seq
        assert seq is not None
        return seq


@attrs.frozen
class RepairSegments:
    """Make and store the next node a segmented session's summary needs: a hole first, then a fold.

    Valid only while the session is at ``generation``; stored only while ``token`` holds its lease.
    """

    generation: int
    token: int


#: The role a summary has when a summarizer without ``fold`` is given it as an episode, to merge two summaries.
FOLD_ROLE = "summary"


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
        count_tokens: Callable[[str], int] = len,
    ) -> None:
        self._session_id = session_id
        self._summarizer = summarizer
        self._store = store
        self._config = config
        self._limiter = limiter
        self._acknowledge = acknowledge
        #: Whether a read waits for the session's next summary (then it is committed at once, not riding along).
        self._awaited = awaited
        #: The session's tokenizer: a segmented session's repairs keep within ``summarize_input_max_tokens`` too.
        self._count_tokens = count_tokens
        self._telemetry = telemetry
        self._mailbox: Mailbox[SummarizeBatch | RepairSegments] = Mailbox()
        self._newest_generation = 0
        self._current: tuple[int, anyio.CancelScope] | None = None

    def submit(self, batch: SummarizeBatch | RepairSegments) -> None:
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

    async def _summarize_and_store(self, batch: SummarizeBatch | RepairSegments) -> SummaryStored | SummaryFailed:
        attempts = [1]  # the try that raised, if with_retries itself raises (it counts them)
        through_seq = batch.through_seq if isinstance(batch, SummarizeBatch) else 0
        first_seq: int | None = None
        try:
            if isinstance(batch, RepairSegments):
                return await self._repair(batch, attempts)
            summary = await self._with_retries(lambda: self._summarize(batch.previous, batch.episodes), attempts)
            if batch.segment:
                composed = await self._store.store_segment_leaf(
                    self._session_id,
                    batch.token,
                    batch.generation,
                    batch.through_seq,
                    summary,
                    awaited=self._awaited(),
                    backlog=batch.more,
                )
                return _from_composed(batch.generation, composed)
            stored = await self._store.store_summary(
                self._session_id,
                batch.token,
                batch.generation,
                batch.through_seq,
                summary,
                awaited=self._awaited(),
                backlog=batch.more,
            )
        except _Failed as failed:
            first_seq, through_seq = failed.first_seq, failed.through_seq
            exc = failed.error
        except Exception as exc_:
            exc = exc_
        else:
            return SummaryStored(batch.generation, batch.through_seq, summary, stored)
        if isinstance(exc, (LeaseLostError, UncertainCommitError)):
            # Not a failure to retry: the session reloads (another process may own it now).
            log.warning("session %r: summary up to seq %d not stored: %s", self._session_id, through_seq, exc)
            return SummaryFailed(batch.generation, through_seq, exc, attempts[0], first_seq)
        log.error(
            "session %r: summarizing episodes up to seq %d failed after %d attempt(s): %s; "
            "they stay pending and are retried in %ss",
            self._session_id,
            through_seq,
            attempts[0],
            error_label(exc),  # its text may quote the episodes: privacy/error_text.py
            self._config.summarize_retry_later,
        )
        log_content("session %r: the last summarizer failure", self._session_id, error=exc)
        return SummaryFailed(batch.generation, through_seq, exc, attempts[0], first_seq)

    async def _repair(self, batch: RepairSegments, attempts: list[int]) -> SummaryStored:
        """Make the node the segmented session needs next (store/segments.py), and store it."""
        found = await self._store.segment_repair(self._session_id)
        if found is None:  # not segmented (any more: cleared since, so this generation is stale)
            return SummaryStored(batch.generation, 0, None, False)
        if isinstance(found, Composed):  # nothing due: the summary as it is
            return _from_composed(batch.generation, found)
        try:
            if found.parts is None:
                summary = await self._summarize_leaf(found.episodes, attempts)
            else:
                summary = await self._fold(found.parts, attempts)
            composed = await self._store.store_segment_node(
                self._session_id,
                batch.token,
                batch.generation,
                found.level,
                found.index,
                summary,
                awaited=self._awaited(),
            )
        except Exception as exc:
            raise _Failed(found.first_seq, found.through_seq, exc) from exc
        return _from_composed(batch.generation, composed)

    async def _summarize_leaf(self, episodes: tuple[Episode, ...], attempts: list[int]) -> str:
        """A stale leaf's live episodes summarized on their own ("" if none are left), within the input bounds.

        A leaf was one batch, so it most often takes one call; one that does
        not fit (its episodes were cut for the summarizer when it was made) is
        summarized in calls of the usual shape: the episodes get at least half
        of the bound, the summary so far what they leave, cut if longer.
        """
        config = self._config
        max_chars, max_tokens = config.summarize_input_max_chars, config.summarize_input_max_tokens
        count = self._count_tokens
        tokens = [0] * len(episodes)
        if max_tokens is not None:  # counted off the event loop: a leaf may hold large tool outputs
            tokens = await anyio.to_thread.run_sync(lambda: [count(e.content) for e in episodes])
        summary: str | None = None
        start = 0
        while start < len(episodes):
            # The first call has no summary so far: its episodes get the whole bound, later ones half.
            share_chars = max_chars if summary is None else max(max_chars // 2, 1)
            share_tokens = None if max_tokens is None else (max_tokens if summary is None else max(max_tokens // 2, 1))
            end, chars, used_tokens = start, 0, 0
            while end < len(episodes) and end - start < config.summarize_batch_max:
                size, weight = len(episodes[end].content), tokens[end]
                fits = chars + size <= share_chars and (share_tokens is None or used_tokens + weight <= share_tokens)
                if not fits and end > start:
                    break
                end, chars, used_tokens = end + 1, chars + size, used_tokens + weight
            chunk = [
                _cut(episode, tokens[start + number], share_chars, share_tokens)
                for number, episode in enumerate(episodes[start:end])
            ]
            chars = sum(len(episode.content) for episode in chunk)  # (as cut)
            if share_tokens is not None and any(
                cut is not whole for cut, whole in zip(chunk, episodes[start:end], strict=True)
            ):
                used_tokens = await anyio.to_thread.run_sync(lambda: sum([count(e.content) for e in chunk]))  # noqa: B023
            previous = None if summary is None else self._fit(summary, max_chars - chars, max_tokens, used_tokens)
            summary = await self._with_retries(lambda: self._summarize(previous, chunk), attempts)  # noqa: B023
            start = end
        return summary or ""

    async def _fold(self, parts: tuple[str, str], attempts: list[int]) -> str:
        """Two neighbouring summaries merged into one (an empty one adds nothing: no call), within the input bounds.

        Each gets half of ``summarize_input_max_chars`` (and of
        ``summarize_input_max_tokens``), cut in the middle, saying so, if longer.
        """
        first, second = parts
        if not first or not second:
            return first or second
        config = self._config
        half_tokens = None if config.summarize_input_max_tokens is None else config.summarize_input_max_tokens // 2
        first, second = (
            self._fit(part, config.summarize_input_max_chars // 2, half_tokens, 0) for part in (first, second)
        )
        return await self._with_retries(lambda: self._summarize_pair(first, second), attempts)

    def _fit(self, summary: str, room_chars: int, max_tokens: int | None, used_tokens: int) -> str:
        """``summary`` within ``room_chars`` characters (and ``max_tokens - used_tokens`` tokens): whole, or cut."""
        room_tokens = None if max_tokens is None else max(max_tokens - used_tokens, 0)
        tokens = None if room_tokens is None else self._count_tokens(summary)
        cut = fit_summary(summary, tokens, room_chars, room_tokens, self._count_tokens)
        if cut is summary:
            return summary
        log.warning(
            "session %r: a summary of %d characters does not fit its share of a summarizer call "
            "(summarize_input_max_chars=%d, summarize_input_max_tokens=%s); it is given cut, its middle left out "
            "and marked: the summarizer should write shorter summaries",
            self._session_id,
            len(summary),
            self._config.summarize_input_max_chars,
            max_tokens,
        )
        return cut

    async def _with_retries(self, make: Callable[[], Awaitable[str]], attempts: list[int]) -> str:
        async def call() -> str:
            # A slot per call: none is held through a backoff sleep. Taken at once when one is
            # free: acquire() would first yield to the loop twice, on every summarizer call.
            await anyio.lowlevel.checkpoint_if_cancelled()  # (what acquire() checks first; it does not yield)
            try:
                self._limiter.acquire_nowait()
            except anyio.WouldBlock:
                await self._limiter.acquire()
            try:
                return await make()
            finally:
                self._limiter.release()

        def before_sleep(attempt: int, error: Exception, seconds: float) -> None:
            attempts[0] = attempt + 1
            self._log_retry(attempt, error, seconds)

        config = self._config
        summary, attempts[0] = await with_retries(
            call, config.summarize_attempts, config.summarize_backoff, config.summarize_backoff_max, before_sleep
        )
        return summary

    async def _summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        """One summarizer call, bounded by ``summarize_timeout``; its answer made storable, or SummaryError."""
        with self._telemetry.operation("memengine.summarize", "summarize", self._session_id) as traced:
            traced.count(len(episodes))
            # An image's base64 means nothing to the summarizer: it reads "[image/png, 150 KB]" instead.
            summary = await self._bounded(
                "summarize", lambda: self._summarizer.summarize(previous, for_summarizer(episodes))
            )
            traced.content("memengine.summary", lambda: summary)
            return summary

    async def _summarize_pair(self, first: str, second: str) -> str:
        """``Summarizer.fold([first, second])`` if it has one; else ``summarize(first, [second as an episode])``."""
        fold = getattr(self._summarizer, "fold", None)
        with self._telemetry.operation("memengine.summarize", "fold", self._session_id) as traced:
            traced.count(2)
            if callable(fold):
                summary = await self._bounded("fold", lambda: fold([first, second]))
            else:
                summary = await self._bounded(
                    "summarize", lambda: self._summarizer.summarize(first, [Episode(FOLD_ROLE, second)])
                )
            traced.content("memengine.summary", lambda: summary)
            return summary

    async def _bounded(self, method: str, start: Callable[[], object]) -> str:
        """``start()``'s answer within ``summarize_timeout``, made storable; SummaryError if it is not a summary."""
        with anyio.fail_after(self._config.summarize_timeout):
            pending = start()
            if not inspect.isawaitable(pending):
                raise SummaryError(
                    f"{method}() returned {type(pending).__name__}, not an awaitable: make it `async def {method}`"
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


class _Failed(Exception):
    """A repair failed: the error, and the seqs of the node it was making (for the report)."""

    def __init__(self, first_seq: int, through_seq: int, error: Exception) -> None:
        super().__init__(first_seq, through_seq, error)
        self.first_seq = first_seq
        self.through_seq = through_seq
        self.error = error


def _from_composed(generation: int, composed: Composed | None) -> SummaryStored:
    if composed is None:
        return SummaryStored(generation, 0, None, False)
    return SummaryStored(generation, composed.through_seq, composed.text, True, composed.state)


#: Appended to an episode's text when the summarizer is given only its beginning.
CUT_MARKER = "\n[memengine: cut here for the summarizer; the episode has {total} characters, {shown} shown]"

#: Put in the middle of a summary too long for its share of a summarizer call, where its middle was.
SUMMARY_CUT_MARKER = (
    "\n[memengine: {left_out} of the previous summary's {total} characters are left out here, "
    "to leave room for the new episodes; write a shorter summary]\n"
)


def cut_summary(text: str, keep: int) -> str:
    """``text`` in at most ``keep`` characters: its beginning and its end, the marker between them."""
    marker = SUMMARY_CUT_MARKER.format(left_out=len(text), total=len(text))  # (its longest form)
    shown = max(keep - len(marker), 0)
    head = shown // 2
    tail = shown - head
    marker = SUMMARY_CUT_MARKER.format(left_out=len(text) - shown, total=len(text))
    return text[:head] + marker + text[len(text) - tail :]


def fit_summary(
    text: str, tokens: int | None, room_chars: int, room_tokens: int | None, count_tokens: Callable[[str], int]
) -> str:
    """``text`` itself if it fits ``room_chars`` characters and ``room_tokens`` tokens, else cut (:func:`cut_summary`).

    ``tokens`` is the text's own count (needed only with ``room_tokens``). A
    text over the token room is cut by its own density, then shorter still
    while the marker's own tokens pass it.
    """
    keep = room_chars
    if room_tokens is not None and tokens is not None and tokens > room_tokens:
        keep = min(keep, len(text) * room_tokens // max(tokens, 1))  # by the summary's own density
    elif len(text) <= room_chars:
        return text
    cut = cut_summary(text, keep)
    while room_tokens is not None and keep > 0 and count_tokens(cut) > room_tokens:  # the marker's own tokens
        keep = keep * 9 // 10
        cut = cut_summary(text, keep)
    return cut


def cut_episode(episode: Episode, chars: int, tokens: int, max_chars: int, max_tokens: int | None) -> Episode:
    """The episode as the summarizer sees it: whole, or its beginning and a marker when it exceeds a bound."""
    keep = chars
    if chars > max_chars:
        keep = max_chars
    if max_tokens is not None and tokens > max_tokens:
        keep = min(keep, chars * max_tokens // tokens)  # proportionally, by the episode's own density
    if keep >= chars:
        return episode
    keep = max(keep - 120, 1)  # room for the marker
    content = episode.content[:keep] + CUT_MARKER.format(total=chars, shown=keep)
    return stored_episode(
        episode.role,
        content,
        episode.id,
        episode.created_at,
        episode.metadata,
        episode.seq,  # type: ignore[arg-type]
    )


def _cut(episode: Episode, tokens: int, max_chars: int, max_tokens: int | None) -> Episode:
    return cut_episode(episode, len(episode.content), tokens, max_chars, max_tokens)
