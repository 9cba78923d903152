"""Retain delivery with 1, 2 and 4 engine processes sharing one outbox: does it scale out?

Every configuration runs in this one invocation, one after another, on
SQLite and PostgreSQL, and the table prints them side by side with their
ratio to one process on the same store (the machine is shared and noisy:
compare ratios within a run, not across).

The outbox is filled first (``--sessions`` sessions, ``--batches`` one-episode
batches each, no process owning them), then the processes start together;
each runs an engine whose sink sleeps ``--latency`` seconds per batch (a
remote long-term memory) and does nothing else, until the outbox is empty.
Each configuration runs with the due-head window as it is (256 heads read
at once, handed out before the next read) and patched down to ``--small``
heads (re-read more often, so fewer heads another process took meanwhile
are tried). Printed: batches per second until the outbox is empty, and
how the processes' claims went: ``sent`` (the claim was granted), ``busy``
(another process held the batch or an earlier one of its session) and
``gone`` (delivered meanwhile): busy and gone are store round trips spent
on batches another process sent.

    python benchmarks/delivery_replicas.py [--sessions 100] [--batches 5] [--latency 0.05] [--small 16]

One run (100 x 5, 0.05 s), rates in batches/s, ratio to one process, claims sent/busy/gone:

    sqlite      1  256  143.1  1.00  500    0    3     postgresql  1  256  124.7  1.00  500    0    0
    sqlite      2  256  256.8  1.79  500  385   25     postgresql  2  256  199.9  1.60  500  434   34
    sqlite      4  256  427.7  2.99  500  904  108     postgresql  4  256  200.9  1.61  500  806  217
    sqlite      4   16  356.4  2.49  500  478   18     postgresql  4   16  214.4  1.72  500  572   80

Delivery does spread over processes, but every process walks the same
oldest heads: at 4 processes about two claims are spent on other
processes' batches per batch sent, and on PostgreSQL the rate stops
growing past 2 processes. A smaller window halves the wasted claims
without a clear gain in rate; starting each process's walk at a random
head (tried, not kept) traded busy claims for gone ones one for one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from pg_schemas import throwaway_schema

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


async def fill(store_url: str, sessions: int, batches: int) -> None:
    from memengine import Episode
    from memengine.store.open import open_store

    async with open_store(store_url, owner="filler") as store:
        for n in range(sessions):
            session_id = f"s{n:04d}"
            token, _ = await store.activate(session_id, 600.0)
            for seq in range(1, batches + 1):
                done = anyio.Event()
                outcome: dict[str, object] = {}

                def complete(result, error, outcome=outcome, done=done) -> None:
                    outcome["error"] = error
                    done.set()

                store.submit_append(session_id, token, seq, [Episode("user", f"turn {seq}")], complete)
                await done.wait()
                if outcome["error"] is not None:
                    raise outcome["error"]  # type: ignore[misc]
                await store.enqueue_retain(session_id, token, "append")
        await store.release_leases()


async def worker(store_url: str, index: int, latency: float, start_at: float, window: str) -> None:
    import memengine.engine
    import memengine.retain.delivery
    from memengine import SessionConfig, open_engine

    memengine.retain.delivery._WINDOW = int(window)

    claims: Counter[str] = Counter()
    real_open_store = memengine.engine.open_store

    @asynccontextmanager
    async def counting_store(path, **kwargs):
        async with real_open_store(path, **kwargs) as store:
            claim = store.claim_retain

            async def counted(entry_id, key, ttl):
                result = await claim(entry_id, key, ttl)
                claims[result if isinstance(result, str) else "sent"] += 1
                return result

            store.claim_retain = counted
            yield store

    memengine.engine.open_store = counting_store

    class SlowSink:
        mode = "append"

        async def retain(self, batch) -> None:
            await anyio.sleep(latency)

    await anyio.sleep(max(0.0, start_at - time.time()))
    started = time.monotonic()
    config = SessionConfig(passivate_after=None)
    async with open_engine(store_url, retain_sink=SlowSink(), config=config, owner=f"bench-{index}") as engine:
        while (await engine.store.outbox_state()).depth:  # noqa: ASYNC110 - other processes empty it too
            await anyio.sleep(0.01)
        elapsed = time.monotonic() - started
    print(json.dumps({"elapsed": elapsed, "claims": dict(claims)}), flush=True)


def run_configuration(store_url: str, processes: int, window: str, args: argparse.Namespace) -> dict:
    anyio.run(fill, store_url, args.sessions, args.batches)
    start_at = time.time() + 2.0  # time for every process to import and start
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", store_url, str(index), str(args.latency), str(start_at), window],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    elapsed, claims = 0.0, Counter()
    for child in children:
        out, _ = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"a benchmark process failed ({child.returncode})")
        report = json.loads(out.strip().splitlines()[-1])
        elapsed = max(elapsed, report["elapsed"])
        claims.update(report["claims"])
    return {"rate": args.sessions * args.batches / elapsed, "claims": claims}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--batches", type=int, default=5, help="batches per session")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the sink takes per batch")
    parser.add_argument("--small", type=int, default=16, help="the smaller window compared")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="PostgreSQL server (a schema is made and dropped)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        store_url, index, latency, start_at, window = args.worker
        anyio.run(worker, store_url, int(index), float(latency), float(start_at), window)
        return

    results: list[tuple[str, int, str, dict]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for processes in (1, 2, 4):
            for window in ("256", str(args.small)):
                store_url = str(Path(scratch) / f"bench-{processes}-{window}.db")
                results.append(("sqlite", processes, window, run_configuration(store_url, processes, window, args)))
                with throwaway_schema(args.postgres) as url:
                    results.append(("postgresql", processes, window, run_configuration(url, processes, window, args)))

    print(
        f"{args.sessions} sessions x {args.batches} batches in the outbox, sink latency {args.latency:g} s, "
        "8 sessions at once per process"
    )
    print(
        f"{'store':<11} {'processes':>9} {'window':>7} {'batches/s':>10} {'x 1 proc':>10} "
        f"{'sent':>6} {'busy':>6} {'gone':>6}"
    )
    base = {
        backend: result["rate"] for backend, processes, window, result in results if (processes, window) == (1, "256")
    }
    for backend, processes, window, result in sorted(results, key=lambda r: (r[0] != "sqlite", r[1], -int(r[2]))):
        claims = result["claims"]
        ratio = result["rate"] / base[backend]
        print(
            f"{backend:<11} {processes:>9} {window:>7} {result['rate']:>10,.1f} {ratio:>10.2f} "
            f"{claims['sent']:>6} {claims['busy']:>6} {claims['gone']:>6}"
        )


if __name__ == "__main__":
    main()
