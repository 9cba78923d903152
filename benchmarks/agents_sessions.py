"""MemEngineSession beside the OpenAI Agents SDK's own sessions, on one workload, in one run, at equal durability.

Each contender is an SDK ``Session`` on a file in a temporary directory:

* ``memengine FULL``: ``MemEngineSession`` on ``open_engine(path, synchronous="FULL")``:
  SQLite in WAL mode, an fsync per commit (group commit: one per batch of
  concurrent adds), so an acknowledged add survives a power loss;
* ``SQLiteSession``: the SDK's, as it comes: WAL mode and SQLite's default
  ``synchronous=FULL`` (checked with ``PRAGMA synchronous`` on its connection):
  the same durability;
* ``SQLAlchemySession``: the SDK's, on ``sqlite+aiosqlite`` (when sqlalchemy
  and aiosqlite are installed), as it comes: SQLite's default rollback
  journal and ``synchronous=FULL``: the same durability, another journal;
* ``memengine NORMAL``: memengine's default (``synchronous="NORMAL"``): an
  acknowledged add survives a crash of the process (kill -9), not a power
  loss; and ``SQLiteSession NORMAL`` beside it (its connections set to
  ``synchronous=NORMAL``: the SDK has no option for it, so the benchmark
  sets the pragma on each connection it opens).

Two workloads, both one call at a time (each call awaited before the next):

1. *Many short conversations*: S sessions (default 100) x T turns (default
   50), the sessions taking turns. A turn is what ``Runner.run`` does with a
   session: ``get_items()``, then ``add_items([the user's message])``, then
   ``add_items([the assistant's message])``. Reported: turns/s, and the p50
   and p99 of the adds and of the gets.
2. *One long conversation*: one session, L turns (default 2,000). Reported:
   ``get_items()`` latency (median of 5 calls) after turn 1, 50 and L, and
   what ``get_items()`` returns after turn L, which is what the model is sent
   as history: its items and its size in characters of JSON. memengine's
   window is its default (``SessionConfig()``: the 20 latest items within
   8,000 characters, with a rolling summary of the rest, written by the
   default offline extractive summarizer); the SDK's sessions return all L x 2
   items (no ``limit`` set, as in the SDK's default).

Run: ``.venv/bin/python benchmarks/agents_sessions.py [--sessions S]
[--turns T] [--long-turns L] [--rounds R] [--profile]``. With ``--rounds``,
every contender runs R times in alternating order and the medians are
printed (an fsync's time on a shared disk varies from minute to minute).
``--profile`` adds a cProfile of memengine's single adds (workload 1, at
``NORMAL``, where no fsync hides the CPU time) by cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import pstats
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from agents import SQLiteSession

from memengine import SessionConfig, open_engine
from memengine.integrations.openai_agents import MemEngineSession

try:
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
except ImportError:  # sqlalchemy (with its asyncio extra) or aiosqlite is not installed
    SQLAlchemySession = None  # type: ignore[assignment,misc]

Factory = Callable[[str], Any]  # session_id -> an SDK Session
#: A contender opens its store in a directory and gives a factory of sessions and its PRAGMA synchronous.
Contender = Callable[[Path], AbstractAsyncContextManager[tuple[Factory, str]]]
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def user_item(session: int, turn: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Session {session}, turn {turn}: what is the status of order {turn * 7919}?"}


def assistant_item(session: int, turn: int) -> dict[str, Any]:
    text = f"Order {turn * 7919} left the warehouse on day {turn % 28 + 1}; it should arrive within three days. " * 2
    return {
        "type": "message",
        "id": f"msg_{session}_{turn}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


@asynccontextmanager
async def memengine_at(path: Path, synchronous: str) -> AsyncIterator[tuple[Factory, str]]:
    async with open_engine(path / "memengine.db", synchronous=synchronous, config=SessionConfig()) as engine:
        yield (lambda session_id: MemEngineSession(engine, session_id)), synchronous


def memengine_full(path: Path) -> AbstractAsyncContextManager[tuple[Factory, str]]:
    return memengine_at(path, "FULL")


def memengine_normal(path: Path) -> AbstractAsyncContextManager[tuple[Factory, str]]:
    return memengine_at(path, "NORMAL")


class _SQLiteSessionNormal(SQLiteSession):
    """The SDK's SQLiteSession with ``PRAGMA synchronous=NORMAL`` on each connection (it has no option for it)."""

    @staticmethod
    def _configure_connection(conn: sqlite3.Connection) -> None:
        SQLiteSession._configure_connection(conn)
        conn.execute("PRAGMA synchronous=NORMAL")


