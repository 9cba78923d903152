"""How large ``context()`` gets while the summarizer lags, against the window's ``max_tokens``.

Episodes that left the window stay shown raw until their summary is stored,
so a summarizer slower than the conversation makes a context grow. This runs
T turns (default 200) of ~70-token messages into one session with
``SessionConfig(max_tokens=600)`` and a summarizer that sleeps L seconds per
call (default 0.05, ``anyio.sleep``), in two ways, side by side in one run:

* **chat**: add a turn, then read ``context()``, as an agent loop does;
* **paced**: a writer adds a turn every P seconds (default 0.01) while a
  reader reads ``context()`` after each add, in its own task.

Printed per way: the largest ``Context.tokens`` returned (the session's
tokenizer: the offline estimate), its ratio to ``max_tokens``, the reads that
left episodes out (``Context.omitted``, when the ceiling kicked in) and the
read latency p50/max (a read may wait up to ``max_context_wait`` for the
summarizer). ``--no-ceiling`` sets ``max_context_tokens`` so high that the
ceiling never binds, which shows what the context would be without it. The
script also runs on a memengine from before the ceiling (it then has no
``omitted`` and no ceiling settings).

Run: ``.venv/bin/python benchmarks/context_ceiling.py [--turns T] [--latency L] [--pace P]
[--backend asyncio|trio] [--no-ceiling]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import attrs

from memengine import Episode, SessionConfig, open_engine

MAX_TOKENS = 600
SENTENCE = "the customer asked about order {n} and the agent checked the warehouse stock for it "


class SlowSummarizer:
    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls += 1
        await anyio.sleep(self.latency)
        return f"The conversation so far covers orders up to {episodes[-1].seq}."


def config_for(args: argparse.Namespace) -> SessionConfig:
    fields = {field.name for field in attrs.fields(SessionConfig)}
    settings: dict[str, object] = {"max_tokens": MAX_TOKENS, "max_episodes": 10_000, "max_chars": 10**8}
    if args.no_ceiling and "max_context_tokens" in fields:
        settings["max_context_tokens"] = 10**9
    return SessionConfig(**settings)  # type: ignore[arg-type]


def turn(n: int) -> Episode:
    return Episode("user" if n % 2 else "assistant", (SENTENCE * 4).format(n=n))


class Reads:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.omitted = 0
        self.latencies: list[float] = []

    async def read(self, session) -> None:
        started = time.perf_counter()
        context = await session.context()
        self.latencies.append(time.perf_counter() - started)
        self.tokens.append(context.tokens)
        if getattr(context, "omitted", None) is not None:
            self.omitted += 1

    def line(self, name: str, calls: int) -> str:
        latencies = sorted(self.latencies)
        return (
            f"{name:6s}  max context {max(self.tokens):6,} tokens ({max(self.tokens) / MAX_TOKENS:4.2f}x max_tokens)"
            f"  reads {len(self.tokens):4}  with omitted {self.omitted:4}"
            f"  read p50 {statistics.median(latencies) * 1e3:7.2f} ms  max {latencies[-1] * 1e3:7.2f} ms"
            f"  summarizer calls {calls}"
        )


async def chat(args: argparse.Namespace, path: Path) -> str:
    summarizer = SlowSummarizer(args.latency)
    reads = Reads()
    async with open_engine(path, summarizer=summarizer, config=config_for(args)) as engine:
        session = engine.session("chat")
        for n in range(1, args.turns + 1):
            await session.add([turn(n)])
            await reads.read(session)
    return reads.line("chat", summarizer.calls)


async def paced(args: argparse.Namespace, path: Path) -> str:
    summarizer = SlowSummarizer(args.latency)
    reads = Reads()
    async with open_engine(path, summarizer=summarizer, config=config_for(args)) as engine:
        session = engine.session("paced")
        added = anyio.Event()
        done = False

        async def reader() -> None:
            nonlocal added
            while not done:
                await added.wait()
                added = anyio.Event()
                await reads.read(session)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            for n in range(1, args.turns + 1):
                await session.add([turn(n)])
                added.set()
                await anyio.sleep(args.pace)
            done = True
            added.set()
    return reads.line("paced", summarizer.calls)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as directory:
        lines = [await chat(args, Path(directory) / "chat.db"), await paced(args, Path(directory) / "paced.db")]
    fields = {field.name for field in attrs.fields(SessionConfig)}
    ceiling = "none (memengine before the ceiling)" if "max_context_tokens" not in fields else None
    if ceiling is None:
        ceiling = "disabled (--no-ceiling)" if args.no_ceiling else f"{config_for(args).context_ceiling:,} tokens"
    print(
        f"{args.turns} turns, max_tokens={MAX_TOKENS}, summarizer {args.latency * 1e3:g} ms/call, "
        f"pace {args.pace * 1e3:g} ms, {args.backend}; ceiling: {ceiling}"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per summarizer call")
    parser.add_argument("--pace", type=float, default=0.01, help="seconds between the paced writer's adds")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--no-ceiling", action="store_true", help="set max_context_tokens too high to bind")
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
