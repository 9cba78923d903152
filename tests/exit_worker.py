"""A child process for the engine-exit tests: leave ``open_engine`` in one of the ways users do.

Usage: python -m tests.exit_worker SCENARIO BACKEND STORE [--sink]

It opens an engine on STORE under BACKEND (asyncio or trio), adds episodes to
a few sessions (printing nothing until the end), then leaves the engine the
way SCENARIO says. It prints one JSON line: the seqs acknowledged per session,
what reached the caller (the exception's type and its leaf exceptions), and
how long leaving took. With ``--sink``, a retain sink that never returns is
configured (``retain_grace`` = GRACE seconds), so exit also meets a stuck sink.

The test runs it with a timeout: an exit that hangs fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from collections.abc import Callable

import anyio

from memengine import Episode, SessionConfig, open_engine

SESSIONS = ("alice", "bob", "carol")
GRACE = 1.0
#: Short leases, so the next start takes over what a failed release left within a second.
CONFIG = SessionConfig(
    evict_to=1.0, max_episodes=3, retain_every=2, lease_ttl=1.0, lease_wait=3.0, passivate_after=None
)


class StuckSink:
    async def retain(self, batch: object) -> None:
        await anyio.sleep_forever()


def leaves(error: BaseException) -> list[str]:
    if isinstance(error, BaseExceptionGroup):
        return [name for inner in error.exceptions for name in leaves(inner)]
    return [type(error).__name__]


def hold_store_lock(store: str) -> Callable[[], None]:
    """Another client takes the store's write lock (SQLite) or locks memengine's tables (PostgreSQL)."""
    ready = threading.Event()
    done = threading.Event()

    def hold() -> None:
        if store.startswith("postgresql://"):
            import psycopg

            with psycopg.connect(store) as conn:
                conn.execute("LOCK TABLE session_leases, retain_outbox, episodes IN ACCESS EXCLUSIVE MODE")
                ready.set()
                done.wait(30)
        else:
            conn = sqlite3.connect(store, isolation_level=None, timeout=30)
            conn.execute("BEGIN IMMEDIATE")
            ready.set()
            done.wait(30)
            conn.execute("ROLLBACK")
            conn.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    ready.wait(30)

    def release() -> None:
        done.set()
        thread.join(30)

    return release


async def main(scenario: str, store: str, with_sink: bool) -> dict:
    acknowledged: dict[str, list[int]] = {s: [] for s in SESSIONS}
    sink = StuckSink() if with_sink else None
    outcome: dict[str, object] = {"error": None, "leaves": []}
    release_lock: Callable[[], None] | None = None
    left_at = 0.0

    async def work(engine) -> None:
        for round_ in range(3):
            for session_id in SESSIONS:
                stored = await engine.session(session_id).add([Episode("user", f"{session_id} {round_}")])
                acknowledged[session_id].extend(e.seq for e in stored)

    worked = anyio.Event()
    leave_after = 0.2  # seconds after the work, for the scenarios that leave from outside the body

    async def body(engine) -> None:
        nonlocal release_lock, left_at
        await work(engine)
        if scenario == "locked":
            release_lock = hold_store_lock(store)
        left_at = time.monotonic()
        if scenario in ("sibling", "cancel", "move_on_after", "fail_after"):
            left_at += leave_after
        worked.set()
        if scenario == "raises":
            raise ValueError("my app bug")
        if scenario in ("locked", "normal"):
            return
        await anyio.sleep_forever()

    engine_options = {"config": CONFIG, "retain_sink": sink, "retain_grace": GRACE, "owner": "exiting"}
    try:
        if scenario in ("sibling", "cancel"):
            async with anyio.create_task_group() as tasks:

                async def from_outside() -> None:
                    await worked.wait()
                    await anyio.sleep(leave_after)
                    if scenario == "sibling":
                        raise ValueError("a sibling task failed")
                    tasks.cancel_scope.cancel()

                tasks.start_soon(from_outside)
                async with open_engine(store, **engine_options) as engine:
                    await body(engine)
        elif scenario in ("move_on_after", "fail_after"):
            # The deadline is set once the work is done, so it always falls in the same place.
            with (anyio.fail_after if scenario == "fail_after" else anyio.move_on_after)(None) as deadline:

                async def set_deadline() -> None:
                    await worked.wait()
                    deadline.deadline = anyio.current_time() + leave_after

                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(set_deadline)
                    async with open_engine(store, **engine_options) as engine:
                        await body(engine)
        else:
            async with open_engine(store, **engine_options) as engine:
                await body(engine)
    except BaseException as exc:  # what reached the caller, reported to the test
        outcome = {"error": type(exc).__name__, "leaves": leaves(exc), "message": str(exc)}
    elapsed = time.monotonic() - left_at
    if release_lock is not None:
        release_lock()
    return {"acknowledged": acknowledged, "elapsed": elapsed, **outcome}


if __name__ == "__main__":
    scenario, backend, store = sys.argv[1:4]
    result = anyio.run(main, scenario, store, "--sink" in sys.argv[4:], backend=backend)
    print(json.dumps(result), flush=True)
