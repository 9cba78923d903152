"""The delivery actor: sends outbox batches to the retain sink, exactly once and in order.

It runs under the engine's task group, apart from every writer: ``add`` and
``close`` only record batches in the outbox, so a slow or failing sink cannot
slow them. Batches of one session go out in order (a session's later batch
waits while an earlier one is failing); sessions are served concurrently. A
batch leaves the outbox only after the sink returned; one the sink refuses is
retried with backoff and jitter, then again after ``retain_retry_later``
seconds, and after a restart. The batch's ``key`` lets a sink drop a batch it
stored but could not acknowledge (a crash between the two).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Awaitable

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
        """Deliver until the outbox is empty or ``grace`` seconds passed; True if it emptied."""
        with anyio.move_on_after(grace):
            try:
                while (await self._store.outbox_state()).depth:
                    if not await self.deliver_pending():
                        await anyio.sleep(min(self._config.retain_backoff, grace))
            except Exception:
                log.exception("delivering the outbox at shutdown failed; the rest is delivered at the next start")
                return False
            return True
        return False

    async def deliver_pending(self) -> bool:
        """One pass over the outbox; True if everything seen was delivered."""
        async with self._pass:
            return await self._deliver_pass()

    async def _deliver_pass(self) -> bool:
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
                    if not await self._deliver(entry):
                        outcome["all_delivered"] = False
                        return

        async with anyio.create_task_group() as sessions:
            for batches in by_session.values():
                sessions.start_soon(deliver_session, batches)
        return outcome["all_delivered"] and len(entries) < _BATCH_LIMIT

    async def _deliver(self, entry: OutboxEntry) -> bool:
        """Send one batch (retrying); True once it is delivered or no longer exists."""
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
                    current = await self._store.retain_entry(entry.id, entry.key)
                    if current is None:
                        return True
                    await self._sink.retain(_batch(current))
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
