"""How fast an idle session moves between two replicas that take turns on it (store/handover.py).

Two processes (``tests/replica_worker.py``) with the default ``passivate_after``
(300 s), a 10 s lease and the default ``lease_wait`` (12 s) add to one session
in turn; each add after the first has to take the session from the other
process, which keeps it idle in memory. Printed per store: the add latency
of those moves (median and max). Without hand-over, every move waited the
full ``lease_wait`` and failed with ``SessionBusyError``.

Run: ``.venv/bin/python benchmarks/idle_hand_over.py [--moves N] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pg_schemas import throwaway_schema  # noqa: E402

from tests.test_replicas import Worker  # noqa: E402

DEFAULTS = {
    "MEMENGINE_TEST_PASSIVATE_AFTER": "300",
    "MEMENGINE_TEST_LEASE_TTL": "10",
    "MEMENGINE_TEST_LEASE_WAIT": "12",
}


def moves(store: str, count: int) -> list[float]:
    workers = [Worker(store, "asyncio", "a", "serve", **DEFAULTS), Worker(store, "trio", "b", "serve", **DEFAULTS)]
    try:
        seconds = []
        for turn in range(1, count + 2):
            started = time.monotonic()
            answer = workers[turn % 2].ask(op="add", session="s", contents=[f"turn {turn}"])
            assert answer.get("seqs") == [turn], answer
            if turn > 1:
                seconds.append(time.monotonic() - started)
        return seconds
    finally:
        for worker in workers:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    print(f"idle hand-over between two replicas, {args.moves} moves; default passivate_after and lease_wait")
    for name in ("sqlite", "postgresql"):
        with tempfile.TemporaryDirectory() as directory:
            with contextlib.ExitStack() as schemas:
                if name == "sqlite":
                    store = str(Path(directory) / f"{uuid.uuid4().hex}.db")
                else:
                    store = schemas.enter_context(throwaway_schema(args.postgres))
                seconds = moves(store, args.moves)
        print(f"{name:<12} move median {statistics.median(seconds):.2f} s   max {max(seconds):.2f} s")


if __name__ == "__main__":
    main()
