"""Group commit at thousands of sessions: the per-add cost stays flat (issue 26, item 8).

S sessions are activated, then every one of them adds one episode at once, R
times; the committer gathers those adds into few transactions, checking all
their leases with one query per 1,000 sessions (store/leases.py all_held).
Before, a group of more than 1,000 sessions lost that fast path, and every add
of the group was checked and written on its own. Each size runs twice, side by
side on fresh stores: as it is, and with the old limit put back (``all_held``
answering False above 1,000 sessions), and prints the median cost per add.

Run: ``.venv/bin/python benchmarks/group_commit_sessions.py [--sessions 1000 3000 10000]
[--rounds R] [--store sqlite|postgresql] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import anyio
from pg_schemas import throwaway_schema

from memengine import Episode, SessionConfig, open_engine
from memengine.store import leases

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
#: Leases long enough that activating 10,000 sessions on a loaded machine never outlasts one.
CONFIG = SessionConfig(passivate_after=None, lease_wait=120.0, lease_ttl=600.0)
_all_held = leases.all_held
#: The sizes of the groups whose leases were found held with one check each (the fast path).
fast_groups: list[int] = []


def chunked_all_held(db, held: Sequence[tuple[str, int]]) -> bool:
    found = _all_held(db, held)
    if found:
        fast_groups.append(len(held))
    return found


def old_all_held(db, held: Sequence[tuple[str, int]]) -> bool:
    found = len(held) <= 1000 and _all_held(db, held)  # as before: more than 1,000 went row by row
    if found:
        fast_groups.append(len(held))
    return found


@contextmanager
def fresh_store(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as directory:
            yield str(Path(directory) / "memory.db")
        return
    with throwaway_schema(POSTGRES) as url:
        yield url


async def per_add(url: str, sessions: int, rounds: int, pause_gc: bool) -> tuple[list[float], int]:
    """Seconds per add, for each round in which every session adds one episode at once, and full collections."""
    costs = []
    full_collections = 0
    async with open_engine(url, config=CONFIG) as engine:
        handles = [engine.session(f"s{n}") for n in range(sessions)]
        async with anyio.create_task_group() as group:
            for handle in handles:
                group.start_soon(handle.context)  # activated first: the rounds measure adds only
        for round_number in range(rounds):
            gc.collect()
            before = gc.get_stats()[2]["collections"]
            if pause_gc:
                gc.disable()
            try:
                started = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for handle in handles:
                        group.start_soon(handle.add, [Episode("user", f"turn {round_number}")])
                costs.append((time.perf_counter() - started) / sessions)
            finally:
                gc.enable()
            full_collections += gc.get_stats()[2]["collections"] - before
    return costs, full_collections


def measure(
    kind: str, backend: str, sessions: int, rounds: int, check: Callable, pause_gc: bool = False
) -> tuple[float, int, float]:
    """The median seconds per add, the largest group found held with one check, full collections per round."""
    fast_groups.clear()
    leases.all_held = check  # type: ignore[assignment]
    try:
        with fresh_store(kind) as url:
            costs, full = anyio.run(per_add, url, sessions, rounds, pause_gc, backend=backend)
            return statistics.median(costs), max(fast_groups, default=0), full / rounds
    finally:
        leases.all_held = _all_held  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    print(f"{args.store}, {args.backend}, median of {args.rounds} rounds, microseconds per add")
    print("(largest group whose leases one check found held, in brackets)")
    print(f"{'sessions':>9} {'chunked':>16} {'old limit':>16} {'ratio':>6} {'gc paused':>16} {'full gc':>8}")
    for sessions in args.sessions:
        chunked, chunked_group, full = measure(args.store, args.backend, sessions, args.rounds, chunked_all_held)
        old, old_group, _ = measure(args.store, args.backend, sessions, args.rounds, old_all_held)
        paused, paused_group, _ = measure(
            args.store, args.backend, sessions, args.rounds, chunked_all_held, pause_gc=True
        )
        print(
            f"{sessions:>9,} {chunked * 1e6:>8.1f} [{chunked_group:>5}] {old * 1e6:>8.1f} [{old_group:>5}] "
            f"{old / chunked:>6.2f} {paused * 1e6:>8.1f} [{paused_group:>5}] {full:>8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
