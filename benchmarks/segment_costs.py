"""What a segmented session's summary writes cost the store as the session grows (store/segments.py).

Every summary a segmented session stores (a leaf, a merge), every delete in it
and every activation composes its summary from the tree. This builds one
session's tree directly through the store's functions, on a real SQLite
schema in a temporary file (no engine, no summarizer: only the store's
work, which runs on the commit thread every session shares), to 1,000, 4,000
and 16,000 leaves (a leaf is one summarizer batch: 16,000 leaves of 10
episodes is a session of 160,000), and times at each size, as medians of
``--rounds``:

* ``leaf``: storing a new leaf (and composing the summary);
* ``state``: reading the tree's state, as an activation does;
* ``delete``: a delete of an old episode (its leaf erased, the merges above
  it deleted, the summary composed again with the hole shown), then the
  repairs that make them again.

If the store's work per write followed the session's length, the 16,000 row
would be 16 times the 1,000 row; it should stay about flat.

Run: ``PYTHONPATH=$PWD python benchmarks/segment_costs.py [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from memengine.store import leases, segments
from memengine.store.base import SegmentRepair
from memengine.store.dialect import Db, sqlite_dialect
from memengine.store.sqlite.schema import migrate

EPISODES_PER_LEAF = 10
SIZES = (1_000, 4_000, 16_000)
SUMMARY = "The user and the assistant went over the deployment plan and agreed on the next steps. " * 8


class Tree:
    def __init__(self, db: Db) -> None:
        self.db = db
        self.leaves = 0

    def add_leaf(self) -> None:
        self.leaves += 1
        through = self.leaves * EPISODES_PER_LEAF
        rows = [
            ("s", seq, f"id-{seq}", "user", f"episode {seq}: " + "x" * 200, "2026-12-06T00:00:00+00:00", "{}")
            for seq in range(through - EPISODES_PER_LEAF + 1, through + 1)
        ]
        self.db.conn.executemany("INSERT INTO episodes VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        assert segments.store_leaf(self.db, "s", 1, 0, through, SUMMARY) is not None

    def repair(self) -> None:
        while True:
            found = segments.next_repair(self.db, "s")
            if not isinstance(found, SegmentRepair):
                return
            assert segments.store_node(self.db, "s", 1, 0, found.level, found.index, SUMMARY) is not None

    def delete(self, seq: int) -> None:
        self.db.conn.execute("DELETE FROM episodes WHERE session_id = 's' AND seq = ?", (seq,))
        assert segments.invalidate(self.db, "s", [seq])
        segments.compose(self.db, "s", 0)


def timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main(rounds: int) -> None:
    leases.require = lambda db, session_id, token: None  # (a benchmark of the tree: no lease to check)
    with (
        tempfile.TemporaryDirectory() as directory,
        closing(sqlite3.connect(Path(directory) / "tree.db", isolation_level=None)) as conn,
    ):
        migrate(conn)
        # The commit's fsync is the same whatever the tree holds: left out, so the tree's own work is measured.
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("INSERT INTO sessions (session_id, generation, seq_floor) VALUES ('s', 0, 0)")
        tree = Tree(Db(conn, sqlite_dialect()))
        print(f"{'leaves':>7} {'leaf ms':>8} {'state ms':>9} {'delete ms':>10} {'repairs ms':>11}")
        for size in SIZES:
            while tree.leaves < size - rounds:
                tree.add_leaf()
                tree.repair()
            leaf, state, delete, repairs = [], [], [], []
            for round_ in range(rounds):
                leaf.append(timed(tree.add_leaf))
                tree.repair()
                state.append(timed(lambda: segments.state(tree.db, "s")))
                old = EPISODES_PER_LEAF * (round_ + 1) + 3  # an old episode, in a leaf not erased yet
                delete.append(timed(lambda: tree.delete(old)))  # noqa: B023 - called at once  # (an old episode)
                repairs.append(timed(tree.repair))
            print(
                f"{tree.leaves:>7,} {statistics.median(leaf) * 1e3:>8.2f} {statistics.median(state) * 1e3:>9.2f} "
                f"{statistics.median(delete) * 1e3:>10.2f} {statistics.median(repairs) * 1e3:>11.2f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    main(parser.parse_args().rounds)
