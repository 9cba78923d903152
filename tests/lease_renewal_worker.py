"""A child process for test_lease_renewal.py: a large add while another session of the engine renews its lease.

Usage: python -m tests.lease_renewal_worker STORE BACKEND

The engine runs with short leases (0.9 s, renewed every 0.3 s) and a
tokenizer that takes at least a millisecond per content (as a real tokenizer
can on long texts), so counting the large add's ``LARGE`` contents takes at
least ``LARGE`` ms, several lease periods on any machine. Meanwhile another
session adds a little every 50 ms. Prints "ok" and how many episodes the
first context() after the import returned, or "lost" and the error when the
other session's lease (or the import's own) was lost.
"""

from __future__ import annotations

import sys
import time

import anyio

from memengine import Episode, LeaseLostError, SessionConfig, open_engine
from memengine.store import committer

LARGE = 3_000


def slow_tokenizer(text: str) -> int:
    time.sleep(0.001)  # at least this long: the add takes at least LARGE ms to count, whatever the machine
    return max(1, len(text) // 4)


async def main(store: str) -> None:
    # Short transactions: what is tested is the event loop, not how long one transaction of the add may take.
    committer.TRANSACTION_ROWS = 100
    config = SessionConfig(
        evict_to=1.0,
        lease_ttl=0.9,
        lease_wait=2.0,
        passivate_after=None,
        max_episodes=10 * LARGE,
        max_chars=10_000_000,
        tokenizer=slow_tokenizer,
    )
    async with open_engine(store, config=config) as engine:
        small = engine.session("small")
        await small.add([Episode("user", "before the import")])
        imported = anyio.Event()
        meanwhile = 0

        async def write_meanwhile() -> None:
            nonlocal meanwhile
            while not imported.is_set():
                await small.add([Episode("user", f"meanwhile {meanwhile}")])
                meanwhile += 1
                await anyio.sleep(0.05)

        large = [Episode("user", f"imported line {i}", id=f"import-{i}") for i in range(LARGE)]
        lost: list[str] = []
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(write_meanwhile)
                importing = engine.session("import")
                await importing.add(large)
                imported.set()
            context = await importing.context()
            after = await small.add([Episode("user", "after the import")])
        except* LeaseLostError as group:
            lost.extend(str(error) for error in group.exceptions)
        if lost:
            print("lost", lost, flush=True)
        else:
            print("ok", len(context.episodes), after[0].seq == meanwhile + 2, flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], backend=sys.argv[2])
