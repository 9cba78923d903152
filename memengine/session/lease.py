"""The session's lease, as one activation holds it: taken on activation, renewed, checked before reads.

Across processes a session is leased (see store/leases.py): the activation
takes the lease when it starts, waiting up to ``lease_wait`` for another
owner; every write carries the lease's fencing token; the engine renews every
active lease every third of ``lease_ttl``. Reads are answered from memory only
while the lease is known to be valid by this process's clock; otherwise it is
renewed first, or the session is given up.

:func:`means_reload` says which errors mean an activation's memory may no
longer be the store's; the activation then gives the session up, and its
unhandled messages go to a new activation (hand_on.py).
"""

from __future__ import annotations

import logging
import math

import anyio

from ..config import SessionConfig
from ..errors import LeaseLostError, SessionBusyError, StoreError, UncertainCommitError
from ..retrying import doubling_pause
from ..store.base import SessionSnapshot, Store

log = logging.getLogger("memengine.session")


def means_reload(error: BaseException | None) -> bool:
    """Whether an activation's memory may no longer be the store's after ``error`` (then it gives the session up)."""
    return isinstance(error, LeaseLostError | UncertainCommitError)


class SessionLease:
    def __init__(self, session_id: str, store: Store, config: SessionConfig) -> None:
        self._session_id = session_id
        self._store = store
        self._config = config
        #: The fencing token once the lease is taken.
        self.token: int | None = None
        self._valid_until = -math.inf  # by this process's clock, the lease is surely ours until then

    async def activate(self) -> SessionSnapshot:
        """:meth:`acquire`, its failures as the activation's callers are told them.

        :class:`SessionBusyError` if another owner kept the session past
        ``lease_wait``; any other failure is logged and raised as a
        :class:`StoreError` naming the session.
        """
        try:
            return await self.acquire()
        except SessionBusyError:
            raise
        except Exception as exc:
            log.error("session %r could not be activated: %s", self._session_id, exc)
            log.debug("session %r: activation failed", self._session_id, exc_info=exc)
            raise StoreError(f"session {self._session_id!r} could not be loaded: {exc}") from None

    async def acquire(self) -> SessionSnapshot:
        """Take the lease and load the session's state, waiting up to ``lease_wait`` for another owner."""
        started = anyio.current_time()
        polls = 0  # tries that found the session busy or the commit in doubt: the pause doubles with them
        reaped: set[str] = set()  # owners already checked for life
        while True:
            attempt = anyio.current_time()
            try:
                self.token, snapshot = await self._store.activate(self._session_id, self._config.lease_ttl)
            except UncertainCommitError as doubt:
                # Taking the lease is safe to repeat: whether or not it landed, this owner may take it again.
                if anyio.current_time() - started > self._config.lease_wait:
                    raise
                log.info("session %r: activation in doubt (%s); activating again", self._session_id, doubt)
                polls += 1
                await anyio.sleep(doubling_pause(polls, 0.02, 0.5))
                continue
            except SessionBusyError as busy:
                if not busy.locked and busy.owner not in reaped:
                    # Its owner may have died: then its leases are released now (store/owners.py).
                    reaped.add(busy.owner)
                    if (await self._store.reap_dead_owners([busy.owner])).owners:
                        continue
                waited = anyio.current_time() - started
                left = self._config.lease_wait - waited
                if left <= 0:
                    raise SessionBusyError(
                        self._session_id, busy.owner, busy.expires_in, waited, locked=busy.locked
                    ) from None
                # The owner was asked to hand the session over once idle (store/handover.py): look often.
                polls += 1
                pause = doubling_pause(polls, 0.02, 0.5 if busy.locked else 0.2)
                await anyio.sleep(min(pause, left, pause if busy.locked else max(busy.expires_in, 0.0) + 0.01))
                continue
            self.renewed(attempt)
            return snapshot

    def renewed(self, asked_at: float) -> None:
        """The store extended the lease at some moment after ``asked_at`` (this process's clock)."""
        # A tenth of the ttl to spare: the two clocks may run at slightly different rates.
        self._valid_until = asked_at + self._config.lease_ttl * 0.9

    async def ensure_valid(self) -> None:
        """Renew the lease if it may have lapsed; :class:`LeaseLostError` if another process has it now."""
        if anyio.current_time() < min(self._valid_until, self._store.alive_until()):
            return
        await self.renew()

    async def renew(self) -> None:
        """Renew the lease now; :class:`LeaseLostError` if the store did not renew it (expired or taken over)."""
        asked_at = anyio.current_time()
        if self._session_id not in await self._store.renew_leases(
            [(self._session_id, self.current())], self._config.lease_ttl
        ):
            raise LeaseLostError(f"session {self._session_id!r}: this process's lease expired or was taken over")
        self.renewed(asked_at)

    def current(self) -> int:
        """The fencing token every write of this activation carries."""
        assert self.token is not None, "a session writes only once activated"
        return self.token

    async def release(self) -> None:
        """Give the session up in the store (passivation); a failure only means it expires on its own."""
        if self.token is None:
            return
        try:
            await self._store.release_lease(self._session_id, self.token)
        except Exception as exc:
            log.warning("session %r: releasing its lease failed (%s); it expires on its own", self._session_id, exc)
