"""What the summarizer child reports, and the set-aside mark: the session actor's summary handlers.

The actor's mailbox loop hands these messages here (session/actor.py keeps the
one place that maps message types to handlers):

- ``SummaryStored``: the bookkeeping moves on (session/summary.py); the actor
  then answers the reads that waited for it;
- ``SummaryFailed``: the batch is tried again later, or, after
  ``summarize_set_aside_after`` failed rounds in a row, *set aside*: recorded
  in the store (store/set_aside.py), then here. The reads waiting for it are
  told why, rather than kept waiting;
- ``RetrySummary`` (``engine.retry_set_aside()``) lifts the mark in the store
  and here; an idle ``Tick`` checks whether the mark was lifted in the store
  by another process (``memengine set-aside retry``).

Every write carries the session's lease token; an error meaning this
activation may no longer hold the store's truth gives the session up
(through the ``give_up`` it is handed), as anywhere in the actor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from ..config import SessionConfig
from ..errors import StoreError, SummaryError
from ..privacy.error_text import error_label, error_text
from ..store.base import SetAside, Store
from .lease import SessionLease, means_reload
from .messages import SummaryFailed, SummaryStored
from .summary import SessionSummary
from .window import RawWindow

log = logging.getLogger("memengine.session")


class SummaryResults:
    """Handles the summarizer child's reports and the set-aside mark for one activation."""

    def __init__(
        self,
        session_id: str,
        store: Store,
        config: SessionConfig,
        summary: SessionSummary,
        window: RawWindow,
        lease: SessionLease,
        give_up: Callable[[BaseException], None],
    ) -> None:
        self._session_id = session_id
        self._store = store
        self._config = config
        self._summary = summary
        self._window = window
        self._lease = lease
        self._give_up = give_up

    def dispatch(self) -> None:
        """Hand the oldest pending episodes to the child, if nothing is in flight, waiting or set aside."""
        self._summary.dispatch(self._window, self._lease.current())

    def stored(self, message: SummaryStored) -> bool:
        """The child stored a summary; True if it covers more of the window (then waiting reads may be answered)."""
        return self._summary.stored(message, self._window, anyio.current_time())

    async def failed(self, message: SummaryFailed) -> SummaryError | None:
        """The child gave up on a batch: the error to fail the reads waiting for a summary with, if any.

        None when the report is stale (from before a clear or delete) or the
        session was given up over it: then the waiting reads stay as they are.
        """
        if means_reload(message.error):
            self._give_up(message.error)
            return None
        if not self._summary.failed(message, anyio.current_time()):
            return None
        if self._summary.rounds_exhausted and await self._set_aside(message):
            return set_aside_error(self._session_id, self._summary.set_aside)  # type: ignore[arg-type]
        if isinstance(message.error, StoreError):
            what = f"storing the summary of the episodes up to seq {message.through_seq} failed"
        else:
            attempts = f"{message.attempts} attempt{'s' if message.attempts != 1 else ''}"
            what = f"summarizing the episodes up to seq {message.through_seq} failed after {attempts}"
        return SummaryError(
            f"session {self._session_id!r}: {what} ({error_text(message.error)}); they stay pending, shown raw, "
            f"and are tried again in {self._config.summarize_retry_later:g} s"
        )

    async def _set_aside(self, message: SummaryFailed) -> bool:
        """Record the batch as set aside in the store, then here; True once it is (log at ERROR, once)."""
        summary = self._summary
        # A batch of evicted episodes starts after the summary; a segmented session's repair, at its node.
        first = summary.through + 1 if message.first_seq is None else message.first_seq
        try:
            recorded = await self._store.set_summary_aside(
                self._session_id,
                self._lease.current(),
                summary.generation,
                message.through_seq,
                summary.failed_attempts,
                error_text(message.error),
                first_seq=message.first_seq,
            )
        except Exception as exc:
            if means_reload(exc):
                self._give_up(exc)
            else:
                log.error("session %r: recording its set-aside summary batch failed (%s)", self._session_id, exc)
            return False  # tried again next round, as before
        if not recorded:
            return False
        summary.put_aside(
            SetAside(
                "summary",
                self._session_id,
                first,
                message.through_seq,
                summary.failed_attempts,
                error_text(message.error),
                time.time(),
            )
        )
        log.error(
            "session %r: summarizing episodes %d..%d failed in %d round(s) in a row (%d attempts; last error %s); "
            "set aside: they stay stored and shown raw, and nothing more is summarized for this session until "
            "engine.retry_set_aside() or `memengine set-aside retry`",
            self._session_id,
            first,
            message.through_seq,
            summary.failed_rounds,
            summary.failed_attempts,
            error_label(message.error),  # its text is in the mark (privacy/error_text.py)
        )
        return True

    async def recheck_set_aside(self) -> None:
        """At an idle tick: whether the store still holds the mark (``memengine set-aside retry`` lifts it there)."""
        try:
            current = await self._store.summary_set_aside(self._session_id)
        except Exception as exc:
            log.debug("session %r: reading its set-aside mark failed (%s)", self._session_id, exc)
            return
        if current is None and self._summary.set_aside is not None:
            log.warning(
                "session %r: its set-aside summary batch was lifted in the store; tried again", self._session_id
            )
            self._summary.retry_now()
            self.dispatch()

    async def retry(self) -> bool:
        """``engine.retry_set_aside()``: lift the mark in the store and here; True if there was one."""
        lifted = await self._store.lift_summary_set_aside(self._session_id, self._lease.current())
        was_set_aside = self._summary.retry_now()
        if lifted or was_set_aside:
            log.warning("session %r: its set-aside summary batch is tried again", self._session_id)
        self.dispatch()
        return lifted or was_set_aside


def set_aside_error(session_id: str, record: SetAside) -> SummaryError:
    """What a read waiting for a summary is told while the session's batch is set aside."""
    return SummaryError(
        f"session {session_id!r}: the summary of episodes {record.first_seq}..{record.last_seq} is set aside "
        f"after {record.attempts} failed attempts (last error: {record.error}); they stay shown raw, and nothing "
        "is summarized for this session until engine.retry_set_aside() or `memengine set-aside retry`"
    )
