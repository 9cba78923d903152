"""The session actor: one task owning all of a session's state, one handler per message.

It reads its mailbox and handles one message at a time, in arrival order; a
handler awaits only the store, never the summarizer or a client. Reads are
answered from memory. When the raw window overflows, evicted episodes go to the
summarizer child (see summary.py); they stay visible raw until the child
acknowledges a stored summary.

:meth:`SessionActor._handle` is the one place that maps each message type to
its handler. The client messages (add, read, delete, clear, forget, close,
retry) and the engine's (tick, hand over) are handled here; the actor's
collaborators each keep one concern, and get what they need when made:

- the lease: taken, renewed, checked before reads (lease.py);
- the summarizer child's reports and the set-aside mark (summary_results.py),
  over the summary's bookkeeping (summary.py);
- the reads waiting for a summary (waiting_reads.py);
- the hand-off to the retain outbox, every ``retain_every`` episodes and at a
  boundary (retain_flush.py);
- the adds queued behind the append in flight (add_batch.py).

An activation whose memory may no longer be the store's (its lease was lost,
or a commit is in doubt) gives the session up at once: it answers nothing
more, and the messages it had not handled go to a new activation, which loads
the session from the store (hand_on.py).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import anyio
import attrs

from ..actor.mailbox import Mailbox
from ..config import SessionConfig
from ..context import Context, Omitted, handed_out
from ..episode import Episode
from ..errors import EngineClosedError, LeaseLostError, MemEngineError, SessionBusyError, StoreError
from ..store.base import AppendResult, SessionSnapshot, Store
from ..summarizer.actor import SummarizerActor
from ..summarizer.protocol import Summarizer
from ..telemetry import NO_TELEMETRY, Telemetry
from ..tokens import count_large
from .add_batch import AddBatch
from .hand_on import HandOn, NotHandled
from .large_entry import LargeEntry, is_large
from .lease import SessionLease, means_reload
from .messages import (
    AddEpisodes,
    ClearSession,
    ClientMessage,
    CloseSession,
    DeleteEpisodes,
    EnterStored,
    ForgetSession,
    HandOver,
    LeaseLost,
    ReadContext,
    RetrySummary,
    SessionMessage,
    SummaryFailed,
    SummaryStored,
    Tick,
)
from .recording import MessageRecorder
from .retain_flush import RetainFlush, RetainPlan
from .summary import SessionSummary
from .summary_results import SummaryResults, set_aside_error
from .waiting_reads import WaitingReads
from .window import Budget, RawWindow, tokenizer_of

log = logging.getLogger("memengine.session")


@attrs.frozen
class SessionServices:
    """What every session actor of one engine shares."""

    store: Store
    summarizer: Summarizer
    config: SessionConfig
    summary_slots: anyio.CapacityLimiter
    retain: RetainPlan | None = None
    recorder: MessageRecorder | None = None
    telemetry: Telemetry = NO_TELEMETRY


class SessionActor:
    def __init__(
        self,
        session_id: str,
        services: SessionServices,
        on_stop: Callable[[SessionActor], None],
        hand_on: Callable[[str, ClientMessage], None] | None = None,
    ) -> None:
        self.session_id = session_id
        config = services.config
        self._config = config
        self.mailbox: Mailbox[SessionMessage] = Mailbox(config.mailbox_capacity)
        self._store = services.store
        self._recorder = services.recorder
        self._on_stop = on_stop
        self._handing_on = HandOn(session_id, self.mailbox, hand_on)
        self._lease = SessionLease(session_id, services.store, config)
        self._child = SummarizerActor(
            session_id,
            services.summarizer,
            services.store,
            config,
            services.summary_slots,
            self._summary_answered,
            services.telemetry,
        )
        self._count_tokens = tokenizer_of(config, session_id)
        self._summary = SessionSummary(self._child, config, self._count_tokens, session_id)
        self._retain = (
            None
            if services.retain is None
            else RetainFlush(
                session_id, services.store, services.retain, self._acknowledged_seq, self._lease.current, self._give_up
            )
        )
        self._waiting = WaitingReads()
        self._context_ceiling = config.context_ceiling
        # State, recovered from the store on activation.
        self._last_seq = 0
        self._window = RawWindow(
            Budget(config.max_episodes, config.max_chars, config.max_tokens),
            config.evict_to,
            self._count_tokens,
            config.tool_clipping,
        )
        self._summary_results = SummaryResults(
            session_id, services.store, config, self._summary, self._window, self._lease, self._give_up
        )
        self._stored_boundary = 0  # the eviction boundary the store holds (see _keep_boundary)
        # Set once this activation may no longer hold the store's truth.
        self._given_up: LeaseLostError | None = None
        self._handling: SessionMessage | None = None
        self._idle = False  # waiting for mail: an add may then be handled in its sender's task (receive)
        self._append_in_flight = False
        self._append_settled: anyio.Event | None = None  # made only when a handler must wait for it
        self._entering: LargeEntry | None = None  # a large append stored, entering the window (large_entry.py)
        # Passivation: decided from the engine's ticks, so the hot path reads no clock.
        self._active_since_tick = True
        self._quiet_since: float | None = None
        self._idle_expired = False
        self._close_requested = False

    # -- what the engine sees --------------------------------------------------

    @property
    def token(self) -> int | None:
        """The lease's fencing token once activated."""
        return self._lease.token

    @property
    def episodes_waiting_for_summary(self) -> int:
        """Evicted episodes that no stored summary covers yet."""
        return self._window.evicted

    def lease_renewed(self, asked_at: float) -> None:
        self._lease.renewed(asked_at)

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        stop_error: MemEngineError = EngineClosedError("the engine closed before answering")
        try:
            try:
                snapshot = await self._lease.activate()
            except (SessionBusyError, StoreError) as error:
                stop_error = error  # every message sent meanwhile is told
                return
            await self._count_large(snapshot)
            async with anyio.create_task_group() as children:
                children.start_soon(self._child.run)
                self._apply(snapshot)
                await self._serve()
                if self._given_up is not None:
                    stop_error = self._given_up
                self._stop(stop_error)  # passivating: leave the registry before any await
                children.cancel_scope.cancel()
            if self._given_up is None:
                await self._lease.release()
        finally:
            # Whatever ended the activation (passivation, shutdown, a bug), no
            # caller is left waiting on it.
            self._stop(stop_error)

    def _summary_answered(self, message: SummaryStored | SummaryFailed) -> None:
        """The summarizer child's answer, queued for the actor; dropped if this activation has stopped.

        The child may finish a batch in the same moment the activation stops
        (its task was ready to run when the actor closed the mailbox, before
        the cancellation reached it). Nothing is lost: a stored summary is in
        the store, where the next activation loads it from.
        """
        if not self.mailbox.put_if_open(message):
            log.debug("session %r: a summarizer answer arrived after the activation stopped", self.session_id)

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

    def _stop(self, error: MemEngineError) -> None:
        """Leave the engine's registry and fail whatever was never answered.

        Runs synchronously right after the actor decided to stop, so no message
        can reach this activation after the decision. Calling it again does nothing.
        """
        self._on_stop(self)
        entering, self._entering = self._entering, None
        if entering is not None:
            entering.answer(self._answer)  # stored: its callers are answered, whatever the window became
        unanswered: list[Any] = [*self._handing_on.take_kept(), *self._waiting.take_all(), *self.mailbox.close()]
        if self._given_up is not None:
            # Given up, not failed: what this activation never handled, a new one handles.
            unanswered = self._handing_on.pass_to_next(unanswered)
        if self._handling is not None:  # cancelled mid-handler
            unanswered.append(self._handling)
            self._handling = None
        for message in unanswered:
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply.fail(error)

    async def _serve(self) -> None:
        while self._given_up is None:
            if self._summary.retry_at is not None and self._summary.retry_due(anyio.current_time()):
                self._dispatch_summary()
            message = self.mailbox.take()
            if message is not None:
                self._handling = message
                await self._handle(message)
                self._handling = None
            elif self._may_passivate():
                if self._retain is not None and self._retain.has_unretained():
                    # A boundary: hand on the partial batch first.
                    if not await self._retain.flush_before_passivating():
                        if self._given_up is not None:
                            return
                        self._idle_expired = self._close_requested = False  # stay active, try again later
                    continue  # messages may have arrived meanwhile
                return  # no await since take(): nothing can have arrived
            else:
                await self._idle_until_mail()

    async def _idle_until_mail(self) -> None:
        """Wait for a message (or the summary's retry time); an add may meanwhile be handled at once (receive)."""
        self._idle = True
        try:
            if self._summary.retry_at is None:
                await self.mailbox.wait_for_mail()
            else:
                with anyio.CancelScope(deadline=self._summary.retry_at):
                    await self.mailbox.wait_for_mail()
        finally:
            self._idle = False

    def receive(self, message: ClientMessage) -> None:
        """Take a client's message (the caller checked that the mailbox has room).

        An add that reaches an idle actor (waiting for mail, nothing queued, no
        append in flight) is handled here and now, in the sender's task,
        exactly as the actor would handle it on waking: nothing can be ahead of
        it, and submitting an append never waits (its completion answers the
        caller, as for any add). That saves each add a task switch. Every
        other message, and an add in any other state, goes to the mailbox.
        """
        if type(message) is AddEpisodes and self._idle and self.mailbox.empty:
            if not self._append_in_flight and self._given_up is None:
                self._client_activity()
                try:
                    self._submit_add(message)
                except Exception as exc:
                    self._handler_failed(message, exc)
                return
        self.mailbox.send_now(message)

    def _may_passivate(self) -> bool:
        if not (self._close_requested or self._idle_expired):
            return False
        retain_busy = self._retain is not None and self._retain.busy
        return not (self._summary.busy or self._waiting or self._append_in_flight or retain_busy)

    # -- message handlers ----------------------------------------------------

    async def _handle(self, message: SessionMessage) -> None:
        match message:
            case SummaryStored():
                self._on_summary_stored(message)
                return
            case SummaryFailed():
                await self._on_summary_failed(message)
                return
            case Tick():
                await self._on_tick(message)
                return
            case HandOver():
                self._on_hand_over()
                return
            case LeaseLost():
                self._give_up(message.error)
                return
            case EnterStored():
                await self._enter_stored()
                return
        self._client_activity()
        try:
            match message:
                case AddEpisodes():
                    await self._on_add(message)
                case ReadContext():
                    await self._on_read(message)
                case DeleteEpisodes():
                    await self._on_delete(message)
                case ClearSession():
                    await self._on_clear(message)
                case ForgetSession():
                    await self._on_forget(message)
                case CloseSession():
                    await self._on_close(message)
                case RetrySummary():
                    await self._on_retry_summary(message)
                case _:
                    _unhandled(message)
        except NotHandled:
            self._handing_on.keep(message)
        except Exception as exc:
            self._handler_failed(message, exc)

    def _client_activity(self) -> None:
        self._active_since_tick = True
        self._idle_expired = False
        self._close_requested = False

    def _handler_failed(self, message: ClientMessage, exc: Exception) -> None:
        # The operation failed (the store rolled it back, or its outcome is in doubt): tell its caller.
        if means_reload(exc):
            self._give_up(exc)
            if self._handing_on.keep_if_abandoned(message):
                return
        self._fail(message, exc)

    async def _on_add(self, message: AddEpisodes) -> None:
        # The handler does not wait for the commit, so the actor goes on with
        # its mailbox; a second append waits for the first, whose seqs it follows.
        if self._append_in_flight or self._given_up is not None:  # (the usual add skips a coroutine)
            await self._settle_append()
        self._submit_add(message)

    def _submit_add(self, message: AddEpisodes) -> None:
        """Submit ``message``, and the adds queued right behind it, as one append (no append is in flight)."""
        # No await here: the adds taken out of the mailbox are owned by the append's completion.
        batch = AddBatch.gather(message, self.mailbox)
        counted = batch.counted
        if counted:
            self._window.expect(counted)  # large contents, counted by their callers off the event loop
        try:
            self._store.submit_append(
                self.session_id,
                self._lease.current(),
                self._last_seq + 1,
                batch.episodes,
                functools.partial(self._appended, batch),
            )
        except Exception as exc:
            for joined in batch.messages[1:]:  # the first is failed by the caller, _handle
                self._fail(joined, exc)
            raise
        self._append_in_flight = True  # only once submitted: a refused submit leaves nothing in flight

    def _appended(self, batch: AddBatch, results: AppendResult | None, error: BaseException | None) -> None:
        """Completion of an append, run by the store on the event loop right after its commit.

        It is this actor's code, run synchronously between two of the actor's
        own steps (all on one event loop), and no other append of this session
        is in flight; the callers are answered only now that their rows are stored.
        """
        self._append_in_flight = False
        settled, self._append_settled = self._append_settled, None
        if settled is not None:
            settled.set()
        if error is not None or results is None:
            reload = means_reload(error)
            if reload:
                # Either way this activation's state may no longer be the store's: let it go,
                # before a handler waiting for this append runs on it.
                self._give_up(error)  # type: ignore[arg-type]
            for message in batch.messages:
                if reload and self._handing_on.keep_if_abandoned(message):
                    continue
                self._fail(message, error or StoreError("the append was not stored"))
            return
        if is_large(results):
            # Entered a slice at a time by the actor (large_entry.py): in flight until then.
            self._append_in_flight = True
            entry = LargeEntry(batch, results)
            if self.mailbox.put_if_open(EnterStored()):  # (it wakes the actor if it is idle)
                self._entering = entry
                return
            self._append_in_flight = False  # the activation has stopped: its window is no more
            entry.answer(self._answer)
            return
        new = [episode for episode, is_new in results if is_new]
        if new:
            self._window.append(new)
        # Stored: answer first (nothing below may leave a caller waiting), then the follow-ups.
        for message, own in batch.split(results):
            self._answer(message, handed_out(tuple([episode for episode, _ in own])))  # the window keeps its own
        self._entered(new)

    async def _enter_stored(self) -> None:
        """Enter a large append's episodes into the window, a slice at a time; then answer its callers."""
        entry = self._entering
        if entry is None:
            return
        for _ in entry.slices(self._window):
            await anyio.lowlevel.checkpoint()  # the engine's other tasks run between two slices
        self._entering = None
        self._append_in_flight = False
        settled, self._append_settled = self._append_settled, None
        if settled is not None:
            settled.set()
        entry.answer(self._answer)
        self._entered(entry.new)

    def _entered(self, new: list[Episode]) -> None:
        """The follow-ups of episodes now in the window: the eviction boundary, the summary, the retain batch."""
        window = self._window
        if new:
            self._last_seq = new[-1].seq  # type: ignore[assignment]
            if window.evicted:
                self._keep_boundary()
            if window.evicted and not self._summary.busy:  # (what dispatch checks first, asked here per add)
                self._dispatch_summary()
            if self._retain is not None:
                self._retain.if_due()

    async def _on_read(self, message: ReadContext) -> None:
        if message.reply.abandoned:
            return  # the caller gave up before its turn: a read changes nothing
        # After the append in flight: a read queued among adds (which joined that append, add_batch.py)
        # is answered once they are stored, at most one commit later; and a stream of reads answered
        # from memory never keeps the store's thread from committing (it needs the GIL too).
        await self._settle_append()
        await self._lease.ensure_valid()  # memory may be stale if another process took the session over
        evicted_through = self._window.evicted_through
        if message.wait_for_summary and evicted_through is not None and self._summary.set_aside is not None:
            self._fail(message, set_aside_error(self.session_id, self._summary.set_aside))  # nothing to wait for
        elif message.wait_for_summary and evicted_through is not None:
            self._waiting.add(message, evicted_through)
        else:
            context = self._context()
            omitted = context.omitted
            if (
                message.wait_for_ceiling
                and omitted is not None
                and evicted_through is not None
                and self._summary.set_aside is None
            ):
                # Over the ceiling while the summarizer is behind: wait for the summary of the evicted
                # episodes left out (the caller bounds the wait, then reads again without it).
                self._waiting.add(message, min(omitted.last_seq, evicted_through))
            else:
                self._answer(message, context)

    async def _on_delete(self, message: DeleteEpisodes) -> None:
        await self._settle_append()
        deleted, snapshot = await self._store.delete_episodes(self.session_id, self._lease.current(), message.seqs)
        if deleted:
            await self._count_large(snapshot)  # what a deleted summary covered is raw again
            self._apply(snapshot)
            if self._retain is not None:
                self._retain.removed()
            await self._erase_recorded(message.seqs)
        self._answer(message, deleted)

    async def _on_clear(self, message: ClearSession) -> None:
        await self._settle_append()
        self._apply(await self._store.clear_session(self.session_id, self._lease.current()))
        if self._retain is not None:
            self._retain.removed()
        await self._erase_recorded(None)
        self._answer(message, None)

    async def _erase_recorded(self, seqs: Sequence[int] | None) -> None:
        """The erased episodes leave the recording too (session/recording.py), before the answer is recorded."""
        if self._recorder is not None:
            await self._recorder.erase(self.session_id, seqs)

    async def _on_forget(self, message: ForgetSession) -> None:
        await self._settle_append()
        erased = await self._store.erase_session(self.session_id, self._lease.current())
        if self._retain is not None:
            self._retain.removed()  # its last step may have recorded a forget for the sink: delivered now
        await self._erase_recorded(None)
        if erased.traces_left:
            # Its row and lease wait for the retain sink (store/erasure.py): an empty session, let go as at close.
            self._apply(await self._store.load_session(self.session_id))
            self._close_requested = True
        else:
            # Nothing of the session is left, its lease included: this activation ends without a retain flush
            # or a lease release, and any message after this one goes to a new activation (a new session).
            self._given_up = LeaseLostError(f"session {self.session_id!r} was forgotten")
        self._answer(message, erased)

    async def _on_close(self, message: CloseSession) -> None:
        # Every earlier message of this session has been handled. Close is a
        # boundary: the partial retain batch goes to the outbox (not to the
        # sink: close never waits for it). Once the summarizer is idle, the
        # activation can go, its state being durable.
        await self._settle_append()
        if self._retain is not None and self._retain.has_unretained():
            await self._retain.flush()
        self._close_requested = True
        self._answer(message, None)

    async def _on_tick(self, message: Tick) -> None:
        after = self._config.passivate_after
        if self._active_since_tick or self._quiet_since is None:
            self._active_since_tick = False
            self._quiet_since = message.now
        elif after is not None and message.now - self._quiet_since >= after:
            self._idle_expired = True
        if self._summary.set_aside is not None:
            await self._summary_results.recheck_set_aside()

    def _on_hand_over(self) -> None:
        self._idle_expired = True  # passivates once nothing is in flight (_may_passivate)

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

    async def _on_retry_summary(self, message: RetrySummary) -> None:
        await self._settle_append()
        message.reply.set(await self._summary_results.retry())  # an operator's call: not recorded (see RetrySummary)

    # -- state ---------------------------------------------------------------

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

        Queued into the next group commit, not waited for: it is one small
        row update per eviction (a chunk of episodes, not a turn). If it is
        lost (a crash right after the eviction), the next activation applies
        the rules again from the last boundary stored.
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

    async def _settle_append(self) -> None:
        """Wait for this session's append in flight; hand the message on if the session was given up meanwhile."""
        while self._append_in_flight:
            if self._entering is not None:
                await self._enter_stored()  # stored already: the rest is this actor's own work
                continue
            if self._append_settled is None:
                self._append_settled = anyio.Event()
            await self._append_settled.wait()
        if self._given_up is not None:
            raise NotHandled

    def _dispatch_summary(self) -> None:
        self._summary.dispatch(self._window, self._lease.current())

    def _answer_waiting_reads(self) -> None:
        if not self._waiting:
            return
        first_pending = self._window.raw[0].seq if self._window.evicted else math.inf
        ready = self._waiting.ready(first_pending)  # type: ignore[arg-type]
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
        summary_tokens = self._summary.tokens
        raw, raw_tokens = window.raw, window.tokens
        start, shown_tokens, omitted, note_tokens = 0, raw_tokens, None, 0
        ceiling = self._context_ceiling
        if ceiling is not None and summary_tokens + raw_tokens > ceiling:
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
            summary=self._summary.text,
            summarized_through=self._summary.through,
            episodes=tuple(raw[start:]) if start else tuple(raw),
            evicted_through=self._summary.through if evicted_through is None else evicted_through,
            tokens=summary_tokens + note_tokens + shown_tokens,
            omitted=omitted,
        )


def _eviction_recorded(result: object, error: BaseException | None) -> None:
    if error is not None:
        log.info("recording an eviction boundary failed (%s); the next activation applies the rules again", error)


def _unhandled(message: object) -> NoReturn:
    raise TypeError(f"a session actor cannot handle {type(message).__name__}")
