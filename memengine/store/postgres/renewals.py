"""Lease renewals on a connection of their own (PostgreSQL).

A renewal must never wait behind the writes queued before it, nor behind a
write transaction that meets a lock (another replica frozen mid-write holds
its rows until the server ends its session): if it did, this process's own
leases would lapse while it is healthy. So on PostgreSQL, renewals do not go
through the group committer but run on a third connection, one short
transaction each, in their own thread. (On SQLite, one writer at a time, they
go into the committer's next transaction, ahead of everything queued.)

A renewal whose caller is cancelled is left to finish (it only extends leases
that are still this process's). Closing waits a moment for a renewal in
progress; one that does not return then is left behind and closes the
connection itself when it does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from ...errors import EngineClosedError, StoreError
from ...retrying import with_retries_in_thread
from .. import leases
from ..dialect import Db, Dialect
from .replies import give_up

log = logging.getLogger("memengine.store")

#: Tries of one renewal (a lost connection or a deadlock is tried again at once, retrying.py).
_ATTEMPTS = 4
#: Seconds closing waits for a renewal in progress before leaving it behind.
_CLOSE_WAIT = 2.0


class RenewalConnection:
    """Runs :func:`leases.renew` on a connection opened (and reopened) by ``connect``."""

    def __init__(self, connect: Callable[[], Any], dialect: Dialect) -> None:
        self._connect = connect
        self._dialect = dialect
        self._conn: Any = None
        self._lock = threading.Lock()  # one thread on the connection at a time
        self._state = threading.Lock()
        self._closed = False
        # Its own thread slot: renewals never queue behind reads, sink calls or the app's threads.
        self._slot = anyio.CapacityLimiter(1)

    async def renew(self, owner: str, held: Iterable[tuple[str, int]], ttl: float) -> set[str]:
        if self._closed:
            raise EngineClosedError("the store is closed")
        held = list(held)
        return await anyio.to_thread.run_sync(self._renew, owner, held, ttl, limiter=self._slot, abandon_on_cancel=True)

    def _renew(self, owner: str, held: list[tuple[str, int]], ttl: float) -> set[str]:
        with self._lock:
            try:
                return with_retries_in_thread(
                    lambda: self._renew_once(owner, held, ttl), _ATTEMPTS, self._worth_again, self._log_again
                )
            except self._dialect.errors as exc:
                raise StoreError(f"renewing leases failed: {exc}") from exc
            finally:
                with self._state:
                    left_behind = self._closed
                if left_behind:
                    self._close_connection()

    def _renew_once(self, owner: str, held: list[tuple[str, int]], ttl: float) -> set[str]:
        if self._closed:
            raise EngineClosedError("the store is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self._connect()
        # First every lease whose row is free, committed at once; then those whose rows a transaction of
        # this process's writes holds (a part of a large add): one such wait let every other lease lapse.
        with self._conn.transaction():
            renewed = leases.renew(Db(self._conn, self._dialect), owner, held, ttl, skip_locked=True)
        rest = [lease for lease in held if lease[0] not in renewed]
        if rest:
            try:
                with self._conn.transaction():
                    more = leases.renew(Db(self._conn, self._dialect), owner, rest, ttl)
                renewed |= more  # only once committed
            except self._dialect.too_slow as exc:
                # Their rows stayed locked past lock_timeout: by a part of a large add (which extends its
                # lease itself as it commits, journal.append_part) or by a frozen writer. Not renewed now,
                # which is not lost: each session left out renews alone (session/actor.py, LeaseNotRenewed).
                log.info("renewing %d leases waited too long for their rows (%s); renewed the others", len(rest), exc)
        return renewed

    def _worth_again(self, exc: BaseException) -> bool:
        """Dropped while idle, or deadlocked with a writer (the server broke it): a new try, at once."""
        if not isinstance(exc, self._dialect.errors):
            return False
        lost = self._conn is None or self._conn.closed or self._conn.broken
        return lost or isinstance(exc, self._dialect.transient)

    @staticmethod
    def _log_again(attempt: int, exc: BaseException) -> None:
        log.info("renewing leases met %r; trying again", exc)

    def close(self, wait: float = _CLOSE_WAIT) -> None:
        """Close the connection (in a thread), after a renewal in progress (``wait`` seconds at most).

        A renewal that does not return in time is left behind: it closes the connection when it returns.
        """
        acquired = self._lock.acquire(timeout=max(wait, 0.0))
        with self._state:
            self._closed = True
        if not acquired and not self._lock.acquire(blocking=False):
            log.error("a lease renewal did not return in time; leaving it behind")
            give_up(self._conn)
            return
        try:
            self._close_connection()
        finally:
            self._lock.release()

    def _close_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
