"""Durable add throughput: memengine vs raw sqlite3, measured side by side.

S sessions, each with one writer task adding single episodes in a loop (A adds
per session), against a file-backed SQLite store in a temporary directory. In
the same run, on the same machine, raw sqlite3 inserts the same rows into a
table of the same shape with the same pragmas (WAL, synchronous=NORMAL):

* raw single-row: one INSERT + COMMIT per row (what a durable single add costs
  without an engine);
* raw batched: 100 rows per transaction (roughly what group commit can reach).

Each round runs all three on fresh database files, alternating the order
between rounds; the medians over rounds are reported, because the machine is
shared and noisy. Episodes and raw rows are built before the clocks start, and
the garbage collector runs before every step, so that no step pays for the
garbage the one before it left (a closed engine's reference cycles); the
collections a step's own work triggers stay inside its time.

With ``--evicting``, the episodes are 200 characters long, and each round
also runs memengine with ``max_episodes=64`` and a summarizer that returns at
once, so adds evict and summaries are written while the writers go on; it is
reported beside the same adds without eviction and the raw rates, all on the
same 200-character rows (default 200 adds per session), with what Python's
cyclic garbage collector took of the evicting adds (its collections, their
share of the time, the longest). With ``--evicting --gc-ab``, each round also
runs the evicting engine with the collector off (``gc.disable()`` over the
adds), and the rate's ratio to that is reported.

With ``--evicting --retry-ab``, each round also runs the evicting engine with
the summarizer's retries done two other ways, so that their cost on the happy
path is measured side by side with what the engine does (memengine/retrying.py:
a first try made directly, tenacity only after a failure):

* ``hand-rolled``: the loop of our own the engine used before (fb319d2), no
  tenacity at all;
* ``tenacity-every-call``: a tenacity ``AsyncRetrying`` built for every call,
  as before that (the cost the fast path avoids);
* ``engine's-again``: the engine's own, run in another slot of the round, so
  that what the order of the steps alone does to a ratio is seen.

Run: ``.venv/bin/python benchmarks/throughput.py [--sessions S] [--adds A]
[--rounds R] [--backend asyncio|trio] [--default-config | --evicting [--retry-ab] [--gc-ab]] [--profile]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import io
import json
import pstats
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import tenacity

import memengine.retrying
import memengine.summarizer.actor
from memengine import Episode, SessionConfig, open_engine
from memengine.retrying import wait_jittered_exponential

Row = tuple[str, int, str, str, str, str, str]

RAW_SCHEMA = (
    "CREATE TABLE episodes (session_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL, "
    "role TEXT NOT NULL, content TEXT NOT NULL, created_at TEXT NOT NULL, metadata TEXT NOT NULL, "
    "PRIMARY KEY (session_id, seq))"
)
# memengine's idempotency index, same shape (the default ids are time-ordered UUIDv7).
RAW_ID_INDEX = "CREATE UNIQUE INDEX episodes_by_id ON episodes (id, session_id)"
RAW_INSERT = "INSERT INTO episodes VALUES (?, ?, ?, ?, ?, ?, ?)"
EVICTING_MAX_EPISODES = 64
EVICTING_CHARS = 200


class InstantSummarizer:
    """A summarizer that returns at once (no LLM wait), counting its calls and episodes."""

    def __init__(self) -> None:
        self.calls = 0
        self.episodes = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls += 1
        self.episodes += len(episodes)
        return f"{(previous or 'summary')[:200]} +{len(episodes)}"


@attrs.frozen
class EngineRound:
    adds_per_second: float
    seconds: float
    activation_seconds: float
    latencies: list[list[float]]  # per session, in add order, seconds
    summarizer_calls: int = 0
    summarized_episodes: int = 0
    cpu_seconds: float = 0.0  # the process's CPU time (all threads) over the adds: less noisy on a busy machine
    gc_pauses: list[float] = attrs.field(factory=list)  # each cyclic collection during the adds, seconds


@contextlib.contextmanager
def collector_pauses(into: list[float], enabled: bool = True) -> Iterator[None]:
    """Record how long each run of Python's cyclic garbage collector takes (with ``enabled=False``: none runs).

    The collector stops every thread while it runs: on the event loop's thread, a pause of every session.
    """
    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            into.append(time.perf_counter() - started[0])

    gc.callbacks.append(callback)
    if not enabled:
        gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.callbacks.remove(callback)


def session_id(index: int) -> str:
    return f"session-{index:04d}"


def build_episodes(sessions: int, adds: int, chars: int | None = None) -> list[list[Episode]]:
    """Episodes per session, created in the order the writers will add them.

    A real application creates an episode just before adding it; creating them
    round-robin here gives their (time-ordered) default ids the same order.
    With ``chars``, every content is padded (or cut) to exactly that length.
    """
    episodes: list[list[Episode]] = [[] for _ in range(sessions)]
    for i in range(adds):
        for s in range(sessions):
            content = f"Turn {i} of {session_id(s)}: the user asks about the deployment plan and its rollback steps."
            if chars is not None:
                filler = " Then the assistant lists each step, its owner and how long it takes."
                while len(content) < chars:
                    content += filler
                content = content[:chars]
            episodes[s].append(Episode("user" if i % 2 == 0 else "assistant", content))
    return episodes


def build_rows(episodes: list[list[Episode]]) -> list[Row]:
    """The same episodes as raw rows, interleaved across sessions as concurrent writers would."""
    rows: list[Row] = []
    for i in range(max(len(batch) for batch in episodes)):
        for s, batch in enumerate(episodes):
            if i < len(batch):
                episode = batch[i]
                rows.append(
                    (
                        session_id(s),
                        i + 1,
                        episode.id,
                        episode.role,
                        episode.content,
                        episode.created_at.isoformat(),
                        json.dumps(episode.metadata),
                    )
                )
    return rows


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


# -- raw sqlite3 ---------------------------------------------------------------


def raw_connection(path: Path, id_index: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(RAW_SCHEMA)
    if id_index:
        conn.execute(RAW_ID_INDEX)
    conn.commit()
    return conn


def raw_single_row(path: Path, rows: list[Row], id_index: bool) -> float:
    """Rows/s with one INSERT + COMMIT per row."""
    conn = raw_connection(path, id_index)
    try:
        started = time.perf_counter()
        for row in rows:
            conn.execute(RAW_INSERT, row)
            conn.commit()
        return len(rows) / (time.perf_counter() - started)
    finally:
        conn.close()


def raw_batched(path: Path, rows: list[Row], id_index: bool, batch: int = 100) -> float:
    """Rows/s with ``batch`` rows per transaction."""
    conn = raw_connection(path, id_index)
    try:
        started = time.perf_counter()
        for start in range(0, len(rows), batch):
            conn.executemany(RAW_INSERT, rows[start : start + batch])
            conn.commit()
        return len(rows) / (time.perf_counter() - started)
    finally:
        conn.close()


# -- memengine -----------------------------------------------------------------


async def engine_round(
    path: Path,
    episodes: list[list[Episode]],
    config: SessionConfig,
    summarizer: InstantSummarizer | None,
    collector: bool = True,
) -> EngineRound:
    latencies: list[list[float]] = [[] for _ in episodes]
    options: dict[str, Any] = {} if summarizer is None else {"summarizer": summarizer}
    async with open_engine(path, config=config, **options) as engine:
        handles = [engine.session(session_id(s)) for s in range(len(episodes))]

        # Activate every session first, so the clock measures adds only.
        started = time.perf_counter()
        async with anyio.create_task_group() as tasks:
            for handle in handles:
                tasks.start_soon(handle.context)
        activation_seconds = time.perf_counter() - started

        async def write(s: int) -> None:
            handle, record = handles[s], latencies[s]
            for episode in episodes[s]:
                before = time.perf_counter()
                await handle.add((episode,))
                record.append(time.perf_counter() - before)

        gc_pauses: list[float] = []
        with collector_pauses(gc_pauses, enabled=collector):
            started, cpu_started = time.perf_counter(), time.process_time()
            async with anyio.create_task_group() as tasks:
                for s in range(len(episodes)):
                    tasks.start_soon(write, s)
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    # seconds ends when the last add returned; summaries may still be running then (closing waits for them).
    total = sum(len(batch) for batch in episodes)
    calls = summarizer.calls if summarizer is not None else 0
    summarized = summarizer.episodes if summarizer is not None else 0
    return EngineRound(
        total / seconds, seconds, activation_seconds, latencies, calls, summarized, cpu_seconds, gc_pauses
    )


def run_engine_round(
    args: argparse.Namespace,
    path: Path,
    episodes: list[list[Episode]],
    config: SessionConfig,
    summarizer: InstantSummarizer | None = None,
    collector: bool = True,
) -> EngineRound:
    return anyio.run(engine_round, path, episodes, config, summarizer, collector, backend=args.backend)


# -- the summarizer's retries, three ways (--retry-ab) ---------------------------------------------


_OLD_JITTER = random.Random()


async def hand_rolled_retries(call, attempts, backoff, backoff_max, before_sleep):  # type: ignore[no-untyped-def]
    """The engine's own loop before retries went back to tenacity (fb319d2), as it was."""
    attempt = 1
    while True:
        try:
            return await call(), attempt
        except Exception as error:
            if attempt >= attempts:
                raise
            seconds = _OLD_JITTER.uniform(0, min(backoff_max, backoff * 2.0 ** min(attempt - 1, 64)))
            before_sleep(attempt, error, seconds)
        await anyio.sleep(seconds)
        attempt += 1


