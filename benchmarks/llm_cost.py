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

Then a tool-heavy workload (an agent reading files: every other turn is a
4 KB tool output, rotating Python code, JSON search results and server logs;
the turns between are the assistant's tool calls) runs memengine with a window
sized for an agent (``max_episodes=100, max_chars=64,000``) twice, clipping
old tool outputs off and on (``tool_clipping=ToolClipping()``, see
:mod:`memengine.clipping`), and prints summarizer calls, their input tokens,
the turn of the first call, and the context's tokens per turn.

Every side uses the same counting fake summarizer (async; returns the previous
summary cut to a fixed length plus a few words), so the counts compare the
eviction policies, not the summaries. memengine runs on a SQLite file in a
temporary directory. Everything runs in one process, one run; only the counts
and their ratios matter (no timing is compared).

Run: ``PYTHONPATH=$PWD python benchmarks/llm_cost.py [--turns T] [--tool-turns T] [--backend asyncio|trio]``.
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

from memengine import Episode, SessionConfig, ToolClipping, open_engine
from memengine.tokens import estimate_tokens

SAMPLE = Path(__file__).resolve().parent.parent / "memengine" / "cli" / "sample_conversation.jsonl"
SUMMARY_CHARS = 600  # the fake summary keeps at most this much of the previous one
BASELINE_KEEP = 20  # messages the baseline keeps raw (SessionConfig().max_episodes is 20 too)
TOOL_OUTPUT_CHARS = 4096  # one tool output of the tool-heavy workload
AGENT_WINDOW = {"max_episodes": 100, "max_chars": 64_000}  # a window sized for an agent's context


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
    first_call_turn: int | None = None  # the turn after which the summarizer was first called
    raw_episodes: int = 0  # sum over turns of the raw episodes of the context read after the turn


def conversation(turns: int) -> list[tuple[str, str]]:
    lines = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [(lines[i % len(lines)]["role"], lines[i % len(lines)]["content"]) for i in range(turns)]


def code_output(n: int) -> str:
    lines = [f'"""Module {n}: request handlers."""', "", "from __future__ import annotations", "", "import json", ""]
    k = 0
    while sum(len(line) + 1 for line in lines) < TOOL_OUTPUT_CHARS:
        lines += [
            f"def handle_{n}_{k}(request: dict[str, object]) -> dict[str, object]:",
            f'    """Answer request kind {k} of module {n}."""',
            "    payload = json.loads(str(request.get('body', '{}')))",
            f"    return {{'status': 200, 'kind': {k}, 'items': len(payload)}}",
            "",
        ]
        k += 1
    return "\n".join(lines)[:TOOL_OUTPUT_CHARS]


def json_output(n: int) -> str:
    hits, k = [], 0
    while len(json.dumps(hits)) < TOOL_OUTPUT_CHARS:
        hits.append({"path": f"src/pkg_{n % 7}/module_{k}.py", "line": 10 * k + n % 10, "score": round(1 / (k + 1), 3)})
        k += 1
    return json.dumps({"query": f"handle_{n}", "hits": hits})[:TOOL_OUTPUT_CHARS]


def log_output(n: int) -> str:
    lines, k = [], 0
    while sum(len(line) + 1 for line in lines) < TOOL_OUTPUT_CHARS:
        level = "ERROR" if k % 17 == 16 else "INFO"
        lines.append(
            f"2026-12-04T10:{k // 60 % 60:02d}:{k % 60:02d}Z {level} worker-{n % 4} request {n}-{k} done in {k % 90} ms"
        )
        k += 1
    return "\n".join(lines)[:TOOL_OUTPUT_CHARS]


TOOLS = (("read_file", code_output), ("search", json_output), ("read_logs", log_output))


def tool_turns(turns: int) -> list[Episode]:
    """An agent reading files: a tool call, then its 4 KB output, again and again (half the turns are outputs)."""
    episodes = []
    for n in range(turns):
        name, output = TOOLS[n // 2 % len(TOOLS)]
        call_id = f"call_{n // 2}"
        if n % 2 == 0:
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps({"n": n})}}
            episodes.append(
                Episode(
                    "assistant",
                    f"Let me {name} for step {n // 2}.",
                    metadata={"role": "assistant", "tool_calls": [call]},
                )
            )
        else:
            episodes.append(Episode("tool", output(n // 2), metadata={"role": "tool", "tool_call_id": call_id}))
    return episodes


async def run_memengine(
    name: str, config: SessionConfig, turns: list[tuple[str, str]] | list[Episode], directory: Path
) -> SideResult:
    summarizer = CountingSummarizer()
    context_tokens = 0
    first_call_turn = None
    raw_episodes = 0
    started = time.perf_counter()
    async with open_engine(directory / f"{name}.db", summarizer=summarizer, config=config) as engine:
        session = engine.session("chat")
        for turn, episode in enumerate(turns, 1):
            await session.add([episode if isinstance(episode, Episode) else Episode(*episode)])
            context = await session.context(wait_for_summary=True)
            context_tokens += context.tokens
            raw_episodes += len(context.episodes)
            if first_call_turn is None and summarizer.calls:
                first_call_turn = turn
    return SideResult(
        name,
        summarizer.calls,
        summarizer.episodes,
        summarizer.input_tokens,
        context_tokens,
        time.perf_counter() - started,
        first_call_turn,
        raw_episodes,
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
        agent = tool_turns(args.tool_turns)
        unclipped = await run_memengine("clipping off", SessionConfig(**AGENT_WINDOW), agent, directory)
        clipping = ToolClipping()
        clipped = await run_memengine(
            "clipping on", SessionConfig(**AGENT_WINDOW, tool_clipping=clipping), agent, directory
        )
        half = {**AGENT_WINDOW, "max_chars": AGENT_WINDOW["max_chars"] // 2}
        clipped_half = await run_memengine(
            "on, half chars", SessionConfig(**half, tool_clipping=clipping), agent, directory
        )
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
    print()
    print(
        f"tool-heavy agent: {args.tool_turns} turns, a tool call then its {TOOL_OUTPUT_CHARS:,}-character output "
        f"(code, JSON, logs in turn), window max_episodes={AGENT_WINDOW['max_episodes']} "
        f"max_chars={AGENT_WINDOW['max_chars']:,}; clipping on: {clipping}"
    )
    print(
        f"{'':<15} {'calls':>7} {'x off':>7} {'input tok':>10} {'first call':>11} "
        f"{'ep/call':>8} {'ctx tok/turn':>13} {'x off':>7} {'raw ep/turn':>12}"
    )
    for side in (unclipped, clipped, clipped_half):
        print(
            f"{side.name:<15} {side.calls:>7} {side.calls / max(1, unclipped.calls):>7.3f} "
            f"{side.input_tokens:>10} {side.first_call_turn or '-':>11} "
            f"{side.episodes / max(1, side.calls):>8.1f} {side.context_tokens / len(agent):>13.0f} "
            f"{side.context_tokens / max(1, unclipped.context_tokens):>7.3f} {side.raw_episodes / len(agent):>12.1f}"
        )
    print(
        f"(on, half chars: clipping on, max_chars={half['max_chars']:,}; first call: the turn after which the "
        "summarizer was first called; it reads full outputs either way, so input tok counts what it was given; "
        "raw ep/turn: mean episodes the context shows raw)"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--turns", type=int, default=1000, help="conversation turns (T)")
    parser.add_argument("--tool-turns", type=int, default=1000, help="turns of the tool-heavy workload")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    if args.turns < 1 or args.tool_turns < 1:
        parser.error("--turns and --tool-turns must be at least 1")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
