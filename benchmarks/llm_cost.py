"""Summarizer cost of a paced conversation: memengine vs a per-turn summary buffer.

A chat UI adds one episode per turn and then reads the context it will send to
its model, waiting for the summary (``context(wait_for_summary=True)``). Over
T turns (default 1,000, the bundled sample conversation cycled), this counts
the summarizer calls and their input tokens (previous summary + the episodes
handed over, counted with :func:`memengine.tokens.estimate_tokens`) for:

* memengine with ``SessionConfig()`` (``evict_to=0.5``: an overflow evicts down
  to half the window, so one call covers about half a window);
* memengine with ``SessionConfig(evict_to=1.0)`` (only what overflows is
  evicted: about one call per turn);
* a baseline written below, in the style of LangChain's
  ``ConversationSummaryBufferMemory``: the last N=20 messages stay raw, and
  every turn that pushes messages out of them calls the LLM with the previous
  summary and the message(s) pushed out.

Every side uses the same counting fake summarizer (async; returns the previous
summary cut to a fixed length plus a few words), so the counts compare the
eviction policies, not the summaries. memengine runs on a SQLite file in a
temporary directory. Everything runs in one process, one run; only the counts
and their ratios matter (no timing is compared).

Run: ``PYTHONPATH=$PWD python benchmarks/llm_cost.py [--turns T] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import attrs

from memengine import Episode, SessionConfig, open_engine
from memengine.tokens import estimate_tokens

SAMPLE = Path(__file__).resolve().parent.parent / "memengine" / "cli" / "sample_conversation.jsonl"
SUMMARY_CHARS = 600  # the fake summary keeps at most this much of the previous one
BASELINE_KEEP = 20  # messages the baseline keeps raw (SessionConfig().max_episodes is 20 too)


class CountingSummarizer:
    """A stand-in for an LLM: counts calls, episodes and input tokens; answers at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.episodes = 0
        self.input_tokens = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls += 1
        self.episodes += len(episodes)
        self.input_tokens += estimate_tokens(previous or "") + sum(estimate_tokens(e.content) for e in episodes)
        await anyio.lowlevel.checkpoint()
        words = " ".join(episodes[-1].content.split()[:6]) if episodes else ""
        return f"{(previous or 'Summary:')[:SUMMARY_CHARS]} {words}".strip()


@attrs.frozen
class SideResult:
    name: str
    calls: int
    episodes: int  # episodes handed to the summarizer, over all calls
    input_tokens: int
    context_tokens: int  # sum over turns of the tokens of the context read after the turn
    seconds: float


def conversation(turns: int) -> list[tuple[str, str]]:
    lines = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(lines[i % len(lines)]["role"], lines[i % len(lines)]["content"]) for i in range(turns)]


async def run_memengine(name: str, config: SessionConfig, turns: list[tuple[str, str]], directory: Path) -> SideResult:
    summarizer = CountingSummarizer()
    context_tokens = 0
    started = time.perf_counter()
    async with open_engine(directory / f"{name}.db", summarizer=summarizer, config=config) as engine:
        session = engine.session("chat")
        for role, content in turns:
            await session.add([Episode(role, content)])
            context = await session.context(wait_for_summary=True)
            context_tokens += context.tokens
    return SideResult(
        name,
        summarizer.calls,
        summarizer.episodes,
        summarizer.input_tokens,
        context_tokens,
        time.perf_counter() - started,
    )


async def run_baseline(turns: list[tuple[str, str]]) -> SideResult:
    """ConversationSummaryBufferMemory-style: keep the last N raw, summarize whatever is pushed out, every turn."""
    summarizer = CountingSummarizer()
    buffer: list[Episode] = []
    summary: str | None = None
    context_tokens = 0
    started = time.perf_counter()
    for role, content in turns:
        buffer.append(Episode(role, content))
        if len(buffer) > BASELINE_KEEP:
            pushed_out, buffer = buffer[:-BASELINE_KEEP], buffer[-BASELINE_KEEP:]
            summary = await summarizer.summarize(summary, pushed_out)
        context_tokens += estimate_tokens(summary or "") + sum(estimate_tokens(e.content) for e in buffer)
    return SideResult(
        f"per-turn baseline (N={BASELINE_KEEP})",
        summarizer.calls,
        summarizer.episodes,
        summarizer.input_tokens,
        context_tokens,
        time.perf_counter() - started,
    )


async def main(args: argparse.Namespace) -> None:
    turns = conversation(args.turns)
    with tempfile.TemporaryDirectory(prefix="memengine-bench-") as name:
        directory = Path(name)
        baseline = await run_baseline(turns)
        default = await run_memengine("memengine evict_to=0.5", SessionConfig(), turns, directory)
        full = await run_memengine("memengine evict_to=1.0", SessionConfig(evict_to=1.0), turns, directory)
    config = SessionConfig()
    print(
        f"summarizer cost of a paced conversation: {args.turns} turns (add one episode, then "
        f"context(wait_for_summary=True)), sample conversation of {SAMPLE.name} cycled, "
        f"memengine window max_episodes={config.max_episodes} max_chars={config.max_chars}, "
        f"baseline keeps the last {BASELINE_KEEP} messages, backend={args.backend}"
    )
    print(
        f"{'':<32} {'calls':>7} {'x base':>7} {'input tok':>10} {'x base':>7} "
        f"{'ep/call':>8} {'tok/call':>9} {'ctx tok/turn':>13}"
    )
    for side in (baseline, default, full):
        print(
            f"{side.name:<32} {side.calls:>7} {side.calls / max(1, baseline.calls):>7.3f} "
            f"{side.input_tokens:>10} {side.input_tokens / max(1, baseline.input_tokens):>7.3f} "
            f"{side.episodes / max(1, side.calls):>8.1f} {side.input_tokens / max(1, side.calls):>9.0f} "
            f"{side.context_tokens / len(turns):>13.0f}"
        )
    ratio = default.calls / max(1, baseline.calls)
    print(
        f"memengine (default, evict_to=0.5) makes {ratio:.3f}x the baseline's summarizer calls "
        f"(issue's goal: at most 0.25x)"
    )
    print(
        "(input tok: estimate_tokens of the previous summary + the episodes of every call; "
        "ctx tok/turn: mean tokens of the context read after each turn, summary + raw episodes)"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--turns", type=int, default=1000, help="conversation turns (T)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
