"""Points the SDK's own session tests at MemEngineSession.

The vendored tests build ``SQLiteSession(session_id, db_path, session_settings=...)``
inside a running test; here that name builds a :class:`MemEngineSession` on the
engine the ``memengine_for_sdk_tests`` fixture (conftest.py) opened for the test,
whatever ``db_path`` says (every test uses session ids of its own). The engine's
window is large, so no item leaves it: the SDK's tests expect every item back.
The session is given a portal onto the test's event loop, so that the tests
that call it from other threads and loops (``Runner.run_sync``, a thread pool)
work as the module docstring of ``memengine.integrations.openai_agents`` says.
"""

from __future__ import annotations

from typing import Any

import attrs
from anyio.from_thread import BlockingPortal

from memengine import Engine
from memengine.integrations.openai_agents import MemEngineSession


@attrs.define
class _Current:
    engine: Engine | None = None
    portal: BlockingPortal | None = None


current = _Current()


class SQLiteSession(MemEngineSession):
    """A MemEngineSession with the SDK SQLiteSession's constructor, for the vendored tests."""

    def __init__(self, session_id: str, db_path: Any = ":memory:", *, session_settings: Any = None) -> None:
        if current.engine is None:
            raise RuntimeError("no engine: the memengine_for_sdk_tests fixture did not run")
        super().__init__(current.engine, session_id, session_settings=session_settings, portal=current.portal)

    def close(self) -> None:
        """SQLiteSession.close() frees its connections; a MemEngineSession holds none (the engine does)."""
