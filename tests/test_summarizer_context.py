"""The summarizer runs in the session's context: it sees the application's context variables.

Whatever submits a batch (the session's task, or a store callback that
answers a commit), the user's summarizer, and the telemetry around its
call, see the context variables of the code that started the session.
"""

from __future__ import annotations

import contextvars

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import RecordingSummarizer

pytestmark = pytest.mark.anyio

GUARD = 30.0  # seconds: generous, for a loaded machine


async def test_the_summarizer_sees_the_context_variables_of_the_session(db_path) -> None:
    tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
    seen: list[str | None] = []

    class Seeing(RecordingSummarizer):
        async def summarize(self, previous, episodes):  # type: ignore[no-untyped-def]
            seen.append(tenant.get())
            return await super().summarize(previous, episodes)

    config = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None)
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=Seeing(), config=config) as engine:
            tenant.set("acme")
            session = engine.session("s")
            for turn in range(1, 5):
                await session.add([Episode("user", f"turn {turn}")])
            await session.context(wait_for_summary=True)
    assert seen and set(seen) == {"acme"}
