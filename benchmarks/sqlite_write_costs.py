"""Two costs behind the SQLite store's group commit, measured side by side on memengine's own schema.

1. A group commit's appends inserted with one ``executemany``, with and
   without a savepoint around it. SQLite copies every page changed inside a
   savepoint to a statement journal, so that it can roll back to it; the
   committer therefore writes without one (store/transactions.py, _run_together).
2. Recall's full-text index (FTS5) caught up in steps of N rows: each step is
   a transaction that writes a new index segment and merges old ones, so the
   cost per row falls as steps grow (store/sqlite/store.py, RECALL_INDEX_EVERY).

Each measurement runs on a fresh database file, in rounds that alternate the
order of the variants; medians are reported (the machine is shared and noisy).
The rows are those of ``benchmarks/throughput.py --evicting``: S sessions x A
adds of 200 characters, one row per session in each transaction.

Run: ``.venv/bin/python benchmarks/sqlite_write_costs.py [--sessions S] [--adds A] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from throughput import EVICTING_CHARS, build_episodes, session_id

from memengine import open_engine
from memengine.store import journal
from memengine.store.dialect import Db, sqlite_dialect
from memengine.store.sqlite import recall as sqlite_recall

STEPS = (300, 1000, 2000, 5000)


def memengine_database(path: Path, sessions: int) -> sqlite3.Connection:
    """A new database with memengine's schema (made by opening an engine on it), its sessions created."""

    async def create() -> None:
        async with open_engine(path):
            pass

    anyio.run(create)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executemany(journal.INSERT_SESSION, [(session_id(s),) for s in range(sessions)])
    return conn


def insert_seconds_per_row(path: Path, transactions: list[list[tuple]], savepoint: bool) -> float:
    conn = memengine_database(path, len(transactions[0]))
    try:
        spent = 0.0
        for rows in transactions:
            conn.execute("BEGIN IMMEDIATE")
            started = time.perf_counter()
            if savepoint:
                conn.execute("SAVEPOINT together")
            conn.executemany(journal.INSERT_EPISODE, rows)
            if savepoint:
                conn.execute("RELEASE together")
            spent += time.perf_counter() - started
            conn.execute("COMMIT")
        return spent / sum(len(rows) for rows in transactions)
    finally:
        conn.close()


def index_seconds_per_row(path: Path, transactions: list[list[tuple]], step: int) -> float:
    conn = memengine_database(path, len(transactions[0]))
    try:
        conn.execute("BEGIN")
        for rows in transactions:
            conn.executemany(journal.INSERT_EPISODE, rows)
        conn.execute("COMMIT")
        db = Db(conn, sqlite_dialect())
        started = time.perf_counter()
        waiting = 1
        while waiting:
            conn.execute("BEGIN IMMEDIATE")
            waiting = sqlite_recall.catch_up(db, step)
            conn.execute("COMMIT")
        return (time.perf_counter() - started) / sum(len(rows) for rows in transactions)
    finally:
        conn.close()


def main(args: argparse.Namespace) -> None:
    episodes = build_episodes(args.sessions, args.adds, EVICTING_CHARS)
    transactions = [
        [journal.episode_row(session_id(s), i + 1, episodes[s][i]) for s in range(args.sessions)]
        for i in range(args.adds)
    ]
    print(
        f"{args.sessions} sessions x {args.adds} adds of {EVICTING_CHARS} characters, "
        f"one row per session per transaction, {args.rounds} rounds (medians)"
    )
    inserts: dict[bool, list[float]] = {False: [], True: []}
    indexing: dict[int, list[float]] = {step: [] for step in STEPS}
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as name:
        directory = Path(name)
        for round_number in range(args.rounds):
            order = [("insert", False), ("insert", True)] + [("index", step) for step in STEPS]
            if round_number % 2:
                order.reverse()
            for kind, variant in order:
                path = directory / f"{kind}-{variant}-{round_number}.db"
                if kind == "insert":
                    inserts[bool(variant)].append(insert_seconds_per_row(path, transactions, bool(variant)))
                else:
                    indexing[int(variant)].append(index_seconds_per_row(path, transactions, int(variant)))
    plain, guarded = statistics.median(inserts[False]), statistics.median(inserts[True])
    print("grouped insert (executemany), per row")
    print(f"  without a savepoint   {plain * 1e6:6.2f} us")
    print(f"  inside a savepoint    {guarded * 1e6:6.2f} us   ({guarded / plain:.2f}x)")
    print("recall index catch-up (FTS5), per row, by rows per step")
    largest = statistics.median(indexing[STEPS[-1]])
    for step in STEPS:
        cost = statistics.median(indexing[step])
        print(f"  {step:>5} rows per step  {cost * 1e6:6.2f} us   ({cost / largest:.2f}x the {STEPS[-1]}-row step)")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--sessions", type=int, default=100, help="sessions (rows per transaction)")
    parser.add_argument("-a", "--adds", type=int, default=200, help="transactions (adds per session)")
    parser.add_argument("-r", "--rounds", type=int, default=3, help="rounds; medians are reported")
    return parser.parse_args()


if __name__ == "__main__":
    main(parse_args())
