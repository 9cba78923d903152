"""Forgetting a tenant beside other tenants' writes: their add latency alone, and during the erasure.

One store holds a tenant of many sessions (default 1,000 sessions of 20
episodes each, let go: not in memory). Writers of other tenants add single
episodes, paced, to their own sessions: first alone, then while
``engine.forget(tenant=...)`` erases the big tenant. Printed: the writers'
add latency p50/p99 in both phases, the ratios (during / alone), and how
long the forget took, measured side by side in one run. Forget erases a few
sessions at a time in small transactions, so the ratio should stay within
the same order (a forget in one transaction per tenant, or one that held the
writer, would multiply the p99).

    python benchmarks/tenant_forget.py [--db URL] [--sessions N] [--turns T] [--writers W] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from memengine import Episode, SessionConfig, open_engine


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def fill(engine, args: argparse.Namespace) -> None:
    limiter = anyio.CapacityLimiter(50)

    async def one(number: int) -> None:
        async with limiter:
            session = engine.session(f"leaving/chat-{number}")
            await session.add([Episode("user", f"leaving tenant line {n} of chat {number}") for n in range(args.turns)])
            await session.close()

    async with anyio.create_task_group() as tasks:
        for number in range(args.sessions):
            tasks.start_soon(one, number)


async def paced_adds(engine, writer: int, latencies: list[float], until: anyio.Event | None, count: int) -> None:
    session = engine.session(f"tenant{writer}/chat")
    done = 0
    while (until is None and done < count) or (until is not None and not until.is_set()):
        started = time.perf_counter()
        await session.add([Episode("user", f"writer {writer} turn {done}")])
        latencies.append((time.perf_counter() - started) * 1000)
        done += 1
        await anyio.sleep(0.002)  # a paced writer, as a chat service is


def latency_line(what: str, latencies: list[float]) -> str:
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    return f"  {what:<17} ({len(latencies):5d} adds) p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"


async def run(args: argparse.Namespace, db: str) -> None:
    config = SessionConfig(max_episodes=40, passivate_after=None)
    async with open_engine(db, config=config) as engine:
        await fill(engine, args)
        for writer in range(args.writers):  # every writer's session active before measuring
            await engine.session(f"tenant{writer}/chat").add([Episode("user", "warm up")])

        alone: list[float] = []
        async with anyio.create_task_group() as tasks:
            for writer in range(args.writers):
                tasks.start_soon(paced_adds, engine, writer, alone, None, args.adds)

        during: list[float] = []
        finished = anyio.Event()
        async with anyio.create_task_group() as tasks:
            for writer in range(args.writers):
                tasks.start_soon(paced_adds, engine, writer, during, finished, 0)
            started = time.perf_counter()
            report = await engine.forget(tenant="leaving")
            took = time.perf_counter() - started
            finished.set()
        assert report.sessions == args.sessions, report

    where = "PostgreSQL" if db.startswith("postgresql") else "SQLite"
    print(
        f"{where}, backend={args.backend}: forget of a tenant of {args.sessions} sessions x {args.turns} episodes "
        f"beside {args.writers} paced writers of other tenants"
    )
    print(f"  forget took {took:.2f} s ({report.sessions / took:.0f} sessions/s, {report.episodes} episodes erased)")
    print(latency_line("add alone", alone))
    print(latency_line("add during forget", during))
    print(f"ratio add p50 during forget / alone: {statistics.median(during) / statistics.median(alone):6.2f}x")
    print(f"ratio add p99 during forget / alone: {percentile(during, 0.99) / percentile(alone, 0.99):6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="a postgresql:// URL (of an empty schema); default: a new SQLite file")
    parser.add_argument("--sessions", type=int, default=1000, help="sessions of the forgotten tenant")
    parser.add_argument("--turns", type=int, default=20, help="episodes per session of the forgotten tenant")
    parser.add_argument("--writers", type=int, default=8, help="writers of other tenants (one session each)")
    parser.add_argument("--adds", type=int, default=150, help="adds per writer measured alone")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as directory:
        db = args.db or str(Path(directory) / "forget.db")
        anyio.run(run, args, db, backend=args.backend)


if __name__ == "__main__":
    main()
