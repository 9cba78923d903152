"""How fast a dead process's sessions and retain batches come back: kill -9, then restart (or a survivor).

Runs the processes of ``tests/restart_worker.py`` with default settings
(``lease_ttl`` 10 s, ``retain_claim_seconds`` 60 s; ``retain_every=2``): one
process holds two sessions and a retain claim whose sink call hangs, and is
killed with SIGKILL. Then, for each store:

* restart: a new process (another owner name) opens the store; reported are
  the seconds to open, the seconds from open until its first add on a session
  the dead process held returned, and from open until the dead process's
  claimed batch reached the new sink;
* survivor: a process already running when the other is killed; reported are
  the seconds from the kill until the claimed batch reached its sink, with no
  call made meanwhile.

Without the liveness locks of store/owners.py, these are a lease (10 s) and a
claim (60 s). Run: ``.venv/bin/python benchmarks/restart_after_kill.py
[--rounds N] [--postgres URL] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pg_schemas import throwaway_schema

ROOT = Path(__file__).resolve().parent.parent


def start(store: str, backend: str, mode: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.restart_worker", store, backend, mode, *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def records_until(process: subprocess.Popen[str], op: str) -> list[dict[str, Any]]:
    seen = []
    for line in process.stdout:  # type: ignore[union-attr]
        seen.append(json.loads(line))
        if seen[-1]["op"] == op:
            return seen
    raise RuntimeError(f"the worker ended before {op!r}")


def kill_holder(store: str, backend: str) -> float:
    holder = start(store, backend, "hold")
    records_until(holder, "holding")
    holder.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    holder.wait()
    return killed_at


def first_kept_batch(records: list[dict[str, Any]]) -> dict[str, Any]:
    return next(r for r in records if r["op"] == "batch" and r["session"] == "kept")


def restart(store: str, backend: str) -> tuple[float, float, float]:
    kill_holder(store, backend)
    records = records_until(start(store, backend, "next"), "exited")
    opened = next(r for r in records if r["op"] == "opened")["seconds"]
    added = next(r for r in records if r["op"] == "added")["seconds"]
    return opened, added, first_kept_batch(records)["at"]


def survivor(store: str, backend: str) -> float:
    process = start(store, backend, "next", "--no-add")
    records_until(process, "opened")
    killed_at = kill_holder(store, backend)
    return first_kept_batch(records_until(process, "exited"))["monotonic"] - killed_at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    print(f"kill -9, then restart or a survivor; default settings (lease 10 s, claim 60 s); {args.backend}")
    widths = (9, 12, 13, 12)
    headings = ("open s", "1st call s", "1st batch s", "survivor s")
    print(f"{'store':<12}" + "".join(f"{h:>{w}}" for h, w in zip(headings, widths, strict=True)), end="")
    print(f"   (medians of {args.rounds})")
    for store_name in ("sqlite", "postgresql"):
        rows = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as directory:
                with contextlib.ExitStack() as schemas:
                    stores = [
                        str(Path(directory) / f"{uuid.uuid4().hex}.db")
                        if store_name == "sqlite"
                        else schemas.enter_context(throwaway_schema(args.postgres))
                        for _ in range(2)
                    ]
                    opened, added, batch = restart(stores[0], args.backend)
                    rows.append((opened, added, batch, survivor(stores[1], args.backend)))
        medians = [statistics.median(column) for column in zip(*rows, strict=True)]
        print(
            f"{store_name:<12}" + "".join(f"{value:>{width}.2f}" for value, width in zip(medians, widths, strict=True))
        )


if __name__ == "__main__":
    main()
