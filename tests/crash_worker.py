"""A child process for the crash tests: adds episodes, reports each acknowledgement, then hangs.

Usage: python -m tests.crash_worker DB SESSION COUNT [RETAIN_EVERY]
It prints "ack <seq>" after each add returns and "blocked" once the summarizer
is stuck mid-call, then waits forever (to be killed with SIGKILL). With
RETAIN_EVERY, it hands batches to a retain sink that never returns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio

from memengine import Episode, SessionConfig, open_engine


class StuckSummarizer:
    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        print("blocked", flush=True)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


#: The killed process and its restart share a name, so the restart takes the session back at once.
RESTARTED_OWNER = "crash-worker"


class StuckSink:
    async def retain(self, batch: object) -> None:
        await anyio.sleep_forever()


async def main(path: str, session_id: str, count: int, retain_every: int | None) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=3, retain_every=retain_every or 20)
    sink = StuckSink() if retain_every else None
    async with open_engine(
        path, summarizer=StuckSummarizer(), retain_sink=sink, config=config, owner=RESTARTED_OWNER
    ) as engine:
        session = engine.session(session_id)
        for i in range(1, count + 1):
            (episode,) = await session.add([Episode("user", f"turn {i}")])
            print(f"ack {episode.seq}", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    retain_every = int(sys.argv[4]) if len(sys.argv) > 4 else None
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), retain_every)
