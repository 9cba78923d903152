"""The delivery actor: sends outbox batches to the retain sink, exactly once and in order.

It runs under the engine's task group, apart from every writer: ``add`` and
``close`` only record batches in the outbox, so a slow or failing sink cannot
slow them. A batch leaves the outbox only after the sink returned. The
batch's ``key`` lets a sink drop a batch it stored but could not acknowledge
(a crash between the two).

Sessions are independent: a failing, hung or crowded session delays only
itself. The actor reads the oldest batch of each session that is due (see
``outbox.due``), oldest first, and works on up to ``_CONCURRENT_SESSIONS``
sessions at once, one batch of a session at a time, so each session's batches
go out in order. Nothing waits for a whole pass: when a batch is done, its slot
goes to the next due session. A sink call lasts at most ``retain_timeout``.
A refused batch (a timeout counts as a refusal) gets a retry time in the
outbox, which every process honours, and its session drops out of selection
until then: within a round of ``retain_attempts`` calls the wait grows
exponentially with jitter, after a round it is ``retain_retry_later``. After
``retain_set_aside_after`` rounds the batch is set aside (store/set_aside.py):
kept in the outbox, never selected, and its session's later batches wait
behind it, until it is retried or discarded.

The actor wakes when a batch is recorded (``notify``), when a session's turn
ends, at the earliest retry time or lapse of another process's claim it saw,
and at least every ``retain_retry_later`` seconds (for batches another process
recorded). At engine start and in :meth:`RetainDelivery.drain` at exit,
batches waiting for their retry time are tried at once.

Where several processes share the store, each runs a delivery actor: a batch
is sent only under a claim (see store/outbox.py), which only the oldest batch
of a session can get; the claim is extended every third of
``retain_claim_seconds`` while the call lasts, and a dead process's claim
lapses after ``retain_claim_seconds``. A live process counts on its claim
only until a local deadline, measured on its own clock from *before* the
claim (or the last extension that went through) was asked for, less a
margin: a process cut off from the store (extensions failing or hanging)
cancels its sink call at that deadline, before another process can claim the
batch, so a sink that honours cancellation gets no late copy after the
batches sent meanwhile. A call cancelled so, or one that returns after the
deadline, is not counted or recorded as delivered; whoever claims the batch
next sends it again, with the same key (what a process paused mid-request
has already put on the wire can still land late: the key lets the sink
drop it).

A forget (a delete or clear of episodes already handed on, see
store/outbox.py) is an outbox row like a batch, and goes out the same way,
in its place among the session's batches, to the sink's ``forget``. A sink
without ``forget`` is not called for it: the row is removed as delivered.
A batch a delete left empty is removed the same way, without a call.
"""

from __future__ import annotations

import enum
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable

import anyio
import attrs

from ..config import SessionConfig
from ..privacy.error_text import error_label, error_text, log_content
from ..retrying import retry_delay
from ..store.base import DueBatch, DueRetains, OutboxEntry, OutboxState, Store
from ..telemetry import NO_TELEMETRY, Telemetry
from .batch import ForgetRequest, RetainBatch, RetainSink

log = logging.getLogger("memengine.retain")

#: Sessions one process delivers at once (one batch each).
_CONCURRENT_SESSIONS = 8
#: Due batches read from the outbox at once; what falls due meanwhile is read when they are handed out.
_WINDOW = 256
#: The part of a claim this process does not count on (clock rates differ; a cancelled sink call takes
#: a moment to end): its sink call is cancelled this fraction of ``retain_claim_seconds`` early.
_CLAIM_MARGIN = 0.2


def _batch(entry: OutboxEntry) -> RetainBatch:
    return RetainBatch(
        session_id=entry.session_id,
        first_seq=entry.first_seq,
        last_seq=entry.last_seq,
        episodes=entry.episodes,
        key=entry.key,
        mode=entry.mode,  # type: ignore[arg-type]
    )


def _forget_request(entry: OutboxEntry) -> ForgetRequest:
    return ForgetRequest(
        session_id=entry.session_id,
        seqs=entry.forget_seqs,
        through_seq=entry.last_seq,
        kept=entry.episodes,
        key=entry.key,
    )


