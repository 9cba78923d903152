"""The offline token estimate: its speed on each kind of text, its growth, its error.

For each kind of text in ``tests/token_samples`` (repeated to about 2 MB), the
best of five runs of :func:`memengine.tokens.estimate_tokens`, in MB of UTF-8
per second, beside the naive ``len(text) / 4`` (which costs nothing: its
column is its error against ``o200k_base``, beside the estimate's). Then the
time of one 1,400-character message, and the growth on ``a+a+...`` (the input
that made the old regular expression quadratic) at 250K, 1M and 4M
characters: linear means a constant time per million characters.

With ``--stall``, what a 400,000-character tool output costs the event loop:
a monitor task sleeps 1 ms in a loop and records how late it wakes (the
longest stall), while a session (SQLite, ``max_tokens`` set) is given a few
turns, the tool output, then read 20 times, then loaded again by a new
engine; once with the offline estimate, once with a tokenizer 50 times slower
(about as fast as a pure-Python BPE tokenizer). Beside it, the time the
tokenizer takes for that output: what one add would have stalled every
session for, had it been counted on the event loop.

With ``--accuracy``, the error of the estimate (and of ``len(text) / 4``)
against the counts recorded from ``o200k_base`` and ``cl100k_base``, in total
per kind and per message (median, 5th and 95th percentile).

Run: ``.venv/bin/python benchmarks/tokens.py [--accuracy | --stall] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.token_samples

from memengine import Episode, SessionConfig, open_engine
from memengine.summarizer.extractive import ExtractiveSummarizer
from memengine.tokens import estimate_tokens
from tests.token_samples import SAMPLE_FILES, messages, references

SIZE = 2_000_000


def naive(text: str) -> int:
    return max(1, round(len(text) / 4)) if text else 0


def best_of(runs: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def error(estimated: int, real: int) -> str:
    return f"{estimated / real - 1:+.1%}"


def speed() -> None:
    recorded = references()
    print(f"{'kind':<14}{'MB/s':>8}{'Mchar/s':>9}   error vs o200k: estimate  len/4")
    for kind in SAMPLE_FILES:
        parts = messages(kind)
        sample = "\n\n".join(parts)
        text = sample * (SIZE // len(sample.encode()) + 1)
        seconds = best_of(5, lambda text=text: estimate_tokens(text))  # type: ignore[misc]
        real = sum(recorded[kind]["o200k_base"])
        print(
            f"{kind:<14}{len(text.encode()) / seconds / 1e6:>8.0f}{len(text) / seconds / 1e6:>9.0f}"
            f"   {error(sum(map(estimate_tokens, parts)), real):>24}  {error(sum(map(naive, parts)), real):>5}"
        )
    message = " ".join(messages("conversation"))[:1400]
    per_call = best_of(5, lambda: [estimate_tokens(message) for _ in range(1000)]) / 1000
    print(f"one 1,400-character message (conversation turns): {per_call * 1e6:.1f} us")
    print("a+a+... (linear: the same time per million characters)")
    for chars in (250_000, 1_000_000, 4_000_000):
        text = "a+" * (chars // 2)
        seconds = best_of(3, lambda text=text: estimate_tokens(text))  # type: ignore[misc]
        print(f"  {chars:>9,} chars: {seconds * 1e3:8.1f} ms, {seconds / (chars / 1e6) * 1e3:6.1f} ms per M chars")


def accuracy() -> None:
    recorded = references()
    print("error against the recorded counts (positive: counts more); per message over o200k_base")
    print(f"{'kind':<14}{'msgs':>5}{'o200k':>8}{'cl100k':>8}{'median':>8}{'p5':>8}{'p95':>8}   len/4 vs o200k")
    for kind in SAMPLE_FILES:
        parts = messages(kind)
        estimated = [estimate_tokens(text) for text in parts]
        o200k, cl100k = recorded[kind]["o200k_base"], recorded[kind]["cl100k_base"]
        relative = sorted(estimate / real - 1 for estimate, real in zip(estimated, o200k, strict=True))
        p5, p95 = relative[int(len(relative) * 0.05)], relative[min(len(relative) - 1, int(len(relative) * 0.95))]
        print(
            f"{kind:<14}{len(parts):>5}{error(sum(estimated), sum(o200k)):>8}{error(sum(estimated), sum(cl100k)):>8}"
            f"{statistics.median(relative):>+8.1%}{p5:>+8.1%}{p95:>+8.1%}   {error(sum(map(naive, parts)), sum(o200k))}"
        )


def slow_tokenizer(text: str) -> int:
    """A stand-in for a slow exact tokenizer: the estimate, 50 times over (about 2 MB/s)."""
    for _ in range(49):
        estimate_tokens(text)
    return estimate_tokens(text)


class StallMonitor:
    """Sleeps 1 ms in a loop; records the longest time between falling asleep and waking past that."""

    def __init__(self) -> None:
        self.longest = 0.0

    def reset(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            await anyio.sleep(0.001)
            self.longest = max(self.longest, time.perf_counter() - started - 0.001)


def tool_output(chars: int) -> str:
    """A long tool output: JSON lines of a search result, ``chars`` characters."""
    line = '{"path": "src/module_%d.py", "line": %d, "match": "def handler(request): return respond(request.body)"}\n'
    lines = []
    size = 0
    index = 0
    while size < chars:
        lines.append(line % (index, index * 7 % 500))
        size += len(lines[-1])
        index += 1
    return "".join(lines)[:chars]


async def stall(chars: int) -> None:
    output = tool_output(chars)
    for name, tokenizer in (("offline estimate", None), ("50x slower tokenizer", slow_tokenizer)):
        count = tokenizer or estimate_tokens
        started = time.perf_counter()
        tokens = count(output)
        counting = time.perf_counter() - started
        config = SessionConfig(max_tokens=200_000, max_chars=10**7, tokenizer=tokenizer)
        monitor = StallMonitor()
        phases: list[tuple[str, float]] = []
        with tempfile.TemporaryDirectory(prefix="memengine-bench-") as directory:
            path = Path(directory) / "memory.db"
            async with anyio.create_task_group() as watching:
                watching.start_soon(monitor.run)
                async with open_engine(path, summarizer=ExtractiveSummarizer(), config=config) as engine:
                    session = engine.session("agent")
                    for turn in range(5):
                        await session.add([Episode("user", f"turn {turn}: search the code for handlers")])
                    monitor.reset()
                    await session.add([Episode("tool", output)])
                    phases.append(("add", monitor.reset()))
                    for _ in range(20):
                        context = await session.context()
                    phases.append(("20 reads", monitor.reset()))
                async with open_engine(path, summarizer=ExtractiveSummarizer(), config=config) as engine:
                    monitor.reset()
                    context = await engine.session("agent").context()
                    phases.append(("load + read", monitor.reset()))
                watching.cancel_scope.cancel()
        print(
            f"{name}: {chars:,}-character output = {tokens:,} tokens, counted in {counting * 1e3:.0f} ms; "
            f"context tokens {context.tokens:,}; longest event-loop stall: "
            + ", ".join(f"{phase} {seconds * 1e3:.1f} ms" for phase, seconds in phases)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accuracy", action="store_true", help="print the error against the recorded counts")
    parser.add_argument("--stall", action="store_true", help="the event loop's longest stall around a huge add")
    parser.add_argument("--chars", type=int, default=400_000, help="characters of the tool output (--stall)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    if args.accuracy:
        accuracy()
    elif args.stall:
        anyio.run(stall, args.chars, backend=args.backend)
    else:
        speed()


if __name__ == "__main__":
    main()
