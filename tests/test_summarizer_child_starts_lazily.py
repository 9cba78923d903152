"""A session's summarizer child runs only once the session has something to summarize.

Most activations never summarize (a short conversation; a session read and
let go). Their child held a task, a mailbox waiter and a cancel scope all the
same: a quarter of what each active session kept alive, and so of what every
garbage collection walked with thousands of sessions active. The child now
starts with its first batch, under the session's task group as before.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

GUARD = 30.0  # seconds: generous, for a loaded machine


def summarizer_tasks() -> int:
    return sum(1 for task in anyio.get_running_tasks() if (task.name or "").endswith("SummarizerActor.run"))


async def test_sessions_that_never_summarize_run_no_summarizer_task(db_path) -> None:
    config = SessionConfig(max_episodes=3, evict_to=1, passivate_after=None)
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            for n in range(20):
                await engine.session(f"s{n}").add([Episode("user", f"hello {n}")])
            assert engine.active_sessions == 20
            assert summarizer_tasks() == 0
            busy = engine.session("s0")
            await busy.add([Episode("user", f"turn {turn}") for turn in range(2, 5)])
            context = await busy.context(wait_for_summary=True)  # the child started, summarized, stored
            assert covered(context.summary) == ["hello 0"]
            assert summarizer_tasks() == 1
