"""The owner watch: this engine's liveness, reaping dead engines, taking on orphans, handing sessions over.

Every heartbeat the engine keeps its liveness lock (store/owners.py) and
reaps engines that died; every ``lease_ttl`` it takes on what no live process
owns (their retain tails, their pending summaries); while other engines share
the store, it hands over the sessions they wait for (store/handover.py).
"""

from __future__ import annotations

import logging
import math

import anyio
import anyio.abc

from ..retain.batch import RetainMode
from ..retain.delivery import RetainDelivery
from ..session.actor import SessionServices
from ..session.messages import HandOver
from ..store.liveness import HEARTBEAT_SECONDS
from .activations import Activations

log = logging.getLogger("memengine")


#: How often an engine looks for sessions another process waits for (store/handover.py).
HAND_OVER_SECONDS = 0.25


class OwnerWatch(Activations):
    """Liveness, reaping and orphans: what the engine does for the other processes on its store."""

    def __init__(
        self, services: SessionServices, tasks: anyio.abc.TaskGroup, delivery: RetainDelivery | None = None
    ) -> None:
        super().__init__(services, tasks, delivery)
        self._others_running = anyio.Event()  # set while other engines are registered on the store

    async def _recover_orphans(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Take on what no live process owns: at start, then every ``lease_ttl``.

        Sessions left by a crashed run or a dead replica (their leases expired,
        or released at once by :meth:`_watch_owners`) get their un-retained
        tails recorded for delivery and, if their evicted episodes are
        unsummarized, are activated to summarize them. Those that need nothing
        more are released (store/orphans.py), so the sweep does not grow with
        every process that ever died.
        """
        config = self._services.config
        if resume_summaries:
            # At start: also sessions a crashed run of this same owner name left.
            await self._resume_pending_summaries(orphaned_only=False)
        while True:
            await anyio.sleep(config.lease_ttl)
            await self._take_on_orphans(resume_summaries, mode)
            try:
                # What was handled (now or by an earlier sweep) is let go: the sweep stays small.
                await self._services.store.release_orphans(
                    config.max_episodes, config.max_chars, retaining=self._delivery is not None
                )
            except Exception:
                log.exception("could not release the leases of sessions whose owner died")

    async def _take_on_orphans(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Record the retain tails of sessions no live process owns, and summarize what they left pending."""
        if resume_summaries:
            await self._resume_pending_summaries(orphaned_only=True)
        if self._delivery is not None:
            try:
                if await self._services.store.enqueue_all_retains(
                    mode, orphaned_only=True, batch_size=self.config.retain_every
                ):
                    self._delivery.notify()
            except Exception:
                log.exception("could not record the retain tails of sessions no process owns")

    def _others_seen(self, others: bool) -> None:
        if others and not self._others_running.is_set():
            self._others_running.set()
        elif not others and self._others_running.is_set():
            self._others_running = anyio.Event()

    async def _hand_over_wanted(self) -> None:
        """Every quarter second, tell the sessions another process waits for to go once idle (store/handover.py).

        Only while other engines are registered on the store (:meth:`_watch_owners` tells).
        """
        while True:
            await self._others_running.wait()
            await anyio.sleep(HAND_OVER_SECONDS)
            if not self._actors:
                continue
            try:
                wanted = await self._services.store.wanted_sessions()
            except Exception as exc:
                log.warning("looking for sessions other processes wait for failed (%s)", exc)
                continue
            for session_id in wanted:
                actor = self._actors.get(session_id)
                if actor is not None:
                    actor.mailbox.put_if_open(HandOver())

    async def _watch_owners(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Every second: keep this engine's liveness lock, and take on at once what dead owners left.

        See store/owners.py. If the lock was lost meanwhile (PostgreSQL: its
        connection dropped), other processes may void this process's retain
        claims after a grace, so every sink call in flight is cancelled now.
        A check that does not answer within two seconds counts as lost.
        """
        store = self._services.store
        period = HEARTBEAT_SECONDS
        while True:
            await anyio.sleep(period)
            held = False
            with anyio.move_on_after(2 * HEARTBEAT_SECONDS):
                try:
                    held = await store.keep_alive()
                except Exception as exc:
                    log.warning("checking this engine's liveness lock failed (%s)", exc)
            if self._delivery is not None:
                if held:
                    self._delivery.alive_moved()  # sink calls are bounded by store.alive_until, just moved
                else:
                    self._delivery.drop_claims()  # reads wait for a renewal by themselves (store.alive_until)
            try:
                reaped = await store.reap_dead_owners()
            except Exception as exc:
                log.warning("looking for engines that died failed (%s); looking again in a second", exc)
                period = HEARTBEAT_SECONDS
                continue
            self._others_seen(reaped.others)
            if self._delivery is not None:
                # What another process records (a batch, or a forget: `memengine forget` has no sink, and may
                # come and go between two heartbeats) wakes only that process: this one looks at each heartbeat.
                self._delivery.notify()
            # Alone on a store whose liveness lock cannot be lost (SQLite), there is nobody to look
            # after often: an engine that registers is found within a third of lease_ttl.
            alone = not reaped.others and store.alive_until() == math.inf
            period = max(HEARTBEAT_SECONDS, self._services.config.lease_ttl / 3) if alone else HEARTBEAT_SECONDS
            if reaped.owners:
                log.info("took over from engines that died: %s", ", ".join(reaped.owners))
                await self._take_on_orphans(resume_summaries, mode)
                if self._delivery is not None:
                    self._delivery.notify()

    async def _resume_pending_summaries(self, orphaned_only: bool) -> None:
        """Activate sessions left with evicted, unsummarized episodes (by a crash or shutdown)."""
        config = self._services.config
        try:
            pending = await self._services.store.sessions_needing_summary(
                config.max_episodes, config.max_chars, orphaned_only=orphaned_only
            )
        except Exception:
            log.exception("could not look for sessions with pending summaries")
            return
        for session_id in pending:
            if not self._closed and session_id not in self._actors:
                self._activate(session_id)
