"""Where one ``add_items`` call's time goes, stage by stage: MemEngineSession beside the SDK's SQLiteSession.

One add at a time (each awaited before the next) over 20 sessions, the items of
``agents_sessions.py`` (a user message, an assistant message), at one
``synchronous`` for both. Each call is cut at the points where it changes hands,
timed with ``time.perf_counter`` by wrappers this script puts around them:

memengine
  ``convert``   the adapter turns the item into an episode (JSON round trip, tool links, readable text)
  ``to actor``  the handle's checks, the request, the session actor taking the add
  ``to store``  the actor's part of the add up to the store's queue
  ``queued``    the store's queue until the transaction is handed to its thread
  ``wake``      the commit thread's wake-up (the OS, then the interpreter lock)
  ``thread``    the transaction in the commit thread (lease check, insert, commit)
  ``back``      the commit thread's answer reaching the event loop
  ``answer``    the window's entry and the caller's reply being set
  ``caller``    the rest of the callback and the caller's task waking up

SQLiteSession
  ``submit``    ``add_items`` up to ``asyncio.to_thread``
  ``wake``      a worker thread taking the call
  ``thread``    ``json.dumps``, the inserts and the commit in the worker
  ``back``      the result reaching the caller's task

Every stage's median over the adds of a round (the first 50 left out), then the
median over rounds run in alternating order; with the whole call's median. The
stages of one add are sequential, and both sides' Python shares one interpreter
lock: work moved from one stage into the time of another (the event loop's
after the hand-over, say) mostly moves the wait into the next stage.

With ``--item-chars N``, each item's text is N characters instead (prose,
code and JSON, Russian and Chinese: real messages are 1-10 KB).

Run: ``.venv/bin/python benchmarks/add_stages.py [--adds 2000] [--rounds 3]
[--synchronous NORMAL|FULL] [--item-chars N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import agents.memory.sqlite_session as sdk_sqlite_module

from memengine import SessionConfig, open_engine
from memengine.actor import reply as reply_module
from memengine.integrations.openai_agents import MemEngineSession
from memengine.session import actor as actor_module
from memengine.store import commit_thread, committer

sys.path.insert(0, str(Path(__file__).parent))
from agents_sessions import assistant_item, sdk_sqlite, sdk_sqlite_normal, user_item

MEMENGINE_MARKS = ("call", "receive", "enqueue", "submit", "begin", "end", "answered", "reply")
MEMENGINE_STAGES = ("convert", "to actor", "to store", "queued", "wake", "thread", "back", "answer", "caller")
SDK_MARKS = ("submit", "begin", "end")
SDK_STAGES = ("submit", "wake", "thread", "back")
SKIPPED = 50  # the first adds of a round: sessions activating, caches warming
#: What a long item's text is made of, repeated to the length asked for.
FILLER = (
    "The parcel left the warehouse on Tuesday; tracking shows it in transit. "
    'def total(rows):\n    return sum(row["amount"] for row in rows)\n'
    '{"order": 55433, "status": "in_transit", "eta_days": 3} '
    "Посылка покинула склад во вторник. 包裹已于周二离开仓库。 "
)

clock = time.perf_counter
marks: dict[str, float] = {}


def mark(name: str) -> None:
    marks.setdefault(name, clock())  # the first time only: an add's own stage, not a later job's


def instrument_memengine() -> None:
    """Wrap the points where a memengine add changes hands (see the module docstring)."""
    job_init = commit_thread._Job.__init__

    def init(self: Any, function: Callable[..., Any], args: Any, call_soon: Any, answer: Callable[..., Any]) -> None:
        def timed(*arguments: Any) -> Any:
            mark("begin")
            try:
                return function(*arguments)
            finally:
                mark("end")

        def answered(*arguments: Any) -> Any:
            mark("answered")
            return answer(*arguments)

        mark("submit")
        job_init(self, timed, args, call_soon, answered)

    commit_thread._Job.__init__ = init  # type: ignore[method-assign]
    wrap(MemEngineSession, "_call", "call")
    wrap(actor_module.SessionActor, "receive", "receive")
    wrap(committer.Committer, "_enqueue", "enqueue")
    wrap(reply_module.Reply, "set", "reply")


def wrap(owner: type, name: str, label: str) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        mark(label)
        return original(*args, **kwargs)

    setattr(owner, name, wrapped)


def instrument_sdk() -> None:
    to_thread = sdk_sqlite_module.asyncio.to_thread

    async def timed_to_thread(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def timed(*arguments: Any, **keywords: Any) -> Any:
            mark("begin")
            try:
                return function(*arguments, **keywords)
            finally:
                mark("end")

        mark("submit")
        return await to_thread(timed, *args, **kwargs)

    sdk_sqlite_module.asyncio.to_thread = timed_to_thread  # type: ignore[attr-defined]


def item_of(turn: int, chars: int | None) -> dict[str, Any]:
    item = user_item(turn, turn) if turn % 2 else assistant_item(turn, turn)
    if chars is None:
        return item
    text = (f"Turn {turn}. " + FILLER * (chars // len(FILLER) + 1))[:chars]
    if "content" in item and isinstance(item["content"], str):
        return {**item, "content": text}
    return {**item, "content": [{**item["content"][0], "text": text}]}


async def one_round(
    make: Callable[[str], Any], adds: int, points: tuple[str, ...], chars: int | None
) -> list[list[float]]:
    """Per add: the time between consecutive points (from the call's start to its return), in us."""
    sessions = [make(f"s{number}") for number in range(20)]
    rows = []
    for turn in range(adds):
        item = item_of(turn, chars)
        marks.clear()
        start = clock()
        await sessions[turn % 20].add_items([item])
        end = clock()
        missing = [point for point in points if point not in marks]
        if missing:
            raise RuntimeError(f"an add passed none of {missing}: this script's wrappers no longer fit the code")
        times = [start, *(marks[point] for point in points), end]
        if turn >= SKIPPED:
            rows.append([(later - earlier) * 1e6 for earlier, later in itertools.pairwise(times)])
    return rows


async def memengine_round(adds: int, synchronous: str, chars: int | None) -> list[list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "memengine.db"
        async with open_engine(path, synchronous=synchronous, config=SessionConfig()) as engine:
            make = lambda session_id: MemEngineSession(engine, session_id)  # noqa: E731
            return await one_round(make, adds, MEMENGINE_MARKS, chars)


async def sdk_round(adds: int, synchronous: str, chars: int | None) -> list[list[float]]:
    contender = sdk_sqlite if synchronous == "FULL" else sdk_sqlite_normal
    with tempfile.TemporaryDirectory() as directory:
        async with contender(Path(directory)) as (make, level):
            assert level == synchronous, (level, synchronous)
            return await one_round(make, adds, SDK_MARKS, chars)


def medians(rows: list[list[float]]) -> list[float]:
    return [statistics.median(column) for column in zip(*rows, strict=True)] + [
        statistics.median([sum(row) for row in rows])
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adds", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, in alternating order")
    parser.add_argument("--synchronous", choices=("NORMAL", "FULL"), default="NORMAL")
    parser.add_argument("--item-chars", type=int, default=None, help="characters of each item's text")
    args = parser.parse_args()
    instrument_memengine()
    instrument_sdk()
    results: dict[str, list[list[float]]] = {"memengine": [], "SQLiteSession": []}
    for number in range(args.rounds):
        order = [("memengine", memengine_round), ("SQLiteSession", sdk_round)]
        for name, run in order if number % 2 == 0 else order[::-1]:
            results[name].append(medians(await run(args.adds, args.synchronous, args.item_chars)))
    print(
        f"one add_items at a time over 20 sessions, synchronous={args.synchronous}, "
        f"items of {'the benchmark' if args.item_chars is None else f'{args.item_chars} characters'}; "
        f"median us per stage, median of {args.rounds} rounds of {args.adds} adds"
    )
    for name, stages in (("memengine", MEMENGINE_STAGES), ("SQLiteSession", SDK_STAGES)):
        per_round = results[name]
        figures = [statistics.median(column) for column in zip(*per_round, strict=True)]
        cells = "  ".join(f"{stage} {value:.0f}" for stage, value in zip((*stages, "whole call"), figures, strict=True))
        print(f"  {name:14} {cells}")
    ratio = statistics.median([r[-1] for r in results["memengine"]]) / statistics.median(
        [r[-1] for r in results["SQLiteSession"]]
    )
    print(f"  whole call, memengine / SQLiteSession: {ratio:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
