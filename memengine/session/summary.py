"""The session's rolling summary, and the bookkeeping of its summarizer child.

Evicted episodes go to the child in batches (one batch in flight; everything
evicted meanwhile goes into the next call). A batch holds at most
``summarize_batch_max`` episodes and, with the previous summary, at most
``summarize_input_max_chars`` characters (and ``summarize_input_max_tokens``
tokens, if set); it never ends between a tool call and its results. The
episodes get what the previous summary leaves of that bound, and at least
half of it: a summary that outgrew what they leave is given to the call with
its middle cut out and a marker saying so (logged; the summarizer should
write a shorter one), so a growing summary never crowds the episodes out. An
episode too large for the episodes' share on its own is given to the
summarizer cut, with a marker saying so; the store keeps it whole.
They stay visible raw until the child acknowledges a *stored* summary. The
generation (changed by clear and delete) fences off work computed before it:
the store refuses such a summary, and its acknowledgement is ignored here.
After the child gave up on a batch (a failed round), it is tried again
``summarize_retry_later`` seconds later. After ``summarize_set_aside_after``
failed rounds in a row the batch is set aside (recorded in the store by the
session, see store/set_aside.py): nothing more is summarized for the session,
since summaries cover the episodes in order, until a retry lifts the mark.
Its episodes, and those evicted after them, stay stored and shown raw.
The actor's handlers for the child's reports, and the set-aside mark's
store side, are in summary_results.py.
"""

from __future__ import annotations

import logging

from ..config import SessionConfig
from ..context import handed_out
from ..episode import Episode
from ..errors import StoreError
from ..store import segments
from ..store.base import SegmentState, SessionSnapshot, SetAside
from ..summarizer.actor import (
    RepairSegments,
    SummarizeBatch,
    SummarizerActor,
    cut_episode,
    fit_summary,
)
from ..tokens import Tokenizer
from .messages import SummaryFailed, SummaryStored
from .window import RawWindow

log = logging.getLogger("memengine.session")


