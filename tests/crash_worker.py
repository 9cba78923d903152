"""A child process for the crash tests: adds episodes, reports each acknowledgement, then hangs.

Usage: python -m tests.crash_worker DB SESSION COUNT
It prints "ack <seq>" after each add returns and "blocked" once the summarizer
is stuck mid-call, then waits forever (to be killed with SIGKILL).
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


async def main(path: str, session_id: str, count: int) -> None:
    async with open_engine(path, summarizer=StuckSummarizer(), config=SessionConfig(max_episodes=3)) as engine:
        session = engine.session(session_id)
        for i in range(1, count + 1):
            (episode,) = await session.add([Episode("user", f"turn {i}")])
            print(f"ack {episode.seq}", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
