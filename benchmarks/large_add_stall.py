"""What one large add (an import of a long history) costs the rest of the engine: the event loop's longest stall.

A monitor task sleeps 1 ms in a loop and records how late it wakes, while one
session is given ``--episodes`` episodes in one add (realistic contents: chat
turns, code, JSON, non-Latin text, 0.3-4 KB each, cycled) and another session
is read in a loop (served from memory). Printed per run: the add's duration,
the monitor's longest and 99th-percentile lateness, and how many reads of the
other session were answered during the add.

Side by side in one process, alternating: the add entered into the window a
slice at a time (session/large_entry.py, as shipped) and in one go (the slice
set larger than the add: how every add was entered before).

Run: ``.venv/bin/python benchmarks/large_add_stall.py [--episodes 100000] [--rounds 3] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import anyio

from memengine import Episode, SessionConfig, open_engine
from memengine.session import handle, large_entry

CONTENTS = [
    "Could you look at why the nightly export job is slow again? It took 40 minutes last night. " * 4,
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append((a if a[0] < b[0] else b).pop(0))\n"
    "    return out + a + b\n" * 12,
    json.dumps({"rows": [{"id": n, "name": f"item {n}", "tags": ["a", "b"], "price": n * 1.5} for n in range(40)]}),
    "東京の天気は晴れ、最高気温は十八度の予報です。明日は雨が降るかもしれません。" * 20,
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==" * 30,
]


def episodes(count: int, prefix: str) -> list[Episode]:
    return [Episode("user", f"{prefix} {n}: {CONTENTS[n % len(CONTENTS)]}") for n in range(count)]


async def one_run(count: int, sliced: bool) -> tuple[float, float, float, int]:
    slice_size = large_entry.ENTER_SLICE if sliced else 10**9
    handle.ENTER_SLICE = large_entry.ENTER_SLICE = slice_size
    config = SessionConfig(max_episodes=50, max_chars=10**6, passivate_after=None, lease_ttl=60.0)
    batch = episodes(count, "import")
    with tempfile.TemporaryDirectory() as directory:
        async with open_engine(f"{directory}/memory.db", config=config) as engine:
            other = engine.session("other")
            await other.add(episodes(3, "other"))
            late: list[float] = []
            reads = 0
            done = anyio.Event()

            async def monitor() -> None:
                while not done.is_set():
                    asked = time.perf_counter()
                    await anyio.sleep(0.001)
                    late.append(time.perf_counter() - asked - 0.001)

            async def reader() -> None:
                nonlocal reads
                while not done.is_set():
                    await other.context()
                    reads += 1
                    await anyio.sleep(0.001)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(monitor)
                tasks.start_soon(reader)
                started = time.perf_counter()
                await engine.session("import").add(batch)
                took = time.perf_counter() - started
                done.set()
    late.sort()
    return took, late[-1], late[int(len(late) * 0.99)], reads


async def main(count: int, rounds: int) -> None:
    shipped = large_entry.ENTER_SLICE
    results: dict[bool, list[tuple[float, float, float, int]]] = {True: [], False: []}
    try:
        for _ in range(rounds):
            for sliced in (True, False):
                results[sliced].append(await one_run(count, sliced))
    finally:
        handle.ENTER_SLICE = large_entry.ENTER_SLICE = shipped
    chars = sum(len(e.content) for e in episodes(count, "import"))
    print(f"one add of {count:,} episodes ({chars / 1e6:.0f} MB of text), {rounds} rounds each, alternating")
    print(f"{'entered':<28}{'add s':>8}{'longest stall ms':>18}{'p99 stall ms':>14}{'other reads':>13}")
    for sliced, label in ((True, f"a slice at a time ({shipped:,})"), (False, "in one go (before)")):
        runs = results[sliced]
        print(
            f"{label:<28}{statistics.median(r[0] for r in runs):>8.2f}"
            f"{statistics.median(r[1] for r in runs) * 1000:>18.0f}"
            f"{statistics.median(r[2] for r in runs) * 1000:>14.1f}{statistics.median(r[3] for r in runs):>13.0f}"
        )
    longest = {s: [round(r[1] * 1000) for r in results[s]] for s in results}
    print("(medians over the rounds; longest per round:", longest)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.episodes, args.rounds, backend=args.backend)