def _own_error(error: Exception) -> Exception:
    """The sink's error itself, out of the single-error groups a task group wraps it in."""
    while isinstance(error, ExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


@attrs.frozen
class RetainMetrics:
    """What is waiting for the sink, and how delivery has gone in this process."""

    outbox_depth: int
    oldest_undelivered_age: float | None  # seconds, None when the outbox is empty
    delivered: int
    delivery_failures: int  # failed sink calls, retries included

    @classmethod
    def of(cls, outbox: OutboxState, delivered: int, failures: int) -> RetainMetrics:
        age = None if outbox.oldest_created_at is None else max(0.0, time.time() - outbox.oldest_created_at)
        return cls(outbox.depth, age, delivered, failures)


class _SinkTimeout(TimeoutError):
    """A sink call cut at ``retain_timeout``: memengine's own words, which quote nothing of the batch."""


def _described(error: Exception) -> str:
    """How a log line names a failed call: by its type, as its text may quote the batch (privacy/error_text.py)."""
    return f"TimeoutError({str(error)!r})" if isinstance(error, _SinkTimeout) else error_label(error)


class _CallEnd(enum.Enum):
    RETURNED = "the sink returned: it has the batch"
    CLAIM_LOST = "the claim was lost mid-call: the batch is another process's now, or gone"


@attrs.define
class _Call:
    """A sink call in flight: the claim keeper extends its claim, and cancels it if the claim is lost.

    ``valid_until`` (anyio's clock) is when the claim may lapse in the store, less the margin. The
    call's ``scope`` is cancelled then, or when this process's own proof of life lapses
    (``store.alive_until()``: others may take it for dead and void its claims after that), whichever
    comes first, unless an extension or a heartbeat moves them.
    """

    entry_id: int
    key: str
    valid_until: float
    scope: anyio.CancelScope
    extending: bool = False

    def counted_until(self, alive_until: float) -> float:
        """Until when the call is counted on: its claim and this process's proof of life both hold."""
        return min(self.valid_until, alive_until)

    def prolong(self, valid_until: float, alive_until: float) -> None:
        self.valid_until = max(self.valid_until, valid_until)
        self.scope.deadline = self.counted_until(alive_until)


class RetainDelivery:
    """This process's delivery of the outbox to the sink: :meth:`run` while the engine runs, :meth:`drain` at exit.

    ``delivered`` and ``failures`` count sink calls that returned and that
    failed (timeouts included) in this process.
    """

    def __init__(
        self, store: Store, sink: RetainSink, config: SessionConfig, telemetry: Telemetry = NO_TELEMETRY
    ) -> None:
        self._telemetry = telemetry
        self._store = store
        self._sink = sink
        self._config = config
        self._changed = anyio.Event()
        # Sessions with a batch in hand in this process; shared by run() and drain(), so a
        # session is never delivered twice at once and the concurrency bound holds for both.
        self._delivering: set[str] = set()
        self._calls: dict[int, _Call] = {}
        self._stopped = False
        self._forgets = callable(getattr(sink, "forget", None))
        self.delivered = 0
        self.failures = 0

    def stop(self) -> None:
        """Take no claim from now on (engine exit: the leases and claims are released next)."""
        self._stopped = True

    def drop_claims(self) -> None:
        """Cancel every sink call in flight: this process's claims may be voided by others (its liveness lock was lost).

        Each batch is sent again, with the same key, by whoever claims it next.
        """
        for call in self._calls.values():
            call.scope.cancel()

    def alive_moved(self) -> None:
        """A heartbeat renewed this process's proof of life (``store.alive_until()``): calls in flight may go on."""
        alive_until = self._store.alive_until()
        for call in self._calls.values():
            call.prolong(call.valid_until, alive_until)

    def notify(self) -> None:
        """New batches are in the outbox (called after they are committed), or a session's turn ended."""
        self._changed.set()
        self._changed = anyio.Event()

    async def run(self) -> None:
        """Deliver for as long as the engine runs (until cancelled)."""
        await _Schedule(self, draining=False).run()

    async def drain(self, grace: float) -> bool:
        """Deliver until nothing this process may send is left, or ``grace`` seconds passed.

        Batches waiting for their retry time are tried too, and a batch refused
        now is tried again every ``retain_backoff`` seconds. Batches other
        processes hold are theirs. True if everything was delivered. A sink's
        error never escapes.
        """
        with anyio.move_on_after(grace):
            try:
                await _Schedule(self, draining=True).run()
            except Exception:
                log.exception("delivering the outbox at shutdown failed; the rest is delivered at the next start")
                return False
            return True
        return False

    async def _read_due(self, limit: int, ignore_backoff: bool) -> DueRetains | None:
        try:
            return await self._store.due_retains(limit, ignore_backoff=ignore_backoff)
        except Exception:
            log.exception("reading the retain outbox failed; delivery is retried later")
            return None

    async def _deliver(self, due: DueBatch) -> float | None:
        """Claim one batch and hand it to the sink.

        Returns None once the batch is delivered or not this process's to send,
        else the seconds after which its session should be tried again.
        """
        config = self._config
        if self._stopped:
            return None  # leaving: a claim taken now would outlive the release of this process's claims
        asked_at = anyio.current_time()  # before the request: the claim runs from some time after this
        if asked_at >= self._store.alive_until():
            # Others may be taking this process for dead (store/owners.py): its claims may be voided.
            return config.retain_backoff
        try:
            # Claim, and so read, the batch right before the call: a clear or delete since it
            # was found may have revised or dropped it, and a deleted episode must not be
            # handed on after the delete returned.
            entry = await self._store.claim_retain(due.id, due.key, config.retain_claim_seconds)
        except Exception:
            log.exception("claiming a retain batch failed; it is tried again later")
            return config.retain_backoff
        if isinstance(entry, str):
            return None  # gone (delivered, cleared, deleted), or another process holds it
        if not self._has_a_call(entry):
            recorded = await self._record(self._store.mark_retained(entry.id, entry.key))
            return None if recorded else config.retain_backoff
        if entry.mode == "forget" and entry.forget_seqs is not None:
            try:
                # What the sink keeps: read now, with every batch ahead of the forget handed on.
                through, kept = await self._store.handed_on(entry.session_id)
            except Exception:
                log.exception("reading what a forget keeps failed; it is tried again later")
                return config.retain_backoff
            entry = attrs.evolve(entry, last_seq=through, episodes=kept)
        valid_until = self._claim_valid_until(asked_at)
        if anyio.current_time() >= min(valid_until, self._store.alive_until()):
            log.warning("a retain claim came back too late to be counted on; the batch is tried again later")
            return config.retain_backoff
        outcome = await self._call_sink(entry, valid_until)
        if outcome is _CallEnd.CLAIM_LOST:
            return None
        if outcome is _CallEnd.RETURNED:
            self.delivered += 1
            # If recording the delivery fails, the batch is sent again later with the same key.
            recorded = await self._record(self._store.mark_retained(entry.id, entry.key))
            return None if recorded else config.retain_backoff
        return await self._failed(entry, outcome)

    def _has_a_call(self, entry: OutboxEntry) -> bool:
        """Whether the entry means a sink call: not for a forget the sink cannot take, nor a batch left empty."""
        return self._forgets if entry.mode == "forget" else bool(entry.episodes)

    async def _hand_on(self, entry: OutboxEntry) -> None:
        if entry.mode == "forget":
            with self._telemetry.operation("memengine.retain", "forget", entry.session_id) as traced:
                traced.count(len(entry.forget_seqs or ()))
                await self._sink.forget(_forget_request(entry))  # type: ignore[attr-defined]
            return
        with self._telemetry.operation("memengine.retain", "retain", entry.session_id) as traced:
            traced.count(len(entry.episodes))
            traced.content("gen_ai.memory.content", lambda: [[e.role, e.content] for e in entry.episodes])
            await self._sink.retain(_batch(entry))

    def _claim_valid_until(self, asked_at: float) -> float:
        """Until when a claim asked for (or extended) at ``asked_at`` is counted on."""
        return asked_at + self._config.retain_claim_seconds * (1 - _CLAIM_MARGIN)

    async def _call_sink(self, entry: OutboxEntry, valid_until: float) -> _CallEnd | Exception:
        """Hand the batch to the sink, for at most ``retain_timeout``, while its claim is kept.

        The call is cancelled when its claim can no longer be counted on
        (``valid_until``, moved by each extension that went through) or when
        this process's own proof of life lapses (``store.alive_until()``,
        moved by each heartbeat: a process frozen past it may have been
        reaped, its claims voided and the batch sent, and a forget after it,
        by another), and a return after either counts as a lost claim too:
        never as delivered.

        The sink runs in this task, not under a task group here, so its error
        comes out as it was raised (a task group wraps it in a group, and a
        cancellation arriving meanwhile would join that group).
        """
        timeout = self._config.retain_timeout
        store = self._store
        call = _Call(entry.id, entry.key, valid_until, anyio.CancelScope())
        call.scope.deadline = call.counted_until(store.alive_until())
        self._calls[entry.id] = call
        try:
            with call.scope:
                with anyio.move_on_after(timeout):
                    await self._hand_on(entry)
                    if anyio.current_time() >= call.counted_until(store.alive_until()):
                        log.warning(
                            "the retain sink returned batch %r after this process's claim on it, or its own proof "
                            "of life, could have lapsed; it is not counted as delivered, and is sent again with "
                            "the same key",
                            entry.key,
                        )
                        return _CallEnd.CLAIM_LOST
                    return _CallEnd.RETURNED
                return _SinkTimeout(f"the sink did not return within retain_timeout ({timeout:g}s); call cancelled")
            log.warning(
                "the retain sink call for batch %r was cancelled: this process's claim on it was lost or could "
                "not be kept; whoever claims it next sends it again with the same key",
                entry.key,
            )
            return _CallEnd.CLAIM_LOST
        except Exception as exc:
            return _own_error(exc)
        except BaseExceptionGroup as group:
            # The sink's own task group met a cancellation. Its error counts as a failure;
            # a cancellation of ours is raised again at the next checkpoint (recording it).
            errors, rest = group.split(Exception)
            if errors is None or (rest is not None and rest.split(anyio.get_cancelled_exc_class())[1] is not None):
                raise
            return _own_error(errors)
        finally:
            del self._calls[entry.id]

    async def _failed(self, entry: OutboxEntry, error: Exception) -> float | None:
        """Count and log a refused call, and record it with the batch's retry time; return that delay.

        After ``retain_set_aside_after`` failed rounds the batch is set aside instead (None: its
        session is done with until a retry; its later batches wait behind it in the outbox).
        """
        config = self._config
        self.failures += 1
        attempt = entry.attempts + 1
        retry_in = retry_delay(
            attempt, config.retain_attempts, config.retain_backoff, config.retain_backoff_max, config.retain_retry_later
        )
        end_of_round = attempt % config.retain_attempts == 0
        limit = config.retain_set_aside_after
        set_aside = end_of_round and limit is not None and attempt >= limit * config.retain_attempts
        if set_aside:
            log.error(
                "retain of session %r seqs %d..%d failed in %d round(s) in a row (%d attempts; last error %s); "
                "set aside: it stays in the outbox with the session's later batches behind it, and is not sent "
                "again until engine.retry_set_aside() or `memengine set-aside retry` (or dropped by discard)",
                entry.session_id,
                entry.first_seq,
                entry.last_seq,
                attempt // config.retain_attempts,
                attempt,
                _described(error),
            )
        else:
            log.log(
                logging.ERROR if end_of_round else logging.WARNING,
                "retain of session %r seqs %d..%d failed (attempt %d): %s; it stays in the outbox, retried in %.2fs",
                entry.session_id,
                entry.first_seq,
                entry.last_seq,
                attempt,
                _described(error),
                retry_in,
            )
        log_content(
            "the retain sink's error (session %r seqs %d..%d)",
            entry.session_id,
            entry.first_seq,
            entry.last_seq,
            error=error,
        )
        recorded = await self._record(
            self._store.mark_retain_failed(entry.id, entry.key, error_text(error), retry_in, set_aside=set_aside)
        )
        return None if set_aside and recorded else retry_in

    async def _keep_claims(self) -> None:
        """Every third of ``retain_claim_seconds``, extend the claim of every batch whose sink call is in flight.

        Each call's claim is extended on its own, so one hanging extension holds up no other.
        """
        async with anyio.create_task_group() as extensions:
            while True:
                await anyio.sleep(self._config.retain_claim_seconds / 3)
                for call in list(self._calls.values()):
                    if not call.extending:
                        call.extending = True
                        extensions.start_soon(self._extend_claim, call)

    async def _extend_claim(self, call: _Call) -> None:
        """Extend the call's claim, for at most what is left of its validity.

        A claim the store refuses to extend (this process was paused past it,
        or a clear dropped the batch) cancels its call: the batch is no longer
        ours to send. An extension that fails or does not finish in time
        leaves the validity where it was: the call goes on until then, and is
        cancelled then unless a later extension goes through.
        """
        claim_seconds = self._config.retain_claim_seconds
        asked_at = anyio.current_time()  # before the request: the extension runs from some time after this
        try:
            with anyio.move_on_after(call.valid_until - asked_at):
                try:
                    kept = await self._store.extend_retain_claim(call.entry_id, call.key, claim_seconds)
                except Exception as exc:
                    log.warning(
                        "extending a retain claim failed (%r); the sink call is cancelled when the claim "
                        "could lapse, unless a later extension goes through",
                        exc,
                    )
                    return
                if not kept:
                    call.scope.cancel()
                elif self._calls.get(call.entry_id) is call:
                    call.prolong(self._claim_valid_until(asked_at), self._store.alive_until())
                return
            log.warning("extending a retain claim did not finish before the claim could lapse; the call is cancelled")
        finally:
            call.extending = False

    @staticmethod
    async def _record(operation: Awaitable[None]) -> bool:
        try:
            await operation
        except Exception:
            log.exception("recording a retain delivery in the store failed; the batch stays in the outbox")
            return False
        return True


class _Schedule:
    """One delivery loop (the engine's, or the drain at exit): hands due sessions to workers."""

    def __init__(self, delivery: RetainDelivery, *, draining: bool) -> None:
        self._delivery = delivery
        self._draining = draining
        self._window: deque[DueBatch] = deque()  # read as due, not handed out yet; oldest first
        # Sessions this loop leaves alone until then (anyio's clock), after a failure:
        # whatever the store could record, a refused session is not retried at once.
        self._paused: dict[str, float] = {}

    async def run(self) -> None:
        """Until cancelled; when draining, until nothing this process may send is left."""
        delivery, config = self._delivery, self._delivery._config
        ignore_backoff = True  # the first read (at start and at exit) tries batches waiting for a retry
        async with anyio.create_task_group() as workers:
            workers.start_soon(delivery._keep_claims)
            while True:
                changed = delivery._changed
                # Running, look again at least every retain_retry_later: another process may
                # have recorded batches (no notification reaches this one). Draining, only
                # this process's own batches matter: a call ending or a pause ending.
                wait = math.inf if self._draining else config.retain_retry_later
                self._unpause()
                if not self._window:
                    limit = _WINDOW + len(delivery._delivering) + len(self._paused)
                    due = await delivery._read_due(limit, ignore_backoff or self._draining)
                    if due is None:
                        wait = config.retain_backoff if self._draining else config.retain_retry_later
                    else:
                        ignore_backoff = False
                        if self._draining and not due.batches and not delivery._delivering:
                            workers.cancel_scope.cancel()
                            return
                        self._window.extend(
                            batch
                            for batch in due.batches
                            if batch.session_id not in delivery._delivering and batch.session_id not in self._paused
                        )
                        if due.next_due_in is not None:
                            wait = min(wait, due.next_due_in)
                while self._window and len(delivery._delivering) < _CONCURRENT_SESSIONS:
                    batch = self._window.popleft()
                    if batch.session_id not in delivery._delivering:  # the other loop may have it
                        delivery._delivering.add(batch.session_id)
                        workers.start_soon(self._deliver_head, batch)
                if self._paused and not self._window:
                    wait = min(wait, min(self._paused.values()) - anyio.current_time())
                with anyio.move_on_after(max(wait, 0.0)):
                    await changed.wait()

    def _unpause(self) -> None:
        now = anyio.current_time()
        for session_id in [session_id for session_id, until in self._paused.items() if until <= now]:
            del self._paused[session_id]

    async def _deliver_head(self, batch: DueBatch) -> None:
        delivery = self._delivery
        retry_in: float | None = None
        try:
            retry_in = await delivery._deliver(batch)
        except Exception:
            log.exception("delivering a retain batch failed unexpectedly; it is tried again later")
            retry_in = delivery._config.retain_retry_later
        finally:
            if retry_in is not None:
                if self._draining:
                    retry_in = min(retry_in, delivery._config.retain_backoff)
                self._paused[batch.session_id] = anyio.current_time() + retry_in
            delivery._delivering.discard(batch.session_id)
            delivery.notify()
