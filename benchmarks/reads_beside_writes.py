"""Reads beside writes: add latency of one session while another task recalls over a large history.

One store holds a large session (default 300,000 episodes). A writer adds
single episodes to another session, first alone, then while a reader runs
session-scoped recalls over the large one in a loop. Printed: add latency
p50/p99 in both phases, recall latency, and the ratios (with reads / alone),
measured side by side in one run. Reads run on their own connection, so the
ratio should stay near 1; when they went through the writer's transactions,
each recall held every add behind it.

    python benchmarks/reads_beside_writes.py [--episodes N] [--adds K] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from memengine import Episode, SessionConfig, open_engine

WORDS = ("river", "piano", "lisbon", "order", "moon", "code", "tea", "blue", "dog", "cat")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def timed_adds(engine, count: int, prefix: str) -> list[float]:
    session = engine.session("writer")
    latencies = []
    for i in range(count):
        started = time.perf_counter()
        await session.add([Episode("user", f"{prefix} {i}")])
        latencies.append((time.perf_counter() - started) * 1000)
        await anyio.sleep(0.001)  # a paced writer, as a chat service is
    return latencies


async def run(args: argparse.Namespace, directory: Path) -> None:
    config = SessionConfig(max_episodes=10**6, max_chars=10**12, passivate_after=None)
    async with open_engine(directory / "reads.db", config=config) as engine:
        big = engine.session("history")
        for start in range(0, args.episodes, 10_000):
            await big.add(
                [
                    Episode("user", f"{WORDS[i % 10]} {WORDS[(i * 7) % 10]} note {i}")
                    for i in range(start, min(start + 10_000, args.episodes))
                ]
            )
        await engine.recall("warm", session_id="history")  # index everything before measuring
        alone = await timed_adds(engine, args.adds, "alone")

        recall_latencies: list[float] = []
        done = anyio.Event()

        async def recall_loop() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await engine.recall("river piano", session_id="history", limit=10)
                recall_latencies.append((time.perf_counter() - started) * 1000)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(recall_loop)
            beside = await timed_adds(engine, args.adds, "beside")
            done.set()

    print(f"{args.episodes} episodes in one session; {args.adds} paced adds to another; backend={args.backend}")
    print(f"  add alone          p50 {statistics.median(alone):7.2f} ms   p99 {percentile(alone, 0.99):7.2f} ms")
    print(f"  add beside recalls p50 {statistics.median(beside):7.2f} ms   p99 {percentile(beside, 0.99):7.2f} ms")
    print(
        f"  recall ({len(recall_latencies)} runs)   p50 {statistics.median(recall_latencies):7.2f} ms   "
        f"p99 {percentile(recall_latencies, 0.99):7.2f} ms"
    )
    print(f"ratio add p50 beside recalls / alone: {statistics.median(beside) / statistics.median(alone):6.2f}x")
    print(f"ratio add p99 beside recalls / alone: {percentile(beside, 0.99) / percentile(alone, 0.99):6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=300_000, help="episodes in the recalled session")
    parser.add_argument("--adds", type=int, default=300, help="adds measured in each phase")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as directory:
        anyio.run(run, args, Path(directory), backend=args.backend)


if __name__ == "__main__":
    main()