async def tenacity_every_call(call, attempts, backoff, backoff_max, before_sleep):  # type: ignore[no-untyped-def]
    """A tenacity ``AsyncRetrying`` built and run for every call (what the engine did before fb319d2)."""
    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(attempts),
        wait=wait_jittered_exponential(multiplier=backoff, max=backoff_max),
        retry=tenacity.retry_if_exception_type(Exception),
        sleep=anyio.sleep,
        before_sleep=lambda state: before_sleep(state.attempt_number, state.outcome.exception(), 0.0),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            result = await call()
    return result, attempt.retry_state.attempt_number


RETRY_VARIANTS = {
    "hand-rolled": hand_rolled_retries,
    "tenacity-every-call": tenacity_every_call,
    # The engine's own again, in another slot of the round: what the order alone does to a ratio.
    "engine's-again": memengine.retrying.with_retries,
}


async def _answer() -> str:
    return "summary"


async def _time_wrapper(wrapper, calls: int) -> float:  # type: ignore[no-untyped-def]
    """Microseconds per ``wrapper(call)`` around a call that answers at once (no failure, no sleep)."""
    started = time.perf_counter()
    for _ in range(calls):
        await wrapper(_answer, 3, 0.5, 30.0, lambda *failure: None)
    return (time.perf_counter() - started) / calls * 1e6


