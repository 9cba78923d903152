"""The activation table: which sessions are in memory, putting messages in their mailboxes, ticking them.

A session is activated by the first message sent to it and deregisters
itself when it stops. Every third of ``lease_ttl`` the leases of every active
session are renewed in one statement; a session whose lease was lost is told.
"""

from __future__ import annotations

import logging

import anyio
import anyio.abc

from ..errors import EngineClosedError, LeaseLostError
from ..limits import MAX_SESSION_ID_BYTES, require_text
from ..session.actor import SessionActor
from ..session.handle import Session
from ..session.messages import ClientMessage, LeaseNotRenewed, Tick
from .core import EngineCore

log = logging.getLogger("memengine")


class Activations(EngineCore):
    """The engine's session actors by id; sending to them, and keeping them ticking and leased."""

    @property
    def active_sessions(self) -> int:
        """How many sessions are activated (in memory) right now."""
        return len(self._actors)

    def is_active(self, session_id: str) -> bool:
        return session_id in self._actors

    def session(self, session_id: str) -> Session:
        """A handle on the session ``session_id``. Does no I/O.

        A session id is a non-blank str of valid Unicode without NUL, at most
        ``MAX_SESSION_ID_BYTES`` (1,024) bytes of UTF-8; anything else raises
        ``TypeError`` (not a str) or ``ValueError``.
        """
        require_text("a session id", session_id, max_bytes=MAX_SESSION_ID_BYTES)
        return Session(self, session_id)

    async def _send(self, session_id: str, message: ClientMessage) -> None:
        """Put a caller's message in the session's mailbox, activating the session if needed.

        When the mailbox is full (``SessionConfig.mailbox_capacity`` calls
        waiting), wait for room. Cancelled while waiting, nothing was sent.
        """
        while not self._send_now(session_id, message):
            actor = self._actors.get(session_id)
            if actor is not None:
                await actor.mailbox.wait_for_room()  # or the actor stopped: then a new activation

    def _send_now(self, session_id: str, message: ClientMessage) -> bool:
        """:meth:`_send` without waiting: False (nothing sent) when the session's mailbox is full."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        actor = self._actors.get(session_id) or self._activate(session_id)
        if not actor.mailbox.has_room():
            return False
        actor.receive(message)
        return True

    def _hand_on(self, session_id: str, message: ClientMessage) -> None:
        """Give a message an activation that stopped without handling it to a new one (never waits)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        actor = self._actors.get(session_id) or self._activate(session_id)
        actor.mailbox.put(message)

    def _activate(self, session_id: str) -> SessionActor:
        actor = SessionActor(session_id, self._services, self._deregister, self._hand_on)
        self._actors[session_id] = actor
        self._tasks.start_soon(self._run_actor, actor, name=f"memengine session {session_id!r}")
        return actor

    def _deregister(self, actor: SessionActor) -> None:
        if self._actors.get(actor.session_id) is actor:
            del self._actors[actor.session_id]

    async def _run_actor(self, actor: SessionActor) -> None:
        try:
            await actor.run()
        except Exception:
            # A bug in one session must not take the engine (and every other session) down.
            log.exception("session %r stopped with an error", actor.session_id)

    async def _sweep_idle_sessions(self, passivate_after: float) -> None:
        """Tick every active session a few times per ``passivate_after``.

        A session that saw no client message for ``passivate_after`` seconds
        (measured in ticks) passivates once its summarizer is idle.
        """
        interval = max(passivate_after / 4, 0.001)
        while True:
            await anyio.sleep(interval)
            tick = Tick(anyio.current_time())
            for actor in self._actors.values():
                actor.mailbox.put(tick)

    async def _renew_leases(self) -> None:
        """Every third of ``lease_ttl``, extend the lease of every active session in one statement.

        A session whose lease could not be renewed (it expired while this
        process was paused, and another took it over, or its row was locked at
        that moment) is told so: it renews alone and gives up if that fails
        (LeaseNotRenewed).
        """
        ttl = self._services.config.lease_ttl
        while True:
            await anyio.sleep(ttl / 3)
            held = [(actor, actor.token) for actor in self._actors.values() if actor.token is not None]
            if not held:
                continue
            asked_at = anyio.current_time()
            try:
                renewed = await self._services.store.renew_leases(
                    [(actor.session_id, token) for actor, token in held], ttl
                )
            except Exception:
                # The writes themselves stay fenced; reads renew on their own once the lease may have lapsed.
                log.exception("renewing session leases failed; retrying in %.1f s", ttl / 3)
                continue
            for actor, token in held:
                if actor.token != token:
                    continue  # activated again meanwhile
                if actor.session_id in renewed:
                    actor.lease_renewed(asked_at)
                else:
                    lost = LeaseLostError(
                        f"session {actor.session_id!r}: this process's lease expired or was taken over"
                    )
                    actor.mailbox.put_if_open(LeaseNotRenewed(lost))

    def _episodes_waiting_for_summary(self) -> int:
        return sum(actor.episodes_waiting_for_summary for actor in self._actors.values())
