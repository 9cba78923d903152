"""Handing a given-up session's messages on to a new activation.

An activation whose memory may no longer be the store's (its lease was lost,
or a commit is in doubt: :func:`~memengine.session.lease.means_reload`) gives
the session up at once (``SessionActor._give_up``): it answers nothing more,
and the client messages it had not handled go, in their order, to a new
activation, which loads the session from the store. This module keeps those
messages and hands them on; the engine gives the new activation (``hand_on``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..actor.mailbox import Mailbox
from ..errors import MemEngineError
from .messages import ClientMessage, ReadContext, SessionMessage


class NotHandled(Exception):
    """Raised by a handler: the session was given up meanwhile; the message is left to a new activation."""


class HandOn:
    """The client messages an activation that gave its session up leaves to the next one."""

    def __init__(
        self,
        session_id: str,
        mailbox: Mailbox[SessionMessage],
        hand_on: Callable[[str, ClientMessage], None] | None,
    ) -> None:
        self._session_id = session_id
        self._mailbox = mailbox
        self._hand_on = hand_on
        self._kept: list[ClientMessage] = []  # for the next activation, before the mailbox's rest

    def keep(self, message: ClientMessage) -> None:
        """A message this activation did not handle (:class:`NotHandled`): the next one does."""
        self._kept.append(message)

    def keep_if_abandoned(self, message: ClientMessage) -> bool:
        """After giving the session up over ``message``'s own write: keep it for the next activation if nobody waits.

        It was sent, so it is carried out, by the next activation (a caller
        still waiting is told the error instead, and may retry). Running a
        write again is safe: an add is idempotent by episode id, a delete by
        seq, and a clear leaves the same empty session.
        """
        if not message.reply.abandoned or isinstance(message, ReadContext) or self._mailbox.closed:
            return False
        self._kept.append(message)
        return True

    def take_kept(self) -> list[ClientMessage]:
        kept, self._kept = self._kept, []
        return kept

    def pass_to_next(self, unanswered: list[Any]) -> list[Any]:
        """Give the unanswered messages of a given-up activation to a new one; those it could not take are returned.

        (With no ``hand_on``, none is taken.)
        """
        if self._hand_on is None:
            return unanswered
        return [message for message in unanswered if not self._handed_on(message)]

    def _handed_on(self, message: SessionMessage) -> bool:
        """Give an unhandled client message to a new activation; False if that is not possible.

        A write goes on even if its caller gave up waiting: it was sent, so it
        is carried out (see :class:`~memengine.session.handle.Session`). Only a
        read nobody waits for is dropped; it would change nothing.
        """
        reply = getattr(message, "reply", None)
        if reply is None or (reply.abandoned and isinstance(message, ReadContext)):
            return True  # the actor's own bookkeeping, or a read whose caller gave up: nothing to hand on
        assert self._hand_on is not None
        try:
            self._hand_on(self._session_id, message)  # type: ignore[arg-type]
        except MemEngineError:
            return False  # the engine is closing: the caller gets the error
        return True
