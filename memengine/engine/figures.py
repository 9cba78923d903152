"""The engine's figures: ``stats()``, ``retain_metrics()``, and the samples memengine's gauges read."""

from __future__ import annotations

import logging

import anyio
import anyio.abc

from ..retain.delivery import RetainDelivery, RetainMetrics
from ..session.actor import SessionServices
from ..stats import EngineStats
from ..store.base import SetAsideCounts
from .activations import Activations

log = logging.getLogger("memengine")


#: How often the outbox and set-aside gauges' figures are read from the store (with opentelemetry installed).
OUTBOX_SAMPLE_SECONDS = 5.0


class EngineFigures(Activations):
    """Active sessions, mailboxes, summaries waiting and the retain outbox, as figures."""

    def __init__(
        self, services: SessionServices, tasks: anyio.abc.TaskGroup, delivery: RetainDelivery | None = None
    ) -> None:
        super().__init__(services, tasks, delivery)
        self._outbox_sample: tuple[int, float | None] | None = None  # for the outbox gauges
        self._set_aside_sample: SetAsideCounts | None = None  # for the set-aside gauges

    async def stats(self) -> EngineStats:
        """Active sessions, mailbox depth, episodes waiting for a summary, and the retain outbox.

        The same figures as memengine's OpenTelemetry gauges, with or without
        opentelemetry installed. Reads the store for the outbox figures: a
        checkpoint; if cancelled, nothing changes.
        """
        self._check_caller()
        outbox = RetainMetrics.of(await self._services.store.outbox_state(), 0, 0)
        set_aside = await self._services.store.set_aside_counts()
        depths = [actor.mailbox.depth for actor in self._actors.values()]
        return EngineStats(
            active_sessions=len(self._actors),
            mailbox_depth=sum(depths),
            mailbox_depth_max=max(depths, default=0),
            episodes_waiting_for_summary=self._episodes_waiting_for_summary(),
            outbox_depth=outbox.outbox_depth,
            oldest_undelivered_age=outbox.oldest_undelivered_age,
            summaries_set_aside=set_aside.summaries,
            retains_set_aside=set_aside.retains,
            summary_holes=sum(actor.summary_holes for actor in self._actors.values()),
        )

    def _gauge_figures(self) -> dict[str, float] | None:
        """The figures of memengine's gauges (memengine/telemetry.py), or None once closed.

        The outbox figures are the last sample :meth:`_sample_outbox` took (a gauge cannot await).
        A metric reader may call this from a thread of its own: it only reads, from a copy of the
        activations taken in one step (atomic under the GIL).
        """
        if self._closed:
            return None
        actors = list(self._actors.values())
        figures: dict[str, float] = {
            "memengine.sessions.active": len(actors),
            "memengine.mailbox.depth": sum(actor.mailbox.depth for actor in actors),
            "memengine.summary.waiting_episodes": sum(actor.episodes_waiting_for_summary for actor in actors),
            "memengine.summary.holes": sum(actor.summary_holes for actor in actors),
        }
        if self._outbox_sample is not None:
            depth, oldest_age = self._outbox_sample
            figures["memengine.retain.outbox.depth"] = depth
            if oldest_age is not None:
                figures["memengine.retain.outbox.oldest_age"] = oldest_age
        if self._set_aside_sample is not None:
            figures["memengine.summary.set_aside"] = self._set_aside_sample.summaries
            figures["memengine.retain.set_aside"] = self._set_aside_sample.retains
        return figures

    async def _sample_outbox(self) -> None:
        """Read the store's figures for the gauges every :data:`OUTBOX_SAMPLE_SECONDS` (a gauge cannot await).

        The outbox's only with a retain sink (without one, nothing is added to it); the set-aside counts always.
        """
        while True:
            if self._delivery is not None:
                await self._sample_outbox_once()
            await self._sample_set_aside_once()
            await anyio.sleep(OUTBOX_SAMPLE_SECONDS)

    async def _sample_outbox_once(self) -> None:
        try:
            outbox = RetainMetrics.of(await self._services.store.outbox_state(), 0, 0)
        except Exception as exc:
            log.warning("reading the outbox figures for the gauges failed (%s)", exc)
            return
        self._outbox_sample = (outbox.outbox_depth, outbox.oldest_undelivered_age)

    async def _sample_set_aside_once(self) -> None:
        try:
            self._set_aside_sample = await self._services.store.set_aside_counts()
        except Exception as exc:
            log.warning("reading the set-aside counts for the gauges failed (%s)", exc)

    async def retain_metrics(self) -> RetainMetrics:
        """Outbox depth, age of the oldest undelivered batch, deliveries and failures so far."""
        self._check_caller()
        outbox = await self._services.store.outbox_state()
        delivered, failures = (0, 0) if self._delivery is None else (self._delivery.delivered, self._delivery.failures)
        return RetainMetrics.of(outbox, delivered, failures)
