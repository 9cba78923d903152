"""Handing a session's episodes on to the retain outbox: every ``retain_every`` episodes, the rest at a boundary.

Batches are only *recorded* here (in the outbox, in the same transaction as
the session's watermark); the delivery actor sends them. A full batch is
recorded without waiting (its completion runs right after the commit); the
partial batch at a boundary (close, passivation) is awaited; a failure at
passivation keeps the session active, to try again at the next boundary. One
outbox write of a session is in flight at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import attrs

from ..errors import EngineClosedError, LeaseLostError, MemEngineError, UncertainCommitError
from ..retain.batch import RetainMode
from ..retain.delivery import RetainDelivery
from ..store.base import Store

log = logging.getLogger("memengine.session")


@attrs.frozen
class RetainPlan:
    """How sessions hand their episodes on to long-term memory (absent without a sink)."""

    mode: RetainMode
    every: int
    delivery: RetainDelivery


class RetainFlush:
    def __init__(
        self,
        session_id: str,
        store: Store,
        plan: RetainPlan,
        last_seq: Callable[[], int],
        token: Callable[[], int],
        lost: Callable[[MemEngineError], None],
    ) -> None:
        self._session_id = session_id
        self._store = store
        self._plan = plan
        self._last_seq = last_seq
        self._token = token
        self._lost = lost
        #: Every seq up to here is in the outbox, delivered, or deleted.
        self.retained_through = 0
        self._in_flight = False
        self._settled: anyio.Event | None = None  # made only when a flush must wait

    @property
    def busy(self) -> bool:
        return self._in_flight

    def adopt(self, retained_through: int) -> None:
        self.retained_through = retained_through

    def removed(self) -> None:
        """A delete or clear committed: it may have recorded a forget for the delivery actor to send."""
        self._plan.delivery.notify()

    def has_unretained(self) -> bool:
        return self._last_seq() > self.retained_through

    def if_due(self) -> None:
        """Every ``retain_every`` new episodes, record a batch in the outbox (not awaited)."""
        last_seq = self._last_seq()
        if self._in_flight or last_seq - self.retained_through < self._plan.every:
            return
        # Exactly retain_every episodes per batch; the completion checks for the next ones.
        try:
            self._store.submit_retain(
                self._session_id, self._token(), self._plan.mode, last_seq, self._plan.every, self._recorded
            )
        except EngineClosedError:
            return  # the store is closing: the tail is recorded on the way out, or at the next start
        self._in_flight = True

    def _recorded(self, retained_through: int | None, error: BaseException | None) -> None:
        """Completion of :meth:`if_due`, run by the store right after its commit."""
        self._in_flight = False
        self._wake_flush()
        if isinstance(error, LeaseLostError | UncertainCommitError):
            self._lost(error)  # the session reloads before its next operation
            return
        if error is not None or retained_through is None:
            log.error("session %r: recording a retain batch failed (%s); it is retried", self._session_id, error)
            return
        self.retained_through = retained_through
        self._plan.delivery.notify()
        self.if_due()

    async def flush(self) -> None:
        """A boundary: record every episode not yet handed on (up to the last acknowledged one).

        Usually fewer than ``retain_every`` are left, one partial batch; a longer
        tail (recording a batch failed meanwhile) goes as batches of ``retain_every``.
        """
        while self._in_flight:  # one outbox write of this session at a time
            if self._settled is None:
                self._settled = anyio.Event()
            await self._settled.wait()
        self._in_flight = True
        try:
            self.retained_through = await self._store.enqueue_retain(
                self._session_id, self._token(), self._plan.mode, self._last_seq(), batch_size=self._plan.every
            )
        finally:
            self._in_flight = False
            self._wake_flush()
        self._plan.delivery.notify()

    async def flush_before_passivating(self) -> bool:
        """The boundary of passivation: :meth:`flush`; False if it failed, and the session stays active.

        A failure that means the session's memory may be stale gives it up
        (through ``lost``); any other is logged, and the batch is recorded at
        the next idle period or close.
        """
        try:
            await self.flush()
        except Exception as exc:
            if isinstance(exc, LeaseLostError | UncertainCommitError):
                self._lost(exc)
            else:
                log.error("session %r: recording its retain batch failed (%s)", self._session_id, exc)
            return False
        return True

    def _wake_flush(self) -> None:
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()
