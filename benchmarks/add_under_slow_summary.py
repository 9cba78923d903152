"""Add latency while the summarizer is slow: memengine vs a lock-based baseline.

N writers share M sessions; each writer adds K single episodes. The window is
small (``max_episodes``), so nearly every add evicts an episode, and the
summarizer takes L seconds per call. memengine answers an add once it is
committed, whatever the summarizer is doing; the baseline (the classic design)
holds a per-session lock across the wait for the previous summary, so its
writers queue behind the LLM.

Both sides run in the same process, one after the other, on the same machine,
with the same durability (one SQLite INSERT + COMMIT per add, WAL mode,
synchronous=NORMAL, off the event loop). Only ratios are meaningful.

With ``--readers R``, R more tasks read the context (``context()``, not
waiting for the summary; reader ``r`` reads session ``r % M``) in a loop for
as long as the writers write, on both sides; their read latency is printed
too. The baseline's read takes the session lock, as its adds do.
``--no-baseline`` runs memengine only (the baseline needs about
``(N*K/M - max_episodes) * L`` seconds: with one session and a 2 s
summarizer, far too long). For the issue's case (8 writers and 2 readers on
one session, 2 s per summarizer call)::

    .venv/bin/python benchmarks/add_under_slow_summary.py -n 8 -m 1 --readers 2 -l 2 -k 250 --no-baseline

With ``--message-chars C``, each message is C characters of the bundled sample
conversation (a different passage each) instead of a short sentence; the
issue's mixed workload uses 1,400 (``-c 1400``). ``--max-tokens`` sets
``SessionConfig.max_tokens`` on memengine's side.

Run: ``.venv/bin/python benchmarks/add_under_slow_summary.py [--writers N]
[--sessions M] [--latency L] [--adds K] [--readers R] [--message-chars C]
[--max-tokens T] [--no-baseline] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import anyio.abc
import attrs

from memengine import Episode, SessionConfig, open_engine
from memengine.cli.conversation import load_sample_conversation


class SlowSummarizer:
    """Sleeps ``latency`` seconds per call (a stand-in for an LLM) and counts calls."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0
        self.episodes = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls += 1
        self.episodes += len(episodes)
        await anyio.sleep(self.latency)
        return f"{(previous or 'summary')[:200]} +{len(episodes)}"


@attrs.frozen
class RunResult:
    name: str
    latencies: list[float]  # seconds, one per add
    add_seconds: float  # wall time until every writer's last add returned
    drain_seconds: float  # wall time until every eviction was summarized as well
    summarizer_calls: int
    summarized_episodes: int
    evictions: int
    read_latencies: list[float] = attrs.field(factory=list)  # seconds, one per context read (--readers)

    @property
    def adds_per_second(self) -> float:
        return len(self.latencies) / self.add_seconds


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def writer_episodes(writer: int, adds: int, chars: int = 0) -> list[Episode]:
    """The writer's messages: a short sentence each, or ``chars`` characters of the sample conversation."""
    if not chars:
        return [Episode("user", f"writer {writer} says message number {i}.") for i in range(adds)]
    prose = " ".join(turn.content for turn in load_sample_conversation())
    episodes = []
    for i in range(adds):
        start = (writer * 7919 + i * 1543) % (len(prose) - chars)  # a different passage for each message
        head = f"writer {writer}, message {i}: "
        episodes.append(Episode("user", head + prose[start : start + chars - len(head)]))
    return episodes


async def run_writers(
    writers: int,
    sessions: int,
    adds: int,
    add: Callable[[int, Episode], Awaitable[object]],
    readers: int = 0,
    read: Callable[[int], Awaitable[object]] | None = None,
    chars: int = 0,
) -> tuple[list[float], float, list[float]]:
    """Run every writer concurrently; writer ``w`` writes to session ``w % sessions``.

    Meanwhile ``readers`` tasks call ``read`` (reader ``r`` on session ``r % sessions``)
    in a loop until the last writer is done. Returns add latencies, the writers'
    wall time and read latencies.
    """
    latencies: list[float] = []
    read_latencies: list[float] = []
    batches = [writer_episodes(w, adds, chars) for w in range(writers)]
    writing = True

    async def read_loop(r: int) -> None:
        assert read is not None
        while writing:
            started = time.perf_counter()
            await read(r % sessions)
            read_latencies.append(time.perf_counter() - started)

    async def write(w: int) -> None:
        for episode in batches[w]:
            started = time.perf_counter()
            await add(w % sessions, episode)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with anyio.create_task_group() as reading:
        for r in range(readers):
            reading.start_soon(read_loop, r)
        async with anyio.create_task_group() as tasks:
            for w in range(writers):
                tasks.start_soon(write, w)
        add_seconds = time.perf_counter() - started
        writing = False
    return latencies, add_seconds, read_latencies


# -- memengine -----------------------------------------------------------------


