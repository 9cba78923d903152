"""An engine process to be killed (``hold``), and one that comes after it (``next``): see test_restart_after_kill.py.

``python -m tests.restart_worker STORE BACKEND MODE`` with default settings
(``lease_ttl`` 10 s, ``retain_claim_seconds`` 60 s) apart from
``retain_every=2``, and the default owner name (a new one per process).
``MEMENGINE_TEST_LEASE_TTL``, ``MEMENGINE_TEST_LEASE_WAIT`` and
``MEMENGINE_TEST_CLAIM_SECONDS`` set others (far longer, so that a
takeover at once is told from one after they lapse whatever the machine's load).

``hold``: adds turns 1-5 to the session ``"kept"`` and one turn to ``"busy"``;
its sink call for the first batch never returns. Prints ``{"op": "holding"}``
once that call has started, then waits to be killed.

``next``: serves with a sink that records. At once it adds a turn to
``"busy"`` (printing how long the add took after the engine opened) unless
``--no-add``; then (unless ``--add-only``) it prints every batch its sink receives, with the seconds
since the engine opened, until the sink has seen turn 5 of ``"kept"`` (or 60
s passed, or ``MEMENGINE_TEST_WAIT_SECONDS``), and exits.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio

from memengine import Episode, SessionConfig, open_engine

CONFIG = SessionConfig(
    retain_every=2,
    passivate_after=None,
    lease_ttl=float(os.environ.get("MEMENGINE_TEST_LEASE_TTL", "10")),
    lease_wait=float(os.environ.get("MEMENGINE_TEST_LEASE_WAIT", "12")),
    retain_claim_seconds=float(os.environ.get("MEMENGINE_TEST_CLAIM_SECONDS", "60")),
)
WAIT_SECONDS = float(os.environ.get("MEMENGINE_TEST_WAIT_SECONDS", "60"))


def emit(**record: object) -> None:
    print(json.dumps(record), flush=True)


class HangingSink:
    mode = "append"

    async def retain(self, batch) -> None:
        emit(op="holding", session=batch.session_id, first_seq=batch.first_seq)
        await anyio.sleep_forever()


class RecordingSink:
    mode = "append"

    def __init__(self, opened_at: list[float]) -> None:
        self.opened_at = opened_at
        self.done = anyio.Event()

    async def retain(self, batch) -> None:
        seconds = time.monotonic() - self.opened_at[0]
        contents = [episode.content for episode in batch.episodes]
        emit(
            op="batch",
            session=batch.session_id,
            seqs=[batch.first_seq, batch.last_seq],
            contents=contents,
            at=seconds,
            monotonic=time.monotonic(),  # one clock for every process of the machine (CLOCK_MONOTONIC)
        )
        if batch.session_id == "kept" and batch.last_seq >= 5:
            self.done.set()


async def hold(store: str) -> None:
    async with open_engine(store, retain_sink=HangingSink(), config=CONFIG) as engine:
        await engine.session("busy").add([Episode("user", "busy 1")])
        await engine.session("kept").add([Episode("user", f"kept {n}") for n in range(1, 6)])
        await anyio.sleep_forever()


async def serve_next(store: str, add: bool) -> None:
    opened_at = [0.0]
    sink = RecordingSink(opened_at)
    started = time.monotonic()
    async with open_engine(store, retain_sink=sink, config=CONFIG) as engine:
        opened_at[0] = time.monotonic()
        emit(op="opened", seconds=opened_at[0] - started)
        if add:
            (episode,) = await engine.session("busy").add([Episode("user", "busy 2")])
            now = time.monotonic()
            emit(op="added", seq=episode.seq, seconds=now - opened_at[0], monotonic=now)
        if "--add-only" in sys.argv:
            return
        with anyio.move_on_after(WAIT_SECONDS):
            await sink.done.wait()
    emit(op="exited")


if __name__ == "__main__":
    store_arg, backend, mode = sys.argv[1:4]
    if mode == "hold":
        anyio.run(hold, store_arg, backend=backend)
    else:
        anyio.run(serve_next, store_arg, "--no-add" not in sys.argv, backend=backend)
