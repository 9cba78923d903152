"""How long leaving ``open_engine`` takes while another client holds a lock, beside the documented deadline.

Each round runs a child process per case and reads how long leaving took
(from the end of the ``async with`` body to the line after it):

* ``free``: nothing in the way (the reference);
* ``locked``: another client holds the lock the engine's last store work
  waits for. SQLite: a connection of another client holds the file's write
  lock (``BEGIN IMMEDIATE``). PostgreSQL: another client holds
  ``LOCK TABLE session_leases, retain_outbox, episodes IN ACCESS EXCLUSIVE
  MODE`` (``tests/exit_worker.py``, scenario ``locked``);
* ``silent`` (PostgreSQL only): the server stops answering while an add is in
  flight; a proxy keeps the sockets open and passes no byte
  (``tests/stall_worker.py``, scenario ``exit``, ``reply_timeout`` 20 s).

The engine has no retain sink here, so ``retain_grace`` does not count: the
deadline is ``EXIT_DEADLINE_SECONDS`` (``EXIT_STORE_SECONDS`` for the store
work, then ``INTERRUPT_SECONDS`` to interrupt it and close the connections).

Run: ``.venv/bin/python benchmarks/exit_with_lock_held.py [--rounds N]
[--postgres URL] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pg_schemas import throwaway_schema  # noqa: E402

from memengine.engine import EXIT_DEADLINE_SECONDS, EXIT_STORE_SECONDS  # noqa: E402
from memengine.store.committer import INTERRUPT_SECONDS  # noqa: E402

#: case -> (worker module, scenario, the key of the exit time in its output)
CASES = {
    "free": ("tests.exit_worker", "normal", "elapsed"),
    "locked": ("tests.exit_worker", "locked", "elapsed"),
    "silent": ("tests.stall_worker", "exit", "exit_seconds"),
}


def exit_seconds(case: str, store: str, backend: str) -> float:
    module, scenario, key = CASES[case]
    result = subprocess.run(
        [sys.executable, "-m", module, scenario, backend, store],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} {scenario} failed:\n{result.stderr}")
    return float(json.loads(result.stdout.strip().splitlines()[-1])[key])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    print(
        f"leaving open_engine, {args.backend}; deadline {EXIT_DEADLINE_SECONDS:g} s "
        f"(store work {EXIT_STORE_SECONDS:g} s + interrupting and closing {INTERRUPT_SECONDS:g} s)"
    )
    print(f"{'store':<12}{'case':<9}{'median s':>10}{'max s':>8}{'deadline s':>12}   ({args.rounds} rounds)")
    for store_name in ("sqlite", "postgresql"):
        cases = ("free", "locked") if store_name == "sqlite" else ("free", "locked", "silent")
        for case in cases:
            times = []
            for _ in range(args.rounds):
                with tempfile.TemporaryDirectory() as directory:
                    with contextlib.ExitStack() as schemas:
                        if store_name == "sqlite":
                            store = str(Path(directory) / f"{uuid.uuid4().hex}.db")
                        else:
                            store = schemas.enter_context(throwaway_schema(args.postgres))
                        times.append(exit_seconds(case, store, args.backend))
            print(
                f"{store_name:<12}{case:<9}{statistics.median(times):>10.2f}{max(times):>8.2f}"
                f"{EXIT_DEADLINE_SECONDS:>12.2f}"
            )


if __name__ == "__main__":
    main()
