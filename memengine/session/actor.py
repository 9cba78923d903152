"""The session actor: one task owning all of a session's state.

It reads its mailbox and handles one message at a time, in arrival order; a
handler awaits only the store, never the summarizer or a client. Reads are
answered from memory. When the raw window overflows, evicted episodes go to the
summarizer child; they stay visible raw until the child acknowledges a stored
summary. Clear and delete change the session's generation, which fences off any
summary computed before them.

Across processes, a session is leased: the actor takes the lease when it
activates (waiting up to ``lease_wait`` for another owner), every write
carries the lease's fencing token, and the actor gives the session up as soon
as a write is refused or the engine's renewal fails (a stale lease). Reads are
answered from memory only while the lease is known to be valid.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import attrs

from ..actor.mailbox import Mailbox, MailboxClosed
from ..config import SessionConfig
from ..context import Context
from ..errors import (
    EngineClosedError,
    LeaseLostError,
    MemEngineError,
    SessionBusyError,
    StoreError,
    UncertainCommitError,
)
from ..replay import MessageRecorder
from ..retain.batch import RetainMode
from ..retain.delivery import RetainDelivery
from ..store.base import AppendResult, SessionSnapshot, Store
from ..summarizer.actor import SummarizeBatch, SummarizerActor
from ..summarizer.protocol import Summarizer
from .messages import (
    AddEpisodes,
    ClearSession,
    ClientMessage,
    CloseSession,
    DeleteEpisodes,
    LeaseLost,
    ReadContext,
    SessionMessage,
    SummaryFailed,
    SummaryStored,
    Tick,
)
from .window import RawWindow

log = logging.getLogger("memengine.session")


@attrs.frozen
class RetainPlan:
    """How sessions hand their episodes on to long-term memory (absent without a sink)."""

    mode: RetainMode
    every: int
    delivery: RetainDelivery


@attrs.frozen
class SessionServices:
    """What every session actor of one engine shares."""

    store: Store
    summarizer: Summarizer
    config: SessionConfig
    summary_slots: anyio.CapacityLimiter
    retain: RetainPlan | None = None
    recorder: MessageRecorder | None = None


class SessionActor:
    def __init__(
        self,
        session_id: str,
        services: SessionServices,
        on_stop: Callable[[SessionActor], None],
        redeliver: Callable[[str, ClientMessage], None] | None = None,
    ) -> None:
        self.session_id = session_id
        self.mailbox: Mailbox[SessionMessage] = Mailbox()
        self._store = services.store
        self._config = services.config
        self._retain = services.retain
        self._recorder = services.recorder
        self._on_stop = on_stop
        self._redeliver = redeliver
        self._summarizer = SummarizerActor(
            session_id, services.summarizer, services.store, services.config, services.summary_slots, self.mailbox.put
        )
        # The lease: its fencing token once activated, and until when (by this
        # process's clock) it is surely still ours.
        self.token: int | None = None
        self._lease_valid_until = -math.inf
        self._lease_lost: LeaseLostError | None = None
        # State, recovered from the store on activation.
        self._generation = 0
        self._last_seq = 0
        self._summary: str | None = None
        self._summarized_through = 0
        self._window = RawWindow(services.config.max_episodes, services.config.max_chars)
        self._retained_through = 0  # episodes up to here are in the retain outbox (or delivered)
        self._retain_in_flight = False
        self._retain_settled: anyio.Event | None = None  # made only when a flush must wait
        # Summarizer bookkeeping.
        self._summary_in_flight = False
        self._retry_at: float | None = None
        self._waiters: list[tuple[int, ReadContext]] = []  # (seq to be summarized, the read waiting)
        self._handling: SessionMessage | None = None
        self._append_in_flight = False
        self._append_settled: anyio.Event | None = None  # made only when a second append must wait
        # Passivation: decided from the engine's ticks, so the hot path reads no clock.
        self._active_since_tick = True
        self._quiet_since: float | None = None
        self._idle_expired = False
        self._close_requested = False

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        stop_error: MemEngineError = EngineClosedError("the engine closed before answering")
        try:
            try:
                snapshot = await self._acquire()
            except SessionBusyError as busy:
                stop_error = busy
                return
            except Exception as exc:
                log.error("session %r could not be activated", self.session_id, exc_info=exc)
                stop_error = StoreError(f"session {self.session_id!r} could not be loaded: {exc}")
                return
            async with anyio.create_task_group() as children:
                children.start_soon(self._summarizer.run)
                self._apply(snapshot)
                await self._serve()
                if self._lease_lost is not None:
                    stop_error = self._lease_lost
                self._stop(stop_error)  # passivating: leave the registry before any await
                children.cancel_scope.cancel()
            if self._lease_lost is None:
                await self._release()
        finally:
            # Whatever ended the activation (passivation, shutdown, a bug), no
            # caller is left waiting on it.
            self._stop(stop_error)

    async def _acquire(self) -> SessionSnapshot:
        """Take the session's lease and load its state, waiting up to ``lease_wait`` for another owner."""
        started = anyio.current_time()
        pause = 0.02
        while True:
            attempt = anyio.current_time()
            try:
                self.token, snapshot = await self._store.activate(self.session_id, self._config.lease_ttl)
            except SessionBusyError as busy:
                waited = anyio.current_time() - started
                left = self._config.lease_wait - waited
                if left <= 0:
                    raise SessionBusyError(self.session_id, busy.owner, busy.expires_in, waited) from None
                await anyio.sleep(min(pause, left, max(busy.expires_in, 0.0) + 0.01))
                pause = min(pause * 2, 0.5)
                continue
            self.lease_renewed(attempt)
            return snapshot

    def lease_renewed(self, asked_at: float) -> None:
        """The store extended the lease at some moment after ``asked_at`` (this process's clock)."""
        # A tenth of the ttl to spare: the two clocks may run at slightly different rates.
        self._lease_valid_until = asked_at + self._config.lease_ttl * 0.9

    async def _release(self) -> None:
        assert self.token is not None
        try:
            await self._store.release_lease(self.session_id, self.token)
        except Exception:
            # Not fatal: the lease expires on its own (and this process may take it again at once).
            log.exception("session %r: releasing its lease failed", self.session_id)

    def _give_up(self, error: BaseException) -> None:
        """This activation may no longer hold the store's truth (a stale lease, an uncertain commit): stop.

        Messages not yet handled go to a new activation, which loads the
        session from the store (waiting for another owner's lease if need be).
        """
        if self._lease_lost is None:
            log.warning("session %r: %s; giving it up", self.session_id, error)
            self._lease_lost = (
                error
                if isinstance(error, LeaseLostError)
                else LeaseLostError(f"session {self.session_id!r}: this activation gave the session up ({error})")
            )

    def _stop(self, error: MemEngineError) -> None:
        """Leave the engine's registry and fail whatever was never answered.

        Runs synchronously right after the actor decided to stop, so no message
        can reach this activation after the decision. Calling it again does nothing.
        """
        self._on_stop(self)
        unanswered = self.mailbox.close()
        if self._lease_lost is not None and self._redeliver is not None:
            # Given up, not failed: what this activation never handled, a new one handles.
            unanswered = [message for message in unanswered if not self._handed_on(message)]
            self._waiters = [(target, read) for target, read in self._waiters if not self._handed_on(read)]
        if self._handling is not None:  # cancelled mid-handler
            unanswered.append(self._handling)
            self._handling = None
        for message in unanswered:
            reply = getattr(message, "reply", None)
            if reply is not None:
                reply.fail(error)
        for _, waiting in self._waiters:
            waiting.reply.fail(error)
        self._waiters.clear()

    def _handed_on(self, message: SessionMessage) -> bool:
        """Give an unhandled client message to a new activation; False if that is not possible."""
        if getattr(message, "reply", None) is None:
            return True  # the actor's own bookkeeping: nothing to hand on
        assert self._redeliver is not None
        try:
            self._redeliver(self.session_id, message)  # type: ignore[arg-type]
        except MemEngineError:
            return False  # the engine is closing: the caller gets the error
        return True

    async def _serve(self) -> None:
        while True:
            if self._retry_at is not None and anyio.current_time() >= self._retry_at:
                self._retry_at = None
                self._dispatch_summary()
            message = self.mailbox.take()
            if message is not None:
                self._handling = message
                await self._handle(message)
                self._handling = None
                if self._lease_lost is not None:
                    return
            elif self._may_passivate():
                if self._has_unretained():
                    try:
                        await self._flush_retain()  # a boundary: hand on the partial batch first
                    except LeaseLostError as lost:
                        self._give_up(lost)
                        return
                    except Exception:
                        # Stay active and try again at the next idle period or close.
                        log.exception("session %r: recording its retain batch failed", self.session_id)
                        self._idle_expired = self._close_requested = False
                    continue  # messages may have arrived meanwhile
                return  # no await since take(): nothing can have arrived
            elif self._retry_at is None:
                await self.mailbox.wait_for_mail()
            else:
                with anyio.CancelScope(deadline=self._retry_at):
                    await self.mailbox.wait_for_mail()

    def _has_work_in_flight(self) -> bool:
        return (
            self._summary_in_flight
            or self._retry_at is not None
            or bool(self._waiters)
            or self._append_in_flight
            or self._retain_in_flight
        )

    def _may_passivate(self) -> bool:
        return (self._close_requested or self._idle_expired) and not self._has_work_in_flight()

    # -- message handlers ----------------------------------------------------

    async def _handle(self, message: SessionMessage) -> None:
        match message:
            case SummaryStored():
                self._on_summary_stored(message)
                return
            case SummaryFailed():
                self._on_summary_failed(message)
                return
            case Tick():
                self._on_tick(message)
                return
            case LeaseLost():
                self._give_up(message.error)
                return
        self._active_since_tick = True
        self._idle_expired = False
        self._close_requested = False
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
                case CloseSession():
                    await self._on_close(message)
                case _:
                    _unhandled(message)
        except Exception as exc:
            # The operation failed and the store rolled it back: tell its caller.
            self._fail(message, exc)
            if isinstance(exc, LeaseLostError):
                self._give_up(exc)

    async def _on_add(self, message: AddEpisodes) -> None:
        # The handler does not wait for the commit, so the actor goes on with
        # its mailbox; a second append waits for the first, whose seqs it follows.
        while self._append_in_flight:
            if self._append_settled is None:
                self._append_settled = anyio.Event()
            await self._append_settled.wait()
        self._store.submit_append(
            self.session_id,
            self._token(),
            self._last_seq + 1,
            message.episodes,
            functools.partial(self._appended, message),
        )
        self._append_in_flight = True  # only once submitted: a refused submit leaves nothing in flight

    def _appended(self, message: AddEpisodes, results: AppendResult | None, error: BaseException | None) -> None:
        """Completion of an append, run by the store on the event loop right after its commit.

        It is this actor's code, run synchronously between two of the actor's
        own steps (all on one event loop), and no other append of this session
        is in flight; the caller is answered only now that its rows are stored.
        """
        self._append_in_flight = False
        settled, self._append_settled = self._append_settled, None
        if settled is not None:
            settled.set()
        if error is not None or results is None:
            self._fail(message, error or StoreError("the append was not stored"))
            if isinstance(error, LeaseLostError | UncertainCommitError):
                # Either way this activation's state may no longer be the store's: let it go.
                self._lost_meanwhile(error)
            return
        # Stored: answer first (nothing below may leave the caller waiting).
        self._answer(message, tuple(episode for episode, _ in results))
        new = [episode for episode, is_new in results if is_new]
        if new:
            self._window.append(new)
            self._last_seq = new[-1].seq  # type: ignore[assignment]
            self._dispatch_summary()
            self._retain_if_due()

    async def _on_read(self, message: ReadContext) -> None:
        if anyio.current_time() >= self._lease_valid_until:
            # Memory may be stale if another process took the session over: renew first.
            asked_at = anyio.current_time()
            if self.session_id not in await self._store.renew_leases(
                [(self.session_id, self._token())], self._config.lease_ttl
            ):
                raise LeaseLostError(f"session {self.session_id!r}: this process's lease expired or was taken over")
            self.lease_renewed(asked_at)
        evicted_through = self._window.evicted_through
        if message.wait_for_summary and evicted_through is not None:
            self._waiters.append((evicted_through, message))
        else:
            self._answer(message, self._context())

    async def _on_delete(self, message: DeleteEpisodes) -> None:
        deleted, snapshot = await self._store.delete_episodes(self.session_id, self._token(), message.seqs)
        if deleted:
            self._apply(snapshot)
        self._answer(message, deleted)

    async def _on_clear(self, message: ClearSession) -> None:
        self._apply(await self._store.clear_session(self.session_id, self._token()))
        self._answer(message, None)

    async def _on_close(self, message: CloseSession) -> None:
        # Every earlier message of this session has been handled. Close is a
        # boundary: the partial retain batch goes to the outbox (not to the
        # sink: close never waits for it). Once the summarizer is idle, the
        # activation can go, its state being durable.
        if self._has_unretained():
            await self._flush_retain()
        self._close_requested = True
        self._answer(message, None)

    # -- retain ----------------------------------------------------------------

    def _has_unretained(self) -> bool:
        return self._retain is not None and self._last_seq > self._retained_through

    def _retain_if_due(self) -> None:
        """Every ``retain_every`` new episodes, record a batch in the outbox (not awaited)."""
        plan = self._retain
        if plan is None or self._retain_in_flight or self._last_seq - self._retained_through < plan.every:
            return
        # Exactly retain_every episodes per batch; the completion checks for the next ones.
        self._store.submit_retain(
            self.session_id, self._token(), plan.mode, self._last_seq, plan.every, self._retain_recorded
        )
        self._retain_in_flight = True

    def _retain_recorded(self, retained_through: int | None, error: BaseException | None) -> None:
        """Completion of :meth:`_retain_if_due`, run by the store right after its commit."""
        self._retain_in_flight = False
        settled, self._retain_settled = self._retain_settled, None
        if settled is not None:
            settled.set()
        if isinstance(error, LeaseLostError):
            self._lost_meanwhile(error)
            return
        if error is not None or retained_through is None:
            log.error("session %r: recording a retain batch failed; it is retried", self.session_id, exc_info=error)
            return
        self._retained_through = retained_through
        self._retain.delivery.notify()  # type: ignore[union-attr]
        self._retain_if_due()

    async def _flush_retain(self) -> None:
        plan = self._retain
        assert plan is not None
        while self._retain_in_flight:  # one outbox write of this session at a time
            if self._retain_settled is None:
                self._retain_settled = anyio.Event()
            await self._retain_settled.wait()
        self._retain_in_flight = True
        try:
            self._retained_through = await self._store.enqueue_retain(self.session_id, self._token(), plan.mode)
        finally:
            self._retain_in_flight = False
        plan.delivery.notify()

    def _on_tick(self, message: Tick) -> None:
        after = self._config.passivate_after
        if self._active_since_tick or self._quiet_since is None:
            self._active_since_tick = False
            self._quiet_since = message.now
        elif after is not None and message.now - self._quiet_since >= after:
            self._idle_expired = True

    def _on_summary_stored(self, message: SummaryStored) -> None:
        if message.generation != self._generation:
            return  # computed before a clear/delete; the store refused it too
        self._summary_in_flight = False
        if not message.stored:
            # Same generation yet refused: another writer changed the session.
            self._schedule_retry()
            return
        self._window.drop_through(message.through_seq)
        self._summary = message.summary
        self._summarized_through = message.through_seq
        self._answer_waiters()
        self._dispatch_summary()

    def _on_summary_failed(self, message: SummaryFailed) -> None:
        if isinstance(message.error, LeaseLostError):
            self._give_up(message.error)
            return
        if message.generation != self._generation:
            return
        self._summary_in_flight = False
        self._schedule_retry()

    # -- state ---------------------------------------------------------------

    def _apply(self, snapshot: SessionSnapshot) -> None:
        """Adopt the store's view (after activation, clear or delete)."""
        self._summarizer.abandon_before(snapshot.generation)
        self._generation = snapshot.generation
        self._last_seq = snapshot.last_seq
        self._summary = snapshot.summary
        self._summarized_through = snapshot.summarized_through
        self._window.reset(snapshot.episodes)
        self._retained_through = snapshot.retained_through
        self._summary_in_flight = False
        self._retry_at = None
        self._dispatch_summary()
        self._answer_waiters()

    def _dispatch_summary(self) -> None:
        if not self._window.evicted or self._summary_in_flight or self._retry_at is not None:
            return
        batch = tuple(self._window.pending[: self._config.summarize_batch_max])
        self._summarizer.submit(SummarizeBatch(self._generation, self._summary, batch, self._token()))
        self._summary_in_flight = True

    def _token(self) -> int:
        assert self.token is not None, "a session writes only once activated"
        return self.token

    def _lost_meanwhile(self, error: MemEngineError) -> None:
        """A write submitted earlier was refused (or its commit is in doubt): wake the actor to give the session up."""
        try:
            self.mailbox.put(LeaseLost(error))
        except MailboxClosed:
            pass  # already stopped

    def _schedule_retry(self) -> None:
        self._retry_at = anyio.current_time() + self._config.summarize_retry_later

    def _answer_waiters(self) -> None:
        if not self._waiters:
            return
        first_pending = self._window.raw[0].seq if self._window.evicted else math.inf
        still_waiting = []
        for target, waiting in self._waiters:
            if first_pending > target:  # type: ignore[operator]
                self._answer(waiting, self._context())
                self._active_since_tick = True  # answering a client is activity
            else:
                still_waiting.append((target, waiting))
        self._waiters = still_waiting

    def _answer(self, message: ClientMessage, value: Any) -> None:
        message.reply.set(value)
        if self._recorder is not None:
            self._recorder.record(self.session_id, message, value, None)

    def _fail(self, message: ClientMessage, error: BaseException) -> None:
        message.reply.fail(error)
        if self._recorder is not None:
            self._recorder.record(self.session_id, message, None, error)

    def _context(self) -> Context:
        evicted_through = self._window.evicted_through
        return Context(
            session_id=self.session_id,
            summary=self._summary,
            summarized_through=self._summarized_through,
            episodes=tuple(self._window.raw),
            evicted_through=self._summarized_through if evicted_through is None else evicted_through,
        )


def _unhandled(message: object) -> NoReturn:
    raise TypeError(f"a session actor cannot handle {type(message).__name__}")
