"""A child process for test_forget_crash.py: add 10 / retain / delete 3 / clear, reporting each step, to be killed.

Usage: ``python -m tests.forget_worker STORE SIDE_FILE BACKEND``. Its sink
appends one JSON line per call it stores (``{"call": "retain" | "forget",
"key", "seqs"}``) to SIDE_FILE, flushed to disk before it returns, then
dawdles a moment so a kill often lands between the sink storing a call and
the engine recording its delivery. It prints each step once it is
acknowledged (``added``, ``retained``, ``deleted``, ``forgot``, ``cleared``,
``done``), then waits to be killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

from memengine import Episode, SessionConfig, open_engine

#: The killed process and its restart share a name, so the restart takes the session back at once.
OWNER = "forget-worker"
SESSION = "s"
DELETED = [2, 5, 7]
CONFIG = SessionConfig(
    retain_every=10, max_episodes=100, passivate_after=None, retain_backoff=0.002, retain_retry_later=0.05
)


def episodes() -> list[Episode]:
    """The ten episodes, with fixed ids: adding them again is a no-op."""
    return [Episode("user", f"turn {i}", id=f"turn-{i}") for i in range(1, 11)]


def call_record(kind: str, request: Any) -> dict[str, Any]:
    if kind == "retain":
        seqs: list[int] | None = [episode.seq for episode in request.episodes]
    else:
        seqs = None if request.seqs is None else list(request.seqs)
    return {"call": kind, "key": request.key, "seqs": seqs}


class SideFileSink:
    mode = "append"

    def __init__(self, path: str) -> None:
        self.path = path
        self.stored = 0

    def _store(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as side:
            side.write(json.dumps(record) + "\n")
            side.flush()
            os.fsync(side.fileno())
        self.stored += 1

    async def retain(self, batch: Any) -> None:
        self._store(call_record("retain", batch))
        await anyio.sleep(0.002)

    async def forget(self, request: Any) -> None:
        self._store(call_record("forget", request))
        await anyio.sleep(0.002)


async def outbox_emptied(engine: Any, recorded_through: int = 0) -> None:
    """Until the session's episodes up to ``recorded_through`` are in the outbox, and the outbox is empty."""
    while True:
        recorded = (await engine.store.load_session(SESSION)).retained_through >= recorded_through
        if recorded and not await engine.store.pending_retains(10):
            return
        await anyio.sleep(0.005)


async def main(store: str, side_file: str) -> None:
    sink = SideFileSink(side_file)
    async with open_engine(store, retain_sink=sink, config=CONFIG, owner=OWNER) as engine:
        session = engine.session(SESSION)
        await session.add(episodes())
        print("added", flush=True)
        await outbox_emptied(engine, 10)
        print("retained", flush=True)
        await session.delete_episodes(DELETED)
        print("deleted", flush=True)
        await outbox_emptied(engine)
        print("forgot", flush=True)
        await session.clear()
        print("cleared", flush=True)
        await outbox_emptied(engine)
        print("done", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], backend=sys.argv[3])
