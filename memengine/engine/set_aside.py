"""Work set aside after too many failed rounds: listing it, trying it again, discarding retain batches."""

from __future__ import annotations

import logging

from ..actor.reply import Reply
from ..errors import EngineClosedError
from ..session.messages import RetrySummary
from ..store.base import SetAside
from .activations import Activations

log = logging.getLogger("memengine")


#: Set-aside work listed (and retried together) at most.
MAX_SET_ASIDE_LISTED = 10_000


class SetAsideOperations(Activations):
    """``list_set_aside``, ``retry_set_aside`` and ``discard_set_aside``."""

    async def list_set_aside(self, session_id: str | None = None) -> list[SetAside]:
        """Work set aside after too many failed rounds (of one session, or all), summaries first.

        A read of the store (every process's work): a checkpoint; if cancelled, nothing changes.
        """
        self._check_caller()
        if session_id is not None:
            self.session(session_id)  # the same validation as a handle
        return await self._services.store.list_set_aside(session_id, MAX_SET_ASIDE_LISTED)

    async def retry_set_aside(self, session_id: str | None = None) -> int:
        """Try set-aside work again (of one session, or all); return how many batches were set aside.

        A set-aside summary batch is tried at once by the session, activated
        here if it was not (its mark is lifted in the store first); its
        counting of failed rounds starts afresh. A set-aside retain batch is
        due at once again, with its attempts counted afresh. If cancelled,
        the sessions already told try again; the rest stay set aside.
        """
        self._check_caller()
        if self._closed:
            raise EngineClosedError("the engine is closed")
        store = self._services.store
        if session_id is not None:
            self.session(session_id)  # the same validation as a handle
            sessions = [session_id]
        else:
            listed = await store.list_set_aside(None, MAX_SET_ASIDE_LISTED)
            sessions = [work.session_id for work in listed if work.kind == "summary"]
        retried = 0
        for one in sessions:
            reply: Reply[bool] = Reply()
            await self._send(one, RetrySummary(reply))
            retried += await reply.wait()
        retains = await store.retry_set_aside_retains(session_id)
        if retains:
            log.warning("%d set-aside retain batch%s tried again", retains, "" if retains == 1 else "es")
            if self._delivery is not None:
                self._delivery.notify()
        return retried + retains

    async def discard_set_aside(self, session_id: str | None = None) -> list[SetAside]:
        """Drop set-aside retain batches (of one session, or all) from the outbox; return what was dropped.

        The sink never gets them, and the session's later batches go out
        next. Each is logged at WARNING. Summary batches cannot be discarded
        (a summary must cover every live episode before it): retry them, or
        delete their episodes (:meth:`Session.delete_episodes`, which lifts
        the mark). A checkpoint; if cancelled, the batches may still be dropped.
        """
        self._check_caller()
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if session_id is not None:
            self.session(session_id)
        dropped = await self._services.store.discard_set_aside_retains(session_id)
        for work in dropped:
            log.warning(  # not its error text, which may quote the episodes (privacy/error_text.py)
                "discarded the set-aside retain batch of session %r seqs %d..%d: the sink never gets it",
                work.session_id,
                work.first_seq,
                work.last_seq,
            )
        if dropped and self._delivery is not None:
            self._delivery.notify()
        return dropped
