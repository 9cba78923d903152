"""The delivery actor: sends outbox batches to the retain sink, exactly once and in order.

It runs under the engine's task group, apart from every writer: ``add`` and
``close`` only record batches in the outbox, so a slow or failing sink cannot
slow them. Batches of one session go out in order (a session's later batch
waits while an earlier one is failing); sessions are served concurrently. A
batch leaves the outbox only after the sink returned; one the sink refuses is
retried with backoff and jitter, then again after ``retain_retry_later``
seconds, and after a restart. The batch's ``key`` lets a sink drop a batch it
stored but could not acknowledge (a crash between the two).

Where several processes share the store, each runs a delivery actor: a batch
is sent only under a claim (see store/outbox.py), which only the oldest batch
of a session can get, so each session's batches still go out once and in
order; a dead process's claim lapses after ``CLAIM_SECONDS``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable
from typing import Literal

import anyio
import attrs
import tenacity

from ..config import SessionConfig
from ..retrying import backoff_retrying
from ..store.base import OutboxEntry, OutboxState, Store
from .batch import RetainBatch, RetainSink

log = logging.getLogger("memengine.retain")

_BATCH_LIMIT = 500
_CONCURRENT_SESSIONS = 8
#: How long a claim on a batch lasts; it is extended every third of this while a sink call runs.
CLAIM_SECONDS = 60.0


def _batch(entry: OutboxEntry) -> RetainBatch:
    return RetainBatch(
        session_id=entry.session_id,
        first_seq=entry.first_seq,
        last_seq=entry.last_seq,
        episodes=entry.episodes,
        key=entry.key,
        mode=entry.mode,  # type: ignore[arg-type]
    )


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


class RetainDelivery:
    def __init__(self, store: Store, sink: RetainSink, config: SessionConfig) -> None:
        self._store = store
        self._sink = sink
        self._config = config
        self._work = anyio.Event()
        # One pass at a time: two passes reading the same outbox rows would send them twice.
        self._pass = anyio.Lock()
        self.delivered = 0
        self.failures = 0

    def notify(self) -> None:
        """New batches are in the outbox (called after they are committed)."""
        self._work.set()

    async def run(self) -> None:
        while True:
            self._work = anyio.Event()
            delivered_all = await self.deliver_pending()
            if delivered_all:
                await self._work.wait()
            else:
                with anyio.move_on_after(self._config.retain_retry_later):
                    await self._work.wait()

    async def drain(self, grace: float) -> bool:
        """Deliver until nothing this process may send is left, or ``grace`` seconds passed.

        True if everything was delivered (batches other processes hold are theirs).
        """
        with anyio.move_on_after(grace):
            try:
                while True:
                    if await self.deliver_pending(busy_is_done=True):
                        break
                    await anyio.sleep(min(self._config.retain_backoff, grace))  # back off before retrying
            except Exception:
                log.exception("delivering the outbox at shutdown failed; the rest is delivered at the next start")
                return False
            return True
        return False

    async def deliver_pending(self, *, busy_is_done: bool = False) -> bool:
        """One pass over the outbox; True if everything seen was delivered.

        With ``busy_is_done``, batches another process holds count as done.
        """
        async with self._pass:
            return await self._deliver_pass(busy_is_done)

    async def _deliver_pass(self, busy_is_done: bool) -> bool:
        try:
            entries = await self._store.pending_retains(_BATCH_LIMIT)
        except Exception:
            log.exception("reading the retain outbox failed; delivery is retried later")
            return False
        by_session: dict[str, list[OutboxEntry]] = defaultdict(list)
        for entry in entries:
            by_session[entry.session_id].append(entry)
        outcome = {"all_delivered": True}
        slots = anyio.CapacityLimiter(_CONCURRENT_SESSIONS)

        async def deliver_session(batches: list[OutboxEntry]) -> None:
            async with slots:
                for entry in batches:  # in order: stop at the first one not delivered
                    delivered = await self._deliver(entry)
                    if delivered is not True:
                        if not (delivered == "busy" and busy_is_done):
                            outcome["all_delivered"] = False
                        return

        async with anyio.create_task_group() as sessions:
            for batches in by_session.values():
                sessions.start_soon(deliver_session, batches)
        return outcome["all_delivered"] and len(entries) < _BATCH_LIMIT

    async def _deliver(self, entry: OutboxEntry) -> bool | Literal["busy"]:
        """Send one batch (retrying); True once it is delivered or no longer exists.

        ``"busy"`` if another process holds it (or an earlier batch of its session).
        """
        config = self._config
        retrying = backoff_retrying(
            config.retain_attempts, config.retain_backoff, config.retain_backoff_max, self._count_failure
        )
        try:
            async for attempt in retrying:
                with attempt:
                    # Read the batch again before every call: a clear or delete
                    # since the pass began may have revised or dropped it, and a
                    # deleted episode must not be handed on after the delete returned.
                    current = await self._store.claim_retain(entry.id, entry.key, CLAIM_SECONDS)
                    if current == "gone":
                        return True
                    if current == "busy":
                        return "busy"
                    if not await self._send_holding_claim(current):  # type: ignore[arg-type]
                        return "busy"  # the claim lapsed mid-call: another process sends it now
        except Exception as exc:
            self.failures += 1
            log.error(
                "retain of session %r seqs %d..%d failed; it stays in the outbox and is retried in %ss",
                entry.session_id,
                entry.first_seq,
                entry.last_seq,
                config.retain_retry_later,
                exc_info=exc,
            )
            await self._record(self._store.mark_retain_failed(entry.id, entry.key, repr(exc)))
            return False
        self.delivered += 1
        # If recording the delivery fails, the batch is sent again later with the same key.
        return await self._record(self._store.mark_retained(entry.id, entry.key))

    async def _send_holding_claim(self, entry: OutboxEntry) -> bool:
        """Hand the batch to the sink, extending the claim while the call lasts.

        False if the claim could not be extended (this process was paused past
        it, and another took the batch over): the call is then cancelled.
        """
        lost = False

        async def hold(scope: anyio.CancelScope) -> None:
            nonlocal lost
            while True:
                await anyio.sleep(CLAIM_SECONDS / 3)
                try:
                    again = await self._store.claim_retain(entry.id, entry.key, CLAIM_SECONDS)
                except Exception:
                    log.exception("extending a retain claim failed; the call goes on")
                    continue
                if isinstance(again, str):
                    lost = True
                    scope.cancel()
                    return

        async with anyio.create_task_group() as sending:
            sending.start_soon(hold, sending.cancel_scope)
            await self._sink.retain(_batch(entry))
            sending.cancel_scope.cancel()
        return not lost

    @staticmethod
    async def _record(operation: Awaitable[None]) -> bool:
        try:
            await operation
        except Exception:
            log.exception("recording a retain delivery in the store failed; the batch stays in the outbox")
            return False
        return True

    def _count_failure(self, state: tenacity.RetryCallState) -> None:
        self.failures += 1
        outcome = state.outcome
        log.warning(
            "retain sink failed (attempt %d: %r); retrying in %.2fs",
            state.attempt_number,
            outcome.exception() if outcome is not None else None,
            state.upcoming_sleep,
        )