def wrapper_costs(args: argparse.Namespace, repeats: int = 15, calls: int = 5000) -> dict[str, list[float]]:
    """Per-call cost of each way of retrying, alone, interleaved ``repeats`` times (order rotated each time)."""
    wrappers = {"engine's": memengine.summarizer.actor.with_retries, **RETRY_VARIANTS}
    costs: dict[str, list[float]] = {name: [] for name in wrappers}
    names = list(wrappers)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            gc.collect()
            costs[name].append(anyio.run(_time_wrapper, wrappers[name], calls, backend=args.backend))
    return costs


def run_with_retries(variant: str, run):  # type: ignore[no-untyped-def]
    """``run()`` with the summarizer actor's ``with_retries`` replaced by ``variant`` (restored after)."""
    engine_own = memengine.summarizer.actor.with_retries
    memengine.summarizer.actor.with_retries = RETRY_VARIANTS[variant]  # type: ignore[assignment]
    try:
        return run()
    finally:
        memengine.summarizer.actor.with_retries = engine_own


# -- the benchmark -------------------------------------------------------------


def engine_config(args: argparse.Namespace) -> SessionConfig:
    if args.default_config:
        return SessionConfig()
    # A window large enough that summarization never starts: this measures the write path.
    return SessionConfig(max_episodes=max(1000, args.adds + 1), max_chars=1_000_000_000)


def evicting_config() -> SessionConfig:
    # max_chars large enough that max_episodes binds (64 x 200 characters would exceed the default 8,000).
    return SessionConfig(max_episodes=EVICTING_MAX_EPISODES, max_chars=1_000_000_000)


