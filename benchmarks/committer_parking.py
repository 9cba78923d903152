"""One add_items at a time: the committer parked while a transaction it started runs, or waiting on it (before).

Since 4bfea19 the store's committer, having started a transaction itself,
parks as it does when idle, so the next single add starts its own
transaction from the submitter's step. Before, it waited on that
transaction's return and was woken after the callers: a one-at-a-time
writer's next add came before its task had a turn, found it not parked,
and waited for that task switch, on every add once the committer had
started one transaction (after the first riders that went alone).

Both in one process, alternating by round (the machine's speed drifts from
minute to minute): "before" is what the committer still does while riders
are due (``Committer._riders_waiting_out``), made always true. Each round: a
fresh engine, 20 ``MemEngineSession`` taking turns, 300 adds to warm up,
then ``--adds`` timed; printed: the median add per round, the event loop's
process CPU per add, and the ratio per round.

Run: ``.venv/bin/python benchmarks/committer_parking.py [--rounds 8] [--adds 2000] [--synchronous NORMAL|FULL]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from add_stages import item_of

from memengine import SessionConfig, open_engine
from memengine.integrations.openai_agents import MemEngineSession
from memengine.store import committer

PARKS = committer.Committer._riders_waiting_out


async def one_round(parks: bool, adds: int, synchronous: str) -> tuple[float, float]:
    """(median add in us, process CPU per add in us)."""
    committer.Committer._riders_waiting_out = PARKS if parks else (lambda self: True)  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "m.db"
            async with open_engine(path, synchronous=synchronous, config=SessionConfig()) as engine:
                sessions = [MemEngineSession(engine, f"s{number}") for number in range(20)]
                for turn in range(300):
                    await sessions[turn % 20].add_items([item_of(turn, None)])
                cpu = time.process_time()
                latencies = []
                for turn in range(300, 300 + adds):
                    start = time.perf_counter()
                    await sessions[turn % 20].add_items([item_of(turn, None)])
                    latencies.append(time.perf_counter() - start)
                cpu = time.process_time() - cpu
    finally:
        committer.Committer._riders_waiting_out = PARKS  # type: ignore[method-assign]
    return statistics.median(latencies) * 1e6, cpu / adds * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--adds", type=int, default=2000)
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL")
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for number in range(args.rounds):
        for parks in (True, False) if number % 2 else (False, True):
            results[parks].append(await one_round(parks, args.adds, args.synchronous))
    print(f"one add_items at a time, synchronous={args.synchronous}, {args.rounds} rounds of {args.adds} adds each way")
    for parks, label in ((False, "waits on its transaction (before)"), (True, "parks while it runs (now)")):
        medians = [round(median) for median, _ in results[parks]]
        cpu = statistics.median(cpu for _, cpu in results[parks])
        print(f"  {label:<34} add p50 {statistics.median(medians):5.0f} us  {medians}  CPU/add {cpu:4.0f} us")
    ratios = [now[0] / before[0] for now, before in zip(results[True], results[False], strict=True)]
    print(f"  now / before, add p50 per round: {[round(r, 2) for r in ratios]}, median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    anyio.run(main)