class SessionSummary:
    def __init__(
        self, child: SummarizerActor, config: SessionConfig, count_tokens: Tokenizer, session_id: str = ""
    ) -> None:
        self._session_id = session_id
        self._summary_cut_logged = False  # warned once per activation, then at debug level
        self._child = child
        self._config = config
        self._count_tokens = count_tokens
        self._tokens: int | None = 0  # the current summary's tokens; None until first asked for (see tokens)
        #: Changes on every clear/delete; a summary computed under an older one never lands.
        self.generation = 0
        self.text: str | None = None
        #: The summary covers every live episode up to this seq.
        self.through = 0
        self._in_flight = False
        #: When a batch the child gave up on is tried again (this process's clock), if one is.
        self.retry_at: float | None = None
        #: The batch set aside after too many failed rounds, if one is: nothing is dispatched meanwhile.
        self.set_aside: SetAside | None = None
        #: Failed rounds in a row (and the summarizer calls they made) since the last stored summary.
        self.failed_rounds = 0
        self.failed_attempts = 0
        #: A segmented session's holes and due folds (store/segments.py); None while it is not segmented.
        self.segments: SegmentState | None = None
        self._compact: tuple[str | None, str | None, int] | None = None  # (the summary, compacted, its tokens)

    @property
    def tokens(self) -> int:
        """Tokens of the current summary: counted once per summary, when first needed (a read, a token bound)."""
        if self._tokens is None:
            self._tokens = self._count(self.text)
        return self._tokens

    @property
    def busy(self) -> bool:
        """A summary is being computed or waits to be tried again (a batch set aside waits for nothing)."""
        return self._in_flight or self.retry_at is not None

    @property
    def rounds_exhausted(self) -> bool:
        """Whether the batch just given up on has failed ``summarize_set_aside_after`` rounds in a row."""
        limit = self._config.summarize_set_aside_after
        return limit is not None and self.failed_rounds >= limit

    def put_aside(self, record: SetAside) -> None:
        """The batch given up on is set aside (recorded in the store): no more tries until :meth:`retry_now`."""
        self.set_aside = record
        self.retry_at = None

    def retry_now(self) -> bool:
        """Lift a set-aside batch (or a wait for the next round): try at once. True if one was set aside."""
        was_set_aside = self.set_aside is not None
        self.set_aside = None
        self.retry_at = None
        self.failed_rounds = self.failed_attempts = 0
        return was_set_aside

    def adopt(self, snapshot: SessionSnapshot) -> None:
        """The store's view, after activation, clear or delete: nothing in flight counts any more."""
        self._child.abandon_before(snapshot.generation)
        self.generation = snapshot.generation
        self.text = snapshot.summary
        self._tokens = None
        self.through = snapshot.summarized_through
        self._in_flight = False
        self.retry_at = None
        self.set_aside = snapshot.summary_set_aside
        self.failed_rounds = self.failed_attempts = 0
        self.segments = snapshot.segments

    @property
    def holes(self) -> tuple[tuple[int, int], ...]:
        """Ranges of a segmented session's summary being summarized again after a delete (shown in it as said)."""
        return () if self.segments is None else self.segments.holes

    def compact(self) -> tuple[str | None, int]:
        """The summary without its holes' episodes (each said left out in one line), and its tokens.

        What a read over its token ceiling gets (store/segments.py); counted
        once per summary.
        """
        if self._compact is None or self._compact[0] is not self.text:
            text = None if self.text is None else segments.compact(self.text)
            self._compact = (self.text, text, self._count(text))
        return self._compact[1], self._compact[2]

    def dispatch(self, window: RawWindow, token: int) -> None:
        """Hand the child its next work, unless some is already in flight or waiting.

        A segmented session's holes come first (their episodes are shown in
        the summary as they were said meanwhile), then the oldest pending episodes, then
        its folds; a fold goes ahead of pending episodes when the summary has
        grown a few parts beyond its folded shape (store/segments.py), so a
        backlog never makes it a part per batch.
        """
        if self.busy or self.set_aside is not None:
            return
        segments = self.segments
        if segments is not None and (
            segments.holes or (segments.folds_due and (segments.folds_first or not window.evicted))
        ):
            self._child.submit(RepairSegments(self.generation, token))
            self._in_flight = True
            return
        if not window.evicted:
            return
        config = self._config
        # A session summarized from its start (no rolling summary to keep) is segmented, once it is on.
        segmented = segments is not None or (config.segment_summaries and self.through == 0)
        # The episodes get what the previous summary leaves of the input bound, and at least half
        # of it: a summary that outgrew the bound is cut for the call (below), never the episodes.
        input_chars = config.summarize_input_max_chars
        input_tokens = config.summarize_input_max_tokens
        if segmented:  # a leaf is summarized on its own: the episodes get the whole bound
            max_chars, max_tokens = input_chars, input_tokens
        else:
            max_chars = max(input_chars - len(self.text or ""), input_chars // 2, 1)
            max_tokens = None if input_tokens is None else max(input_tokens - self.tokens, input_tokens // 2, 1)

        def fits(episodes: int, chars: int, tokens: int) -> bool:
            return chars <= max_chars and (max_tokens is None or tokens <= max_tokens)

        end = window.batch_end(config.summarize_batch_max, fits)
        pending, sizes = window.pending[:end], window.sizes(end)
        if max([chars for chars, _ in sizes]) <= max_chars and (
            max_tokens is None or max([tokens for _, tokens in sizes]) <= max_tokens
        ):
            batch = tuple(pending)  # (the usual case: no episode needs cutting)
            batch_chars = sum([chars for chars, _ in sizes])
            batch_tokens = sum([tokens for _, tokens in sizes])
        else:
            batch = tuple(
                cut_episode(episode, chars, tokens, max_chars, max_tokens)
                for episode, (chars, tokens) in zip(pending, sizes, strict=True)
            )
            batch_chars = sum([len(episode.content) for episode in batch])
            batch_tokens = 0 if max_tokens is None else sum([self._count_tokens(e.content) for e in batch])
        previous = None
        if not segmented:
            previous = self._previous_for(batch, input_chars - batch_chars, input_tokens, batch_tokens)
        # The summarizer is the user's code: it gets copies, so nothing it does changes the window.
        more = end < window.evicted  # a backlog: this summary waits only briefly for a write to ride with
        self._child.submit(SummarizeBatch(self.generation, previous, handed_out(batch), token, more, segmented))
        self._in_flight = True

    def _previous_for(
        self, batch: tuple[Episode, ...], room_chars: int, input_tokens: int | None, batch_tokens: int
    ) -> str | None:
        """The previous summary as the call gets it: whole if it fits beside ``batch``, else cut, saying so."""
        text = self.text
        if text is None:
            return None
        room_tokens = None if input_tokens is None else input_tokens - batch_tokens
        tokens = None if room_tokens is None else self.tokens  # (counted only for a token room)
        cut = fit_summary(text, tokens, room_chars, room_tokens, self._count_tokens)
        if cut is text:
            return text
        log.log(
            logging.DEBUG if self._summary_cut_logged else logging.WARNING,
            "session %r: the previous summary (%d characters) does not fit beside the %d episode(s) of this "
            "summarizer call (summarize_input_max_chars=%d, summarize_input_max_tokens=%s); it is given cut, "
            "its middle left out and marked: the summarizer should write shorter summaries",
            self._session_id,
            len(text),
            len(batch),
            self._config.summarize_input_max_chars,
            input_tokens,
        )
        self._summary_cut_logged = True
        return cut

    def stored(self, message: SummaryStored, window: RawWindow, now: float) -> bool:
        """The child's acknowledgement; True if the summary now covers more of the window."""
        if message.generation != self.generation:
            return False  # computed before a clear/delete; the store refused it too
        self._in_flight = False
        if not message.stored:
            # Same generation yet refused: another writer changed the session.
            self.retry_at = now + self._config.summarize_retry_later
            return False
        self.failed_rounds = self.failed_attempts = 0
        if message.segments is not None:
            covered_more = message.segments.holes != self.holes or message.through_seq > self.through
            self.segments = message.segments
        else:
            covered_more = True
        window.drop_through(message.through_seq)
        self.text = message.summary
        self._tokens = None
        self.through = message.through_seq
        return covered_more

    def failed(self, message: SummaryFailed, now: float) -> bool:
        """The child gave up on a batch for now; True if it was this generation's (then retried later)."""
        if message.generation != self.generation:
            return False
        self._in_flight = False
        self.retry_at = now + self._config.summarize_retry_later
        if not isinstance(message.error, StoreError):  # the store failing is no fault of the batch
            self.failed_rounds += 1
            self.failed_attempts += message.attempts
        return True

    def retry_due(self, now: float) -> bool:
        """Whether a batch given up on is due again (then it may be dispatched)."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True

    def _count(self, summary: str | None) -> int:
        return 0 if summary is None else self._count_tokens(summary)
