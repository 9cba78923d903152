"""Side work beside the store's operations: lease renewals, this engine's liveness, reaping the dead.

Lease renewals go into the very next transaction, ahead of everything queued.
The liveness lock (liveness.py) is held while the engine runs and checked
every heartbeat (:meth:`SideWork.keep_alive`); a process whose lock is gone
is reaped by the others (owners.py). A forked child renews nothing of its
parent's. A backend's own side work (SQLite's checkpoints, PostgreSQL's
renewal connection) is in its folder.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import anyio

from . import handover, leases, owners
from .committer import Committer
from .dialect import Db, Dialect
from .liveness import HEARTBEAT_SECONDS

log = logging.getLogger("memengine.store")


class SideWork(Committer):
    """Lease keeping, the liveness lock and reaping, over the group commit."""

    def __init__(self, conn: Any, dialect: Dialect, owner: str | None = None, reader: Any | None = None) -> None:
        super().__init__(conn, dialect, owner, reader)
        self._alive_until = math.inf  # see alive_until
        self._reaped_until = -math.inf  # reaped while its lock was lost: memory is not the store until then
        self._registration_due = False  # the lock was taken back and not yet registered again (see keep_alive)
        self._registration_unsure = False  # a registration since then failed or was given up on: it may have committed
        self._liveness_slot = anyio.CapacityLimiter(1)

    # -- leases ----------------------------------------------------------------

    async def renew_leases(self, held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        if self.forked():
            return set()  # the parent's leases: never renewed from a forked child
        # Urgent: a lease must never lapse because writes were queued ahead of its renewal.
        return await self._submit(lambda db: leases.renew(db, self.owner, held, ttl), urgent=True)

    async def release_lease(self, session_id: str, token: int) -> None:
        await self._submit(lambda db: leases.release(db, session_id, token))

    async def release_leases(self) -> None:
        liveness = self._liveness

        def release(db: Db) -> None:
            leases.release_all(db, self.owner)
            if liveness is not None:
                owners.unregister(db, liveness)

        await self._submit(release)

    # -- liveness (store/owners.py) --------------------------------------------

    async def start_liveness(self) -> None:
        liveness = self._new_liveness()
        if liveness is None:
            return
        try:
            await anyio.to_thread.run_sync(liveness.hold, limiter=self._liveness_slot)
        except Exception as exc:
            log.warning(
                "this engine cannot hold a liveness lock (%s): if it dies, its sessions wait for their leases "
                "to expire",
                exc,
            )
            return
        asked_at = anyio.current_time()
        await self._submit(lambda db: owners.register(db, self.owner, liveness))
        self._liveness = liveness
        self._alive_until = self._alive_after(asked_at)

    def alive_until(self) -> float:
        if anyio.current_time() < self._reaped_until:
            return -math.inf  # every read renews its lease first: those reaped fail (keep_alive)
        return self._alive_until

    def _alive_after(self, asked_at: float) -> float:
        """How long after a check that found the liveness lock held (asked at ``asked_at``) it may be counted on.

        Another process reaps this one no sooner than ``grace`` after it saw the lock gone (which was
        after ``asked_at``); two heartbeats are kept as a margin for noticing and cancelling.
        """
        assert self._liveness is not None
        grace = self._liveness.grace
        return math.inf if grace == 0 else asked_at + grace - 2 * HEARTBEAT_SECONDS

    def forked(self) -> bool:
        """Whether this is a forked child of the process that opened the store: its leases are the parent's."""
        return os.getpid() != self._pid

    async def keep_alive(self) -> bool:
        liveness = self._liveness
        if liveness is None or self.forked():
            return True
        asked_at = anyio.current_time()
        held = await anyio.to_thread.run_sync(liveness.check, limiter=self._liveness_slot, abandon_on_cancel=True)
        if not held:
            self._registration_due = True  # until a registration commits: a failed one is made again next time
        if self._registration_due:
            # Back among the living. If it was reaped meanwhile, its leases may have been released and taken:
            # no lease known valid by this process's clock before now may be counted on. Every one was
            # renewed before now and lasts at most the longest ttl: until then, every read renews first.
            # Assumed until a registration says otherwise: one that failed or was given up on (cancelled)
            # may have committed unseen, and then the next one finds the registration there.
            before = self._reaped_until
            self._reaped_until = max(before, anyio.current_time() + self._longest_ttl)
            proof = not self._registration_unsure
            self._registration_unsure = True
            registered = await self._submit(lambda db: owners.register(db, self.owner, liveness))
            self._registration_due = self._registration_unsure = False
            if registered and proof:
                self._reaped_until = before
            elif not registered:
                log.warning("this engine was taken for dead while its liveness lock was lost: checking its leases")
            asked_at = anyio.current_time()  # counted from now: it was not held all along
        self._alive_until = self._alive_after(asked_at)
        return bool(held)

    async def wanted_sessions(self) -> list[str]:
        return await self._read(lambda db: handover.wanted(db, self.owner))

    async def reap_dead_owners(self, among: Sequence[str] | None = None) -> owners.Reaped:
        liveness = self._liveness
        if liveness is None:
            return owners.NOTHING_REAPED
        dead, others = await self._read(lambda db: owners.dead_owners(db, liveness, self.owner, among))
        if not dead:
            return owners.Reaped(others=others)
        reaped = await self._submit(lambda db: owners.reap(db, liveness, self.owner, dead))
        if reaped.incarnations:  # committed: nobody checks them again
            await anyio.to_thread.run_sync(liveness.forget, reaped.incarnations)
        return reaped