async def run_memengine(args: argparse.Namespace, directory: Path) -> RunResult:
    summarizer = SlowSummarizer(args.latency)
    config = SessionConfig(max_episodes=args.max_episodes, max_tokens=args.max_tokens)
    async with open_engine(directory / "memengine.db", summarizer=summarizer, config=config) as engine:
        handles = [engine.session(f"session-{m}") for m in range(args.sessions)]

        async def add(session: int, episode: Episode) -> object:
            return await handles[session].add([episode])

        async def read(session: int) -> object:
            return await handles[session].context()

        started = time.perf_counter()
        latencies, add_seconds, read_latencies = await run_writers(
            args.writers, args.sessions, args.adds, add, args.readers, read, args.message_chars
        )
        for handle in handles:
            await handle.context(wait_for_summary=True)
        drain_seconds = time.perf_counter() - started
    adds_per_session = [args.adds * len(range(m, args.writers, args.sessions)) for m in range(args.sessions)]
    return RunResult(
        "memengine",
        latencies,
        add_seconds,
        drain_seconds,
        summarizer.calls,
        summarizer.episodes,
        evictions=sum(max(0, adds - args.max_episodes) for adds in adds_per_session),
        read_latencies=read_latencies,
    )


# -- the lock-based baseline ---------------------------------------------------


