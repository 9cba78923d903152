"""A child process for the large-add tests: stores a large add slowly, to be killed in the middle.

Usage: python -m tests.large_add_worker STORE SESSION

It adds one episode (printing "acked"), then one add of ``LARGE`` episodes that
the store takes in parts of ``PART`` rows, each statement slowed down, and
prints "adding" just before. The test kills it (SIGKILL) once some parts are
committed; the add must then be absent after a restart.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio

from memengine import Episode, SessionConfig, open_engine
from memengine.store import committer

LARGE = 400
PART = 50
OWNER = "large-add-worker"


class SlowConnection:
    """The store's connection, with every statement that inserts episodes slowed down."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        if sql.lstrip().startswith("INSERT INTO episodes"):
            time.sleep(0.004)
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, rows: Any, /) -> Any:
        rows = list(rows)
        if sql.lstrip().startswith("INSERT INTO episodes"):
            time.sleep(0.004 * len(rows))
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def large_add() -> list[Episode]:
    return [Episode("user", f"large part word{i}", id=f"large-{i}") for i in range(LARGE)]


async def main(store: str, session_id: str) -> None:
    committer.TRANSACTION_ROWS = PART
    async with open_engine(store, config=SessionConfig(evict_to=1.0, max_episodes=10_000), owner=OWNER) as engine:
        session = engine.session(session_id)
        await session.add([Episode("user", "before the large add", id="before")])
        print("acked", flush=True)
        engine.store._conn = SlowConnection(engine.store._conn)  # type: ignore[attr-defined]
        print("adding", flush=True)
        await session.add(large_add())
        print("added", flush=True)  # the test kills the process long before
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
