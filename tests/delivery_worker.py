"""An engine process whose retain sink call hangs, to be killed mid-call (see test_delivery_faults.py).

``python -m tests.delivery_worker STORE BACKEND NAME CLAIM_SECONDS`` opens an
engine on STORE (a SQLite file or a PostgreSQL URL) under the owner name NAME,
with ``retain_claim_seconds=CLAIM_SECONDS``, adds one full retain batch to
the session ``"left-behind"``, and prints one JSON line when its sink is
called (``{"op": "sink called", "first_seq": ..., "last_seq": ...}``). The
sink call never returns: the process waits to be killed.
"""

from __future__ import annotations

import json
import sys

import anyio

from memengine import Episode, SessionConfig, open_engine

SESSION = "left-behind"
BATCH = 2  # episodes in the one batch


class HangingSink:
    mode = "append"

    async def retain(self, batch) -> None:
        print(json.dumps({"op": "sink called", "first_seq": batch.first_seq, "last_seq": batch.last_seq}), flush=True)
        await anyio.sleep_forever()


async def main(store: str, name: str, claim_seconds: float) -> None:
    config = SessionConfig(retain_every=BATCH, retain_claim_seconds=claim_seconds, passivate_after=None)
    async with open_engine(store, retain_sink=HangingSink(), config=config, owner=name) as engine:
        await engine.session(SESSION).add([Episode("user", f"turn {n}") for n in range(1, BATCH + 1)])
        await anyio.sleep_forever()


if __name__ == "__main__":
    store_arg, backend, name_arg, claim_arg = sys.argv[1:5]
    anyio.run(main, store_arg, name_arg, float(claim_arg), backend=backend)
