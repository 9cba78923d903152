"""What a delete and a clear cost when they must be passed on to the sink (a forget), side by side.

For each store (a SQLite file, a PostgreSQL schema), in this one run: ``--sessions``
sessions of ``--episodes`` episodes each are handed on to a sink that forgets
(every batch delivered), and as many are not handed on at all (their batch
size is never reached). Then one episode is deleted from every session, and
every session is cleared, one call after another; the delete or clear of a
handed-on session also records a forget in its transaction, the other does
not. The calls alternate (which of a pair goes first alternates too), each timed alone
with the outbox empty (the delivery of the forget before it is waited for,
untimed). Printed: the mean latency of each call in ms, and the ratio
handed-on / not handed-on.

    python benchmarks/forget_cost.py [--sessions 200] [--episodes 20] [--postgres URL]

The machine is shared and noisy: compare the columns of one run. One run (200 x 20):

    sqlite     delete  with forget    0.87  without    0.81  ratio  1.08
    sqlite     clear   with forget    1.20  without    0.95  ratio  1.26
    postgresql delete  with forget    3.50  without    3.15  ratio  1.11
    postgresql clear   with forget    2.11  without    1.90  ratio  1.11
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from pg_schemas import throwaway_schema

from memengine import Episode, ForgetRequest, RetainBatch, SessionConfig, open_engine

DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


class CountingSink:
    mode = "append"

    def __init__(self) -> None:
        self.batches = 0
        self.forgets = 0

    async def retain(self, batch: RetainBatch) -> None:
        self.batches += 1

    async def forget(self, request: ForgetRequest) -> None:
        self.forgets += 1


async def drained(engine) -> None:
    while (await engine.store.outbox_state()).depth:  # noqa: ASYNC110 - the delivery actor empties it
        await anyio.sleep(0.01)


async def timed(call) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def measure(url: str, sessions: int, episodes: int) -> dict[str, float]:
    """Mean seconds per call of each kind."""
    sink = CountingSink()
    config = SessionConfig(retain_every=episodes, max_episodes=episodes + 1, passivate_after=None)
    handed = [f"handed-{n}" for n in range(sessions)]
    kept_back = [f"kept-{n}" for n in range(sessions)]
    async with open_engine(url, retain_sink=sink, config=config) as engine:
        for session_id in handed:
            await engine.session(session_id).add([Episode("user", f"turn {i}") for i in range(episodes)])
        for session_id in kept_back:  # one short of a batch: nothing of these is handed on
            await engine.session(session_id).add([Episode("user", f"turn {i}") for i in range(episodes - 1)])
        await drained(engine)
        figures: dict[str, list[float]] = {}
        for call in ("delete", "clear"):
            # Alternately, each with the outbox empty: only the call's own transaction is timed, not the
            # delivery of the forget before it.
            for n, (handed_id, kept_id) in enumerate(zip(handed, kept_back, strict=True)):
                pair = [("handed", handed_id), ("kept", kept_id)]
                for what, session_id in pair if n % 2 else pair[::-1]:  # each goes first half of the time
                    session = engine.session(session_id)
                    operation = (lambda s=session: s.delete_episodes([2])) if call == "delete" else session.clear
                    figures.setdefault(f"{call} {what}", []).append(await timed(operation))
                    await drained(engine)
        assert sink.forgets == 2 * sessions, sink.forgets
    return {name: statistics.mean(times) for name, times in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="PostgreSQL server (a schema is made and dropped)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        results["sqlite"] = anyio.run(measure, str(Path(directory) / "memory.db"), args.sessions, args.episodes)
    with throwaway_schema(args.postgres) as url:
        results["postgresql"] = anyio.run(measure, url, args.sessions, args.episodes)
    print(f"{args.sessions} sessions of {args.episodes} episodes; mean ms per call, ratio handed-on / not handed-on")
    for store, figures in results.items():
        for call in ("delete", "clear"):
            handed, kept = figures[f"{call} handed"], figures[f"{call} kept"]
            print(
                f"  {store:10} {call:6}  with forget {handed * 1000:7.2f}  without {kept * 1000:7.2f}  "
                f"ratio {handed / kept:5.2f}"
            )


if __name__ == "__main__":
    main()