@asynccontextmanager
async def sdk_sqlite_at(path: Path, kind: type[SQLiteSession]) -> AsyncIterator[tuple[Factory, str]]:
    sessions: list[SQLiteSession] = []

    def make(session_id: str) -> SQLiteSession:
        session = kind(session_id, path / "sdk.db")
        sessions.append(session)
        return session

    probe = make("probe")  # its connection, configured as every one it opens
    (level,) = probe._get_connection().execute("PRAGMA synchronous").fetchone()
    try:
        yield make, SYNCHRONOUS[level]
    finally:
        for session in sessions:
            session.close()


def sdk_sqlite(path: Path) -> AbstractAsyncContextManager[tuple[Factory, str]]:
    return sdk_sqlite_at(path, SQLiteSession)


def sdk_sqlite_normal(path: Path) -> AbstractAsyncContextManager[tuple[Factory, str]]:
    return sdk_sqlite_at(path, _SQLiteSessionNormal)


@asynccontextmanager
async def sdk_sqlalchemy(path: Path) -> AsyncIterator[tuple[Factory, str]]:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path / 'sqlalchemy.db'}")
    async with engine.connect() as connection:
        level = (await connection.exec_driver_sql("PRAGMA synchronous")).scalar_one()
    try:
        yield (lambda session_id: SQLAlchemySession(session_id, engine=engine, create_tables=True)), SYNCHRONOUS[level]
    finally:
        await engine.dispose()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def timed(call: Any, into: list[float]) -> Any:
    started = time.perf_counter()
    result = await call
    into.append(time.perf_counter() - started)
    return result


async def many_short(make: Factory, sessions: int, turns: int) -> dict[str, Any]:
    handles = [make(f"short-{s}") for s in range(sessions)]
    adds: list[float] = []
    gets: list[float] = []
    started = time.perf_counter()
    for turn in range(turns):
        for s, session in enumerate(handles):
            await timed(session.get_items(), gets)
            await timed(session.add_items([user_item(s, turn)]), adds)
            await timed(session.add_items([assistant_item(s, turn)]), adds)
    elapsed = time.perf_counter() - started
    return {
        "turns/s": sessions * turns / elapsed,
        "add p50": percentile(adds, 0.50),
        "add p99": percentile(adds, 0.99),
        "get p50": percentile(gets, 0.50),
        "get p99": percentile(gets, 0.99),
    }


async def one_long(make: Factory, turns: int) -> dict[str, Any]:
    session = make("long")
    report: dict[str, Any] = {}
    checkpoints = {1, 50, turns}
    for turn in range(1, turns + 1):
        await session.add_items([user_item(0, turn)])
        await session.add_items([assistant_item(0, turn)])
        if turn in checkpoints:
            gets: list[float] = []
            for _ in range(5):
                items = await timed(session.get_items(), gets)
            report[f"get @{turn}"] = statistics.median(gets)
    report["items @last"] = len(items)
    report["chars @last"] = len(json.dumps(items, ensure_ascii=False))
    return report


