"""What one activation of a session knows, and how it answers from it.

The state the session actor (actor.py) and its handlers (client_handlers.py)
share: the window and summary adopted from the store, the eviction boundary
kept in the store, the summarizer child's answers, the reads waiting for a
summary, the context a read gets, and giving the session up when memory may
no longer be the store's.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import anyio

from ..actor.mailbox import Mailbox
from ..config import SessionConfig
from ..context import Context, Omitted
from ..errors import EngineClosedError, LeaseLostError
from ..store.base import SessionSnapshot, Store
from ..summarizer.actor import SummarizerActor
from ..tokens import count_large
from .hand_on import HandOn
from .large_entry import LargeEntry
from .lease import SessionLease
from .messages import (
    ClientMessage,
    LeaseLost,
    RetrySummary,
    SessionMessage,
    SummaryFailed,
    SummaryStored,
)
from .recording import MessageRecorder
from .retain_flush import RetainFlush
from .summary import SessionSummary
from .summary_results import SummaryResults
from .waiting_reads import WaitingReads
from .window import RawWindow, Tokenizer

log = logging.getLogger("memengine.session")


class ActivationState:
    """The session's state in memory and the answers made from it; the actor and its handlers are built on it."""

    session_id: str
    mailbox: Mailbox[SessionMessage]
    _config: SessionConfig
    _store: Store
    _recorder: MessageRecorder | None
    _handing_on: HandOn
    _lease: SessionLease
    _child: SummarizerActor
    _count_tokens: Tokenizer
    _summary: SessionSummary
    _retain: RetainFlush | None
    _waiting: WaitingReads
    _context_ceiling: int | None
    _last_seq: int
    _window: RawWindow
    _summary_results: SummaryResults
    _stored_boundary: int
    _given_up: LeaseLostError | None
    _handling: SessionMessage | None
    _idle: bool
    _append_in_flight: bool
    _appends_submitted: int
    _append_settled: anyio.Event | None
    _entering: LargeEntry | None
    _active_since_tick: bool
    _quiet_since: float | None
    _idle_expired: bool
    _close_requested: bool

    def _give_up(self, error: BaseException) -> None:
        """This activation may no longer hold the store's truth (a stale lease, a commit in doubt): stop.

        Takes effect at once: the actor handles nothing more (a handler waiting
        for an append hands its message on), and messages not yet handled go to
        a new activation, which loads the session from the store.
        """
        if self._given_up is not None:
            return
        log.warning("session %r: %s; giving it up (it is loaded again for the next call)", self.session_id, error)
        self._given_up = (
            error
            if isinstance(error, LeaseLostError)
            else LeaseLostError(f"session {self.session_id!r}: this activation gave the session up ({error})")
        )
        self.mailbox.put_if_open(LeaseLost(error))  # wakes the actor if it is idle (unless already stopped)

    # -- the summarizer child's answers --------------------------------------

    def _on_summary_stored(self, message: SummaryStored) -> None:
        if self._summary_results.stored(message):
            self._answer_waiting_reads()
        self._dispatch_summary()

    async def _on_summary_failed(self, message: SummaryFailed) -> None:
        error = await self._summary_results.failed(message)
        if error is not None:
            reads = self._waiting.take_all()
            context = None
            for read in reads:
                if read.wait_for_summary:
                    self._fail(read, error)
                else:  # it waited for room under the ceiling: none is coming soon, so it gets the ceiling's view
                    context = context or self._context()
                    self._answer(read, context)

    async def _count_large(self, snapshot: SessionSnapshot) -> None:
        """Count the large contents the window does not hold yet in a worker thread, for :meth:`_apply`.

        Not on the event loop all sessions share (a 400,000-character tool
        output, a slow tokenizer): at activation, and after a delete that
        deleted a summary (the episodes it covered are raw again).
        """
        self._window.expect(await count_large(self._count_tokens, self._window.uncounted(snapshot.episodes)))

    def _apply(self, snapshot: SessionSnapshot) -> None:
        """Adopt the store's view (after activation, clear or delete)."""
        self._summary.adopt(snapshot)
        self._last_seq = snapshot.last_seq
        self._stored_boundary = snapshot.evicted_through
        self._window.reset(snapshot.episodes, snapshot.evicted_through, snapshot.last_seq)
        self._keep_boundary()
        if self._retain is not None:
            self._retain.adopt(snapshot.retained_through)
        self._dispatch_summary()
        self._answer_waiting_reads()

    def _keep_boundary(self) -> None:
        """Record a moved eviction boundary in the store, so a reload shows the same window.

        It rides along with the next group commit (the next add's, usually),
        not waited for and with no commit of its own: one small row update per
        eviction. If it is lost (a crash before that commit), the next
        activation applies the rules again from the last boundary stored.
        """
        boundary = self._window.evicted_through
        if boundary is None or boundary <= self._stored_boundary:
            return
        self._stored_boundary = boundary
        try:
            self._store.submit_eviction(self.session_id, self._lease.current(), boundary, _eviction_recorded)
        except EngineClosedError:
            pass  # leaving: the next activation applies the rules again

    def _acknowledged_seq(self) -> int:
        return self._last_seq

    def _dispatch_summary(self) -> None:
        self._summary.dispatch(self._window, self._lease.current())

    def _answer_waiting_reads(self) -> None:
        if not self._waiting:
            return
        first_pending: float = self._window.raw[0].seq if self._window.evicted else math.inf  # type: ignore[assignment]
        holes = self._summary.holes
        if holes:  # a segmented session's leaves being summarized again after a delete
            first_pending = min(first_pending, holes[0][0])
        ready = self._waiting.ready(first_pending)
        if ready:
            context = self._context()
            for read in ready:
                self._answer(read, context)
            self._active_since_tick = True  # answering a client is activity

    def _answer(self, message: ClientMessage, value: Any) -> None:
        message.reply.set(value)
        if self._recorder is not None:
            self._recorder.record(self.session_id, message, value, None)

    def _fail(self, message: ClientMessage, error: BaseException) -> None:
        message.reply.fail(error)
        if self._recorder is not None and not isinstance(message, RetrySummary):
            self._recorder.record(self.session_id, message, None, error)

    def _context(self) -> Context:
        window = self._window
        evicted_through = window.evicted_through
        summary, summary_tokens = self._summary.text, self._summary.tokens
        raw, raw_tokens = window.raw, window.tokens
        start, shown_tokens, omitted, note_tokens = 0, raw_tokens, None, 0
        ceiling = self._context_ceiling
        if ceiling is not None and summary_tokens + raw_tokens > ceiling and self._summary.holes:
            # A segmented summary shows its holes' episodes as said (store/segments.py): over the ceiling,
            # they go first, each said left out in one line, before any episode of the window does.
            summary, summary_tokens = self._summary.compact()
        if ceiling is not None and raw and summary_tokens + raw_tokens > ceiling:
            # Past the ceiling (a summarizer lagging behind the evictions): the newest episodes that fit
            # beside the summary and the note saying what is left out (counted at its longest).
            longest = Omitted(raw[-1].seq, raw[-1].seq, len(raw), raw_tokens)  # type: ignore[arg-type]
            room = ceiling - summary_tokens - self._count_tokens(longest.note)
            start, shown_tokens = window.newest_within(max(room, 0))
            if start:
                omitted = Omitted(raw[0].seq, raw[start - 1].seq, start, raw_tokens - shown_tokens)  # type: ignore[arg-type]
                note_tokens = self._count_tokens(omitted.note)
        return Context(
            session_id=self.session_id,
            summary=summary,
            summarized_through=self._summary.through,
            episodes=tuple(raw[start:]) if start else tuple(raw),
            evicted_through=self._summary.through if evicted_through is None else evicted_through,
            tokens=summary_tokens + note_tokens + shown_tokens,
            omitted=omitted,
            resummarizing=self._summary.holes,
        )


def _eviction_recorded(result: object, error: BaseException | None) -> None:
    if error is not None:
        log.info("recording an eviction boundary failed (%s); the next activation applies the rules again", error)