class BaselineStore:
    """One SQLite connection; each write is its own transaction, run in a worker thread, one at a time."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute(
            "CREATE TABLE episodes (session_id TEXT, seq INTEGER, id TEXT, role TEXT, content TEXT, "
            "created_at TEXT, metadata TEXT, PRIMARY KEY (session_id, seq))"
        )
        self._conn.execute("CREATE TABLE summaries (session_id TEXT PRIMARY KEY, summary TEXT)")
        self._one_thread = anyio.CapacityLimiter(1)

    def close(self) -> None:
        self._conn.close()

    async def _write(self, sql: str, params: tuple[object, ...]) -> None:
        def transaction() -> None:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(sql, params)
            self._conn.execute("COMMIT")

        await anyio.to_thread.run_sync(transaction, limiter=self._one_thread)

    async def insert_episode(self, session_id: str, seq: int, episode: Episode) -> None:
        row = (session_id, seq, episode.id, episode.role, episode.content, episode.created_at.isoformat(), "{}")
        await self._write("INSERT INTO episodes VALUES (?, ?, ?, ?, ?, ?, ?)", row)

    async def store_summary(self, session_id: str, summary: str) -> None:
        await self._write("INSERT OR REPLACE INTO summaries VALUES (?, ?)", (session_id, summary))


class LockedSession:
    """The classic design: a lock per session, held while waiting for the previous summary."""

    def __init__(
        self,
        session_id: str,
        store: BaselineStore,
        summarizer: SlowSummarizer,
        max_episodes: int,
        tasks: anyio.abc.TaskGroup,
    ) -> None:
        self._id = session_id
        self._store = store
        self._summarizer = summarizer
        self._max_episodes = max_episodes
        self._tasks = tasks
        self._lock = anyio.Lock()
        self._window: list[Episode] = []
        self._summary: str | None = None
        self._last_seq = 0
        self._summary_done: anyio.Event | None = None
        self.evictions = 0

    async def add(self, episode: Episode) -> None:
        async with self._lock:
            self._last_seq += 1
            self._window.append(episode)
            await self._store.insert_episode(self._id, self._last_seq, episode)
            if len(self._window) > self._max_episodes:
                evicted = self._window[: -self._max_episodes]
                del self._window[: -self._max_episodes]
                self.evictions += len(evicted)
                if self._summary_done is not None:
                    await self._summary_done.wait()  # writers queue here, behind the LLM
                self._summary_done = anyio.Event()
                self._tasks.start_soon(self._summarize, evicted, self._summary_done)

    async def read(self) -> tuple[str | None, tuple[Episode, ...]]:
        async with self._lock:
            return self._summary, tuple(self._window)

    async def _summarize(self, evicted: list[Episode], done: anyio.Event) -> None:
        try:
            self._summary = await self._summarizer.summarize(self._summary, evicted)
            await self._store.store_summary(self._id, self._summary)
        finally:
            done.set()


async def run_baseline(args: argparse.Namespace, directory: Path) -> RunResult:
    summarizer = SlowSummarizer(args.latency)
    store = BaselineStore(directory / "baseline.db")
    try:
        async with anyio.create_task_group() as summaries:
            sessions = [
                LockedSession(f"session-{m}", store, summarizer, args.max_episodes, summaries)
                for m in range(args.sessions)
            ]

            async def add(session: int, episode: Episode) -> object:
                return await sessions[session].add(episode)

            async def read(session: int) -> object:
                return await sessions[session].read()

            started = time.perf_counter()
            latencies, add_seconds, read_latencies = await run_writers(
                args.writers, args.sessions, args.adds, add, args.readers, read, args.message_chars
            )
        drain_seconds = time.perf_counter() - started
    finally:
        store.close()
    return RunResult(
        "baseline",
        latencies,
        add_seconds,
        drain_seconds,
        summarizer.calls,
        summarizer.episodes,
        evictions=sum(session.evictions for session in sessions),
        read_latencies=read_latencies,
    )


# -- report --------------------------------------------------------------------


def report(args: argparse.Namespace, memengine: RunResult, baseline: RunResult | None) -> None:
    total = args.writers * args.adds
    print(
        f"add under a slow summarizer: {args.writers} writers x {args.adds} adds over {args.sessions} sessions "
        f"({total} adds), summarizer {args.latency * 1000:.0f} ms/call, max_episodes={args.max_episodes}, "
        f"backend={args.backend}"
        + (f", {args.message_chars}-character messages" if args.message_chars else "")
        + (f", max_tokens={args.max_tokens}" if args.max_tokens else "")
        + (f", {args.readers} readers looping on context()" if args.readers else "")
        + (", no baseline" if baseline is None else "")
    )
    results = [memengine] if baseline is None else [memengine, baseline]
    header = (
        f"{'':<10} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'adds/s':>9} {'adds s':>8} {'drain s':>8} "
        f"{'evicted':>8} {'LLM calls':>9}"
    )
    print(header)
    for result in results:
        print(
            f"{result.name:<10} {percentile(result.latencies, 0.50) * 1000:>9.2f} "
            f"{percentile(result.latencies, 0.99) * 1000:>9.2f} {max(result.latencies) * 1000:>9.2f} "
            f"{result.adds_per_second:>9.0f} {result.add_seconds:>8.2f} {result.drain_seconds:>8.2f} "
            f"{result.evictions:>8} {result.summarizer_calls:>9}"
        )
    if args.readers:
        for result in results:
            reads = result.read_latencies
            if reads:
                print(
                    f"{result.name:<10} reads: {len(reads)} context reads, "
                    f"p50 {percentile(reads, 0.50) * 1000:.2f} ms   p99 {percentile(reads, 0.99) * 1000:.2f} ms   "
                    f"max {max(reads) * 1000:.2f} ms"
                )
            else:
                print(f"{result.name:<10} reads: none completed while the writers wrote")
    if baseline is None:
        report_calls(memengine)
        return
    p50_ratio = percentile(baseline.latencies, 0.50) / percentile(memengine.latencies, 0.50)
    p99_ratio = percentile(baseline.latencies, 0.99) / percentile(memengine.latencies, 0.99)
    rate_ratio = memengine.adds_per_second / baseline.adds_per_second
    print(f"ratio  baseline p50 / memengine p50:       {p50_ratio:8.1f}x")
    print(f"ratio  baseline p99 / memengine p99:       {p99_ratio:8.1f}x")
    print(f"ratio  memengine adds/s / baseline adds/s: {rate_ratio:8.1f}x")
    for result in (memengine, baseline):
        report_calls(result)
    print(
        "(adds s: until the last add returned; drain s: until every eviction was summarized too. "
        "Latency is measured around each add call.)"
    )


def report_calls(result: RunResult) -> None:
    per_call = result.summarized_episodes / result.summarizer_calls if result.summarizer_calls else 0.0
    print(
        f"{result.name}: {result.summarizer_calls} summarizer calls for {result.evictions} evicted episodes "
        f"({per_call:.1f} episodes per call)"
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as name:
        directory = Path(name)
        memengine = await run_memengine(args, directory)
        baseline = None if args.no_baseline else await run_baseline(args, directory)
    report(args, memengine, baseline)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--writers", type=int, default=20, help="concurrent writers (N)")
    parser.add_argument("-m", "--sessions", type=int, default=10, help="sessions the writers share (M)")
    parser.add_argument("-l", "--latency", type=float, default=0.2, help="summarizer seconds per call (L)")
    parser.add_argument("-k", "--adds", type=int, default=60, help="adds per writer (K)")
    parser.add_argument("--max-episodes", type=int, default=8, help="window size (SessionConfig.max_episodes)")
    parser.add_argument(
        "-r", "--readers", type=int, default=0, help="tasks reading context() in a loop while the writers write"
    )
    parser.add_argument(
        "-c", "--message-chars", type=int, default=0, help="characters per message (0: a short sentence)"
    )
    parser.add_argument("--max-tokens", type=int, default=None, help="SessionConfig.max_tokens (memengine side)")
    parser.add_argument("--no-baseline", action="store_true", help="run memengine only")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    if min(args.writers, args.sessions, args.adds, args.max_episodes) < 1 or min(args.latency, args.readers) < 0:
        parser.error("counts must be at least 1 (readers at least 0) and the latency non-negative")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