async def run_one(contender: Contender, sessions: int, turns: int, long_turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        gc.collect()
        async with contender(Path(directory)) as (make, synchronous):
            short = await many_short(make, sessions, turns)
        with tempfile.TemporaryDirectory() as directory_2:
            gc.collect()
            async with contender(Path(directory_2)) as (make, _):
                long = await one_long(make, long_turns)
    return {**short, **long, "synchronous": synchronous}


async def profile_adds(sessions: int, turns: int) -> str:
    """memengine's CPU time per single add, by function: at NORMAL, where no fsync hides it (FULL adds one per add)."""
    with tempfile.TemporaryDirectory() as directory:
        async with memengine_normal(Path(directory)) as (make, _):
            handles = [make(f"p-{s}") for s in range(sessions)]
            for s, session in enumerate(handles):  # activate every session before profiling
                await session.add_items([user_item(s, 0)])
            profiler = cProfile.Profile()
            profiler.enable()
            for turn in range(1, turns):
                for s, session in enumerate(handles):
                    await session.add_items([user_item(s, turn)])
            profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
    return out.getvalue()


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        key: statistics.median(run[key] for run in runs) if isinstance(value, (int, float)) else value
        for key, value in runs[0].items()
    }


def milliseconds(value: float) -> str:
    return f"{value * 1000:.2f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--long-turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every contender, in alternating order")
    parser.add_argument("--profile", action="store_true")
    arguments = parser.parse_args()

    contenders: dict[str, Contender] = {
        "memengine FULL": memengine_full,
        "SQLiteSession (FULL)": sdk_sqlite,
    }
    if SQLAlchemySession is not None:
        contenders["SQLAlchemySession (FULL)"] = sdk_sqlalchemy
    contenders["memengine NORMAL"] = memengine_normal
    contenders["SQLiteSession NORMAL"] = sdk_sqlite_normal

    print(
        f"{arguments.sessions} sessions x {arguments.turns} turns, one call at a time; "
        f"one session of {arguments.long_turns} turns. Times in ms."
    )
    if SQLAlchemySession is None:
        print("SQLAlchemySession: not run (pip install 'sqlalchemy[asyncio]' aiosqlite)")
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for round_number in range(arguments.rounds):
        order = list(contenders) if round_number % 2 == 0 else list(reversed(contenders))
        for name in order:
            rounds[name].append(
                await run_one(contenders[name], arguments.sessions, arguments.turns, arguments.long_turns)
            )
    results = {name: median_of(runs) for name, runs in rounds.items()}
    if arguments.rounds > 1:
        print(f"medians of {arguments.rounds} rounds (the disk's fsync time varies from minute to minute)")
    # The turns at which get_items() was timed, as measured (with fewer than 50 turns, no "get @50").
    at_turns = [f"get @{turn}" for turn in sorted({1, 50, arguments.long_turns}) if turn <= arguments.long_turns]
    columns = ["turns/s", "add p50", "add p99", "get p50", "get p99", *at_turns]
    header = f"{'':26}{'sync':>7}" + "".join(f"{column:>11}" for column in columns) + f"{'items':>7}{'chars':>9}"
    print(header)
    for name, result in results.items():
        cells = [f"{result['turns/s']:.0f}"] + [milliseconds(result[column]) for column in columns[1:]]
        print(
            f"{name:26}{result['synchronous']:>7}"
            + "".join(f"{cell:>11}" for cell in cells)
            + f"{result['items @last']:>7}{result['chars @last']:>9}"
        )
    print("ratios, memengine / SQLiteSession at the same synchronous (turns/s: higher is better; the rest: lower):")
    for level in ("FULL", "NORMAL"):
        ours = results[f"memengine {level}"]
        theirs = results["SQLiteSession (FULL)" if level == "FULL" else "SQLiteSession NORMAL"]
        ratios = "  ".join(f"{column} {ours[column] / theirs[column]:.2f}" for column in columns)
        print(f"  {level}: {ratios}")
    if arguments.profile:
        print(await profile_adds(arguments.sessions, arguments.turns))


if __name__ == "__main__":
    asyncio.run(main())