def profile_engine(args: argparse.Namespace, directory: Path, episodes: list[list[Episode]]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run_engine_round(args, directory / "profile.db", episodes, engine_config(args))
    profiler.disable()
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(order).print_stats(30)
        print(f"\n== cProfile of one memengine round, top 30 by {order} ==")
        print(out.getvalue().split("\n\n", 1)[-1].rstrip())


def main(args: argparse.Namespace) -> None:
    config = engine_config(args)
    episodes = build_episodes(args.sessions, args.adds, EVICTING_CHARS if args.evicting else None)
    rows = build_rows(episodes)
    total = len(rows)
    print(
        f"durable single-episode adds: {args.sessions} sessions x {args.adds} adds = {total}, "
        f"backend={args.backend}, rounds={args.rounds}, "
        f"config={'default SessionConfig()' if args.default_config else f'max_episodes={config.max_episodes}'}, "
        f"raw (id, session_id) index={'yes' if args.raw_id_index else 'no'}"
        + (
            f", evicting row: max_episodes={EVICTING_MAX_EPISODES}, instant summarizer, "
            f"all episodes {EVICTING_CHARS} characters"
            if args.evicting
            else ""
        )
    )
    single: list[float] = []
    single_indexed: list[float] = []
    batched: list[float] = []
    engine: list[EngineRound] = []
    evicting: list[EngineRound] = []
    variants: dict[str, list[EngineRound]] = {name: [] for name in RETRY_VARIANTS} if args.retry_ab else {}
    no_collector: list[EngineRound] = []
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as name:
        directory = Path(name)
        for round_number in range(args.rounds):
            order = ["single", "single-indexed", "batched", "engine"] + (["evicting"] if args.evicting else [])
            order += list(variants) + (["evicting-no-gc"] if args.gc_ab else [])
            if round_number % 2:
                order.reverse()  # alternate, so neither side always runs on a warmer (or busier) machine
            for step in order:
                path = directory / f"{step}-{round_number}.db"
                gc.collect()  # no step pays for the garbage of the one before it (a closed engine's, say)
                if step == "single":
                    single.append(raw_single_row(path, rows, args.raw_id_index))
                elif step == "single-indexed":
                    single_indexed.append(raw_single_row(path, rows, id_index=True))
                elif step == "batched":
                    batched.append(raw_batched(path, rows, args.raw_id_index))
                elif step == "evicting":
                    evicting.append(run_engine_round(args, path, episodes, evicting_config(), InstantSummarizer()))
                elif step == "evicting-no-gc":
                    no_collector.append(
                        run_engine_round(args, path, episodes, evicting_config(), InstantSummarizer(), collector=False)
                    )
                elif step in variants:
                    variants[step].append(
                        run_with_retries(
                            step,
                            functools.partial(
                                run_engine_round, args, path, episodes, evicting_config(), InstantSummarizer()
                            ),
                        )
                    )
                else:
                    engine.append(run_engine_round(args, path, episodes, config))
            print(
                f"round {round_number + 1}: memengine {engine[-1].adds_per_second:>8.0f} adds/s   "
                f"raw single-row {single[-1]:>8.0f} rows/s   raw batched(100) {batched[-1]:>8.0f} rows/s   "
                f"memengine/single {engine[-1].adds_per_second / single[-1]:.2f}   "
                f"memengine/batched {engine[-1].adds_per_second / batched[-1]:.2f}"
            )
            if args.evicting:
                print(
                    f"         evicting memengine {evicting[-1].adds_per_second:>8.0f} adds/s   "
                    f"evicting/single {evicting[-1].adds_per_second / single[-1]:.2f}   "
                    f"evicting/no eviction {evicting[-1].adds_per_second / engine[-1].adds_per_second:.2f}   "
                    f"summarizer calls {evicting[-1].summarizer_calls}"
                )
            if no_collector:
                print(
                    f"         evicting, collector off {no_collector[-1].adds_per_second:>8.0f} adds/s   "
                    f"on/off {evicting[-1].adds_per_second / no_collector[-1].adds_per_second:.2f}"
                )
            for name, rounds in variants.items():
                print(
                    f"         evicting, retries {name:<19} {rounds[-1].adds_per_second:>8.0f} adds/s   "
                    f"engine's/{name} {evicting[-1].adds_per_second / rounds[-1].adds_per_second:.3f}"
                )
        if args.profile:
            profile_engine(args, directory, episodes)
    report(args, engine, single, single_indexed, batched)
    if args.evicting:
        report_evicting(args, evicting, engine, single)
        report_collector(args, evicting, no_collector)
    if variants:
        report_retry_ab(args, evicting, variants)
        costs = wrapper_costs(args)
        print("the retry wrapper alone, around a call that answers at once (median of 15 interleaved runs of 5,000)")
        for name, microseconds in costs.items():
            print(f"  {name:<54}{statistics.median(microseconds):>10.2f} us per call")


def report(
    args: argparse.Namespace,
    engine: list[EngineRound],
    single: list[float],
    single_indexed: list[float],
    batched: list[float],
) -> None:
    rates = [r.adds_per_second for r in engine]
    print(f"\nmedian over {args.rounds} rounds")
    print(f"  memengine durable adds/s                        {statistics.median(rates):>10.0f}")
    print(f"  raw sqlite3 single-row txn/s                    {statistics.median(single):>10.0f}")
    print(f"  raw sqlite3 single-row txn/s, memengine indexes {statistics.median(single_indexed):>10.0f}")
    print(f"  raw sqlite3 rows/s, 100 per txn                 {statistics.median(batched):>10.0f}")
    single_ratio = statistics.median(e / s for e, s in zip(rates, single, strict=True))
    indexed_ratio = statistics.median(e / s for e, s in zip(rates, single_indexed, strict=True))
    batched_ratio = statistics.median(e / b for e, b in zip(rates, batched, strict=True))
    print(f"  ratio memengine / raw single-row                {single_ratio:>10.2f}")
    print(f"  ratio memengine / raw single-row, same indexes  {indexed_ratio:>10.2f}")
    print(f"  ratio memengine / raw batched                   {batched_ratio:>10.2f}")
    print(
        f"  memengine activation of {args.sessions} sessions (median): "
        f"{statistics.median(r.activation_seconds for r in engine) * 1000:.1f} ms"
    )

    # Latency, from the median-throughput round.
    median_round = sorted(engine, key=lambda r: r.adds_per_second)[len(engine) // 2]
    every = [latency for session in median_round.latencies for latency in session]
    tenth = max(1, args.adds // 10)
    first = [latency for session in median_round.latencies for latency in session[:tenth]]
    last = [latency for session in median_round.latencies for latency in session[-tenth:]]
    print(f"memengine add latency (round at median throughput, {len(every)} adds)")
    print(
        f"  p50 {percentile(every, 0.5) * 1000:.2f} ms   p99 {percentile(every, 0.99) * 1000:.2f} ms   "
        f"max {max(every) * 1000:.2f} ms"
    )
    first_p50, last_p50 = percentile(first, 0.5), percentile(last, 0.5)
    print(
        f"  growth with history: p50 of each session's first {tenth} adds {first_p50 * 1000:.2f} ms, "
        f"last {tenth} adds {last_p50 * 1000:.2f} ms (last/first {last_p50 / first_p50:.2f}); "
        f"p99 first {percentile(first, 0.99) * 1000:.2f} ms, last {percentile(last, 0.99) * 1000:.2f} ms"
    )


def report_evicting(
    args: argparse.Namespace, evicting: list[EngineRound], engine: list[EngineRound], single: list[float]
) -> None:
    rates = [r.adds_per_second for r in evicting]
    plain = [r.adds_per_second for r in engine]
    print(f"evicting (max_episodes={EVICTING_MAX_EPISODES}, instant summarizer), median over {args.rounds} rounds")
    print(f"  memengine durable adds/s, evicting              {statistics.median(rates):>10.0f}")
    print(f"  memengine durable adds/s, no eviction           {statistics.median(plain):>10.0f}")
    print(f"  raw sqlite3 single-row txn/s                    {statistics.median(single):>10.0f}")
    single_ratio = statistics.median(e / s for e, s in zip(rates, single, strict=True))
    plain_ratio = statistics.median(e / s for e, s in zip(plain, single, strict=True))
    vs_plain = statistics.median(e / p for e, p in zip(rates, plain, strict=True))
    print(f"  ratio evicting / raw single-row                 {single_ratio:>10.2f}")
    print(f"  ratio no eviction / raw single-row              {plain_ratio:>10.2f}")
    print(f"  ratio evicting / no eviction                    {vs_plain:>10.2f}")
    median_round = sorted(evicting, key=lambda r: r.adds_per_second)[len(evicting) // 2]
    every = [latency for session in median_round.latencies for latency in session]
    per_call = median_round.summarized_episodes / max(1, median_round.summarizer_calls)
    print(
        f"  round at median: {median_round.summarizer_calls} summarizer calls ({per_call:.1f} episodes per call); "
        f"add p50 {percentile(every, 0.5) * 1000:.2f} ms   p99 {percentile(every, 0.99) * 1000:.2f} ms   "
        f"max {max(every) * 1000:.2f} ms"
    )


def report_collector(args: argparse.Namespace, evicting: list[EngineRound], no_collector: list[EngineRound]) -> None:
    """What Python's cyclic garbage collector took of the evicting rounds (and, with --gc-ab, their rate without it)."""
    share = statistics.median(sum(r.gc_pauses) / r.seconds for r in evicting)
    collections = statistics.median(len(r.gc_pauses) for r in evicting)
    longest = statistics.median(max(r.gc_pauses, default=0.0) for r in evicting)
    print(
        f"  cyclic GC during the evicting adds (medians of rounds): {collections:.0f} collections, "
        f"{share:.1%} of the time, the longest {longest * 1000:.1f} ms"
    )
    if no_collector:
        rates = [r.adds_per_second for r in evicting]
        off = [r.adds_per_second for r in no_collector]
        ratio = statistics.median(e / o for e, o in zip(rates, off, strict=True))
        print(f"  memengine durable adds/s, evicting, collector off{statistics.median(off):>10.0f}")
        print(f"  ratio evicting / evicting with the collector off{ratio:>10.2f}")


def report_retry_ab(
    args: argparse.Namespace, evicting: list[EngineRound], variants: dict[str, list[EngineRound]]
) -> None:
    engine_rates = [r.adds_per_second for r in evicting]
    engine_cpu = [r.cpu_seconds for r in evicting]
    print(f"summarizer retries on the happy path (evicting rounds), median over {args.rounds} rounds")
    print(
        f"  engine's (first try direct, tenacity after a failure) {statistics.median(engine_rates):>10.0f} adds/s"
        f"   {statistics.median(engine_cpu):.2f} CPU s"
    )
    for name, rounds in variants.items():
        rates = [r.adds_per_second for r in rounds]
        ratios = [e / v for e, v in zip(engine_rates, rates, strict=True)]
        cpu_ratios = [v.cpu_seconds / e for e, v in zip(engine_cpu, rounds, strict=True)]
        print(
            f"  {name:<54}{statistics.median(rates):>10.0f} adds/s   "
            f"{statistics.median(r.cpu_seconds for r in rounds):.2f} CPU s"
        )
        print(
            f"    rate, engine's/{name}: median {statistics.median(ratios):.3f} "
            f"(per round {' '.join(f'{r:.2f}' for r in ratios)})"
        )
        print(
            f"    CPU per add, {name}/engine's: median {statistics.median(cpu_ratios):.3f} "
            f"(per round {' '.join(f'{r:.2f}' for r in cpu_ratios)})"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-s", "--sessions", type=int, default=100, help="concurrent sessions, one writer each (S)")
    parser.add_argument(
        "-a", "--adds", type=int, default=None, help="single-episode adds per session (A; 300, or 200 with --evicting)"
    )
    parser.add_argument("-r", "--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument(
        "--default-config",
        action="store_true",
        help="use SessionConfig() (window of 20, so the offline summarizer runs) instead of a large window",
    )
    parser.add_argument(
        "--raw-id-index",
        action="store_true",
        help="give the raw single-row and batched tables memengine's unique (id, session_id) index too",
    )
    parser.add_argument(
        "--evicting",
        action="store_true",
        help=f"200-character episodes, and also run memengine with max_episodes={EVICTING_MAX_EPISODES} "
        "and an instant summarizer in every round",
    )
    parser.add_argument(
        "--retry-ab",
        action="store_true",
        help="with --evicting: also run the evicting engine with the summarizer's retries hand-rolled and with "
        "tenacity built on every call, and report the engine's rate over each",
    )
    parser.add_argument(
        "--gc-ab",
        action="store_true",
        help="with --evicting: also run the evicting engine with Python's cyclic garbage collector off (gc.disable), "
        "and report the engine's rate over that",
    )
    parser.add_argument("--profile", action="store_true", help="afterwards, cProfile one extra memengine round")
    args = parser.parse_args()
    if args.evicting and args.default_config:
        parser.error("--evicting and --default-config do not go together")
    if args.retry_ab and not args.evicting:
        parser.error("--retry-ab needs --evicting")
    if args.gc_ab and not args.evicting:
        parser.error("--gc-ab needs --evicting")
    if args.adds is None:
        args.adds = 200 if args.evicting else 300
    if min(args.sessions, args.adds, args.rounds) < 1:
        parser.error("--sessions, --adds and --rounds must be at least 1")
    return args


if __name__ == "__main__":
    main(parse_args())
