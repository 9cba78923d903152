"""The session's rolling summary, and the bookkeeping of its summarizer child.

Evicted episodes go to the child in batches (at most ``summarize_batch_max``,
one batch in flight; everything evicted meanwhile goes into the next call).
They stay visible raw until the child acknowledges a *stored* summary. The
generation (changed by clear and delete) fences off work computed before it:
the store refuses such a summary, and its acknowledgement is ignored here.
After the child gave up on a batch, it is tried again
``summarize_retry_later`` seconds later.
"""

from __future__ import annotations

from ..config import SessionConfig
from ..store.base import SessionSnapshot
from ..summarizer.actor import SummarizeBatch, SummarizerActor
from .messages import SummaryFailed, SummaryStored
from .window import RawWindow


class SessionSummary:
    def __init__(self, child: SummarizerActor, config: SessionConfig) -> None:
        self._child = child
        self._config = config
        #: Changes on every clear/delete; a summary computed under an older one never lands.
        self.generation = 0
        self.text: str | None = None
        #: The summary covers every live episode up to this seq.
        self.through = 0
        self._in_flight = False
        #: When a batch the child gave up on is tried again (this process's clock), if one is.
        self.retry_at: float | None = None

    @property
    def busy(self) -> bool:
        """A summary is being computed or waits to be tried again."""
        return self._in_flight or self.retry_at is not None

    def adopt(self, snapshot: SessionSnapshot) -> None:
        """The store's view, after activation, clear or delete: nothing in flight counts any more."""
        self._child.abandon_before(snapshot.generation)
        self.generation = snapshot.generation
        self.text = snapshot.summary
        self.through = snapshot.summarized_through
        self._in_flight = False
        self.retry_at = None

    def dispatch(self, window: RawWindow, token: int) -> None:
        """Hand the oldest pending episodes to the child, unless a batch is already in flight or waiting."""
        if not window.evicted or self.busy:
            return
        batch = tuple(window.pending[: self._config.summarize_batch_max])
        self._child.submit(SummarizeBatch(self.generation, self.text, batch, token))
        self._in_flight = True

    def stored(self, message: SummaryStored, window: RawWindow, now: float) -> bool:
        """The child's acknowledgement; True if the summary now covers more of the window."""
        if message.generation != self.generation:
            return False  # computed before a clear/delete; the store refused it too
        self._in_flight = False
        if not message.stored:
            # Same generation yet refused: another writer changed the session.
            self.retry_at = now + self._config.summarize_retry_later
            return False
        window.drop_through(message.through_seq)
        self.text = message.summary
        self.through = message.through_seq
        return True

    def failed(self, message: SummaryFailed, now: float) -> bool:
        """The child gave up on a batch for now; True if it was this generation's (then retried later)."""
        if message.generation != self.generation:
            return False
        self._in_flight = False
        self.retry_at = now + self._config.summarize_retry_later
        return True

    def retry_due(self, now: float) -> bool:
        """Whether a batch given up on is due again (then it may be dispatched)."""
        if self.retry_at is None or now < self.retry_at:
            return False
        self.retry_at = None
        return True
