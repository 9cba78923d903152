"""Adds and reads per second on SQLite and PostgreSQL, with 1, 2 and 4 engine processes.

Every configuration runs in this one invocation, one after another, and the
table prints them side by side with their ratio to SQLite with one process
(the machine is shared and noisy: compare ratios within a run, not across).

Each process serves its own 50 sessions (replicas behind a router that
shards by session), with 50 concurrent writers adding one episode at a time
(each ``add`` is durable when it returns), then 50 readers reading contexts,
each for ``--seconds``. Processes start together and report their counts.
The window is large enough that nothing is evicted: this measures the store
and the leases, not the summarizer.

    python benchmarks/replicas.py [--seconds 5] [--postgres URL]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from pg_schemas import throwaway_schema

SESSIONS_PER_PROCESS = 50
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


async def worker(store: str, index: int, seconds: float, start_at: float) -> None:
    from memengine import Episode, SessionConfig, open_engine

    # No evictions: this measures the store and its leases, not the summarizer (see add_under_slow_summary.py).
    config = SessionConfig(passivate_after=None, max_episodes=1_000_000, max_chars=1_000_000_000)
    async with open_engine(store, config=config, owner=f"bench-{index}") as engine:
        sessions = [engine.session(f"p{index}-s{n}") for n in range(SESSIONS_PER_PROCESS)]
        for session in sessions:
            await session.context()  # activate (take the lease) before the clock starts
        await anyio.sleep(max(0.0, start_at - time.time()))
        counts = {"adds": 0, "reads": 0}

        async def run(kind: str, session, deadline: float) -> None:
            while time.monotonic() < deadline:
                if kind == "adds":
                    await session.add([Episode("user", "a benchmark turn about the weather in Lisbon")])
                else:
                    await session.context()
                counts[kind] += 1

        for kind in ("adds", "reads"):
            deadline = time.monotonic() + seconds
            async with anyio.create_task_group() as tasks:
                for session in sessions:
                    tasks.start_soon(run, kind, session, deadline)
    print(json.dumps({kind: count / seconds for kind, count in counts.items()}), flush=True)


def run_configuration(store: str, processes: int, seconds: float) -> dict[str, float]:
    start_at = time.time() + 3.0  # time for every process to open the store and activate its sessions
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", store, str(index), str(seconds), str(start_at)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    totals = {"adds": 0.0, "reads": 0.0}
    for child in children:
        out, _ = child.communicate(timeout=120 + seconds * 4)
        if child.returncode != 0:
            raise SystemExit(f"a benchmark process failed ({child.returncode})")
        for kind, rate in json.loads(out.strip().splitlines()[-1]).items():
            totals[kind] += rate
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each phase (adds, reads)")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="PostgreSQL server (a schema is made and dropped)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        store, index, seconds, start_at = args.worker
        anyio.run(worker, store, int(index), float(seconds), float(start_at))
        return

    results: list[tuple[str, int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for processes in (1, 2, 4):
            store = str(Path(scratch) / f"bench-{processes}.db")
            results.append(("sqlite", processes, run_configuration(store, processes, args.seconds)))
            with throwaway_schema(args.postgres) as url:
                results.append(("postgresql", processes, run_configuration(url, processes, args.seconds)))

    base = results[0][2]
    print(
        f"{SESSIONS_PER_PROCESS} sessions and 50 concurrent callers per process, {args.seconds:g} s per phase, "
        "no evictions"
    )
    print(f"{'store':<11} {'processes':>9} {'adds/s':>10} {'x sqlite-1':>10} {'reads/s':>10} {'x sqlite-1':>10}")
    for backend, processes, rates in sorted(results, key=lambda r: (r[0] != "sqlite", r[1])):
        print(
            f"{backend:<11} {processes:>9} {rates['adds']:>10,.0f} {rates['adds'] / base['adds']:>10.2f} "
            f"{rates['reads']:>10,.0f} {rates['reads'] / base['reads']:>10.2f}"
        )


if __name__ == "__main__":
    main()
