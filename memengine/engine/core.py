"""What every part of the engine shares: its services, its task group, its activations, its event loop.

The engine (memengine/engine/__init__.py) is a composition of small parts,
each a class of one concern over this core: activations.py (the activation
table), owner_watch.py (liveness, reaping, orphans, hand-over), privacy.py
(forget, export), set_aside.py (work set aside), figures.py (stats and gauges).
"""

from __future__ import annotations

import logging

import anyio
import anyio.abc

from ..actor.wakeup import current_loop
from ..config import SessionConfig
from ..errors import ForeignLoopError
from ..retain.delivery import RetainDelivery
from ..session.actor import SessionActor, SessionServices
from ..store.base import Store

log = logging.getLogger("memengine")


class EngineCore:
    """The state the engine's parts share, and the check every call starts with."""

    def __init__(
        self, services: SessionServices, tasks: anyio.abc.TaskGroup, delivery: RetainDelivery | None = None
    ) -> None:
        self._services = services
        self._telemetry = services.telemetry
        self._tasks = tasks
        self._delivery = delivery
        self._actors: dict[str, SessionActor] = {}
        self._closed = False
        self._loop = current_loop()  # the only event loop whose calls the engine can answer

    @property
    def config(self) -> SessionConfig:
        return self._services.config

    @property
    def store(self) -> Store:
        return self._services.store

    def _check_caller(self) -> None:
        """Refuse a call from an event loop other than the engine's: it could never be answered."""
        if current_loop() is not self._loop:
            raise ForeignLoopError(
                "this call came from an event loop other than the engine's (another thread's, or "
                "Runner.run_sync's): the engine could never answer it. Call the engine from the loop "
                "that opened it, or run the engine behind a portal "
                "(anyio.from_thread.start_blocking_portal()) and call through it: portal.call(...), "
                "or MemEngineSession(engine, session_id, portal=portal)"
            )

    def _close(self) -> None:
        self._closed = True
        self._tasks.cancel_scope.cancel()
