"""The session actor: one task owning all of a session's state, one handler per message.

It reads its mailbox and handles one message at a time, in arrival order; a
handler awaits only the store, never the summarizer or a client. Reads are
answered from memory. When the raw window overflows, evicted episodes go to the
summarizer child (see summary.py); they stay visible raw until the child
acknowledges a stored summary.

:meth:`SessionActor._handle` is the one place that maps each message type to
its handler. The client messages' handlers (add, read, delete, clear, forget,
close, retry) are in client_handlers.py, over the activation's state and the
answers made from it (activation_state.py); the engine's (tick, hand over)
are here, with the actor's lifecycle. The actor's collaborators each keep one
concern, and get what they need when made:

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

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import attrs

from ..actor.mailbox import Mailbox
from ..config import SessionConfig
from ..errors import EngineClosedError, LeaseLostError, MemEngineError, SessionBusyError, StoreError
from ..store.base import Store
from ..summarizer.actor import SummarizerActor
from ..summarizer.protocol import Summarizer
from ..telemetry import NO_TELEMETRY, Telemetry
from .client_handlers import ClientHandlers
from .hand_on import HandOn, NotHandled
from .large_entry import LargeEntry
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
    LeaseNotRenewed,
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
from .summary_results import SummaryResults
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


class SessionActor(ClientHandlers):
    """One session's actor: its mailbox, its lifecycle, and the dispatch of each message to its handler."""

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
        self._count_tokens = tokenizer_of(config, session_id)
        self._child = SummarizerActor(
            session_id,
            services.summarizer,
            services.store,
            config,
            services.summary_slots,
            self._summary_answered,
            services.telemetry,
            self._reads_wait,
            self._count_tokens,
        )
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
        self._appends_submitted = 0  # appends submitted by this activation: numbers them (see ReadContext.passed_by)
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

    @property
    def summary_holes(self) -> int:
        """Ranges of summarized episodes being summarized again after a delete (a segmented session's holes)."""
        return len(self._summary.holes)

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

    def _reads_wait(self) -> bool:
        """Whether a read waits for a summary (the child then has its next one committed at once)."""
        return bool(self._waiting)

    def _summary_answered(self, message: SummaryStored | SummaryFailed) -> None:
        """The summarizer child's answer, queued for the actor; dropped if this activation has stopped.

        The child may finish a batch in the same moment the activation stops
        (its task was ready to run when the actor closed the mailbox, before
        the cancellation reached it). Nothing is lost: a stored summary is in
        the store, where the next activation loads it from.
        """
        if not self.mailbox.put_if_open(message):
            log.debug("session %r: a summarizer answer arrived after the activation stopped", self.session_id)

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
            case LeaseNotRenewed():
                if not self._append_in_flight:  # (in flight, its commit tells: see LeaseNotRenewed)
                    await self._confirm_lease()
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

    async def _confirm_lease(self) -> None:
        """The engine's renewal did not renew this lease: renew it alone, and give the session up if that fails.

        A renewal of many leases can leave one out only because its row was
        locked for a moment (another replica's activation, this process's own
        write); alone, the store says whether it is still this process's.
        """
        try:
            await self._lease.renew()
        except LeaseLostError as lost:
            self._give_up(lost)
        except Exception as exc:
            # The store cannot tell now: reads renew first by themselves once the lease may have lapsed.
            log.warning("session %r: its lease could not be confirmed (%s)", self.session_id, exc)

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


def _unhandled(message: object) -> NoReturn:
    raise TypeError(f"a session actor cannot handle {type(message).__name__}")
