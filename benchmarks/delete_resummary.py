"""What deleting one old episode costs: summarizer calls until the summary is whole again, raw episodes meanwhile.

A session of ``--episodes`` (default 20,000) episodes, 1-10 KB each (prose,
Python code, JSON, base64 and Russian/Chinese text in turn), is kept with a
window of 50 episodes (``SessionConfig(max_episodes=50, max_chars=10**9)``:
the episode count is the bound) and summarized to the end by a counting fake
summarizer (answers at once, a summary of at most 2,000 characters). The
store is then copied once per delete position, and on each copy one episode
is deleted: the one at 1%, 50% and 99% of the session. Printed per position:

* ``raw meanwhile``: the episodes ``context()`` returns raw right after the
  delete, while the summarizer is held (a re-summary takes seconds of LLM
  time per call; this is what the model is sent meanwhile), with the
  session's summary then covering ``summary through``;
* ``calls``: summarizer calls until every evicted episode is covered by a
  summary again (``context(wait_for_summary=True)``), and their input in
  characters;
* ``raw after``: the raw episodes once it is.

Both ways of keeping the summarized past are measured in one run: one
rolling summary (the default) and segment summaries
(``SessionConfig(segment_summaries=True)``, store/segments.py: a summary per
batch, merged pairwise by ``fold`` calls; a delete re-makes the batch that
held the episode and the merges above it). For segments, ``calls`` counts
until every merge above the repaired batch is made again too, and ``hole
shown`` / ``hole said`` how many of the re-summarized batch's live episodes
the summary shows in its place meanwhile, and how many it says it leaves
out (past 16,000 characters). Building the session prints what each way
costs without deletes: calls and input.

The issue this measures (#28) asks for at most about log2(n) calls (14 at
20,000) and at most 2,000 raw episodes meanwhile. Everything runs in one
process; only counts are compared.

Run: ``PYTHONPATH=$PWD python benchmarks/delete_resummary.py [--episodes N] [--backend asyncio|trio]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import sqlite3
import tempfile
import time
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs

from memengine import Episode, SessionConfig, open_engine
from memengine.store.base import Composed

WINDOW = 50
SUMMARY_CHARS = 2_000
CONFIG = SessionConfig(max_episodes=WINDOW, max_chars=10**9)
MODES = {"rolling": CONFIG, "segments": attrs.evolve(CONFIG, segment_summaries=True)}
POSITIONS = (0.01, 0.50, 0.99)
ADD_CHUNK = 500  # episodes per add while building the session

PROSE = (
    "The deployment failed again on the staging cluster after the migration step; the logs show the schema "
    "lock was held by a long report query, so the rollout waited and then timed out. We agreed to move the "
    "report to the replica and to retry the migration tonight with a lock timeout of five seconds. "
)
CODE = (
    "def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:\n"
    "    merged: list[tuple[int, int]] = []\n"
    "    for start, end in sorted(intervals):\n"
    "        if merged and start <= merged[-1][1]:\n"
    "            merged[-1] = (merged[-1][0], max(merged[-1][1], end))\n"
    "        else:\n"
    "            merged.append((start, end))\n"
    "    return merged\n\n"
)
NON_LATIN = (  # Russian and Chinese on purpose
    "Отчёт о сбое: после обновления конфигурации балансировщика часть запросов уходила на старые узлы. "  # noqa: RUF001
    "部署之后，缓存命中率明显下降，我们需要检查新的过期策略是否正确。 "  # noqa: RUF001
)


def content(rng: random.Random, n: int) -> str:
    """An episode's text: 1-10 KB of one of five kinds, in turn."""
    size = rng.randint(1_000, 10_000)
    kind = n % 5
    if kind == 0:
        unit = PROSE
    elif kind == 1:
        unit = CODE
    elif kind == 2:
        hits = [{"id": n * 10 + i, "title": f"match {i}", "score": rng.random()} for i in range(8)]
        unit = json.dumps({"results": hits})
    elif kind == 3:
        unit = base64.b64encode(rng.randbytes(768)).decode()
    else:
        unit = NON_LATIN
    return (f"[{n}] " + unit * (size // len(unit) + 1))[:size]


class HeldSummarizer:
    """A stand-in for an LLM that answers at once, unless held; counts calls (merges apart) and their input."""

    def __init__(self) -> None:
        self.calls = 0
        self.folds = 0
        self.input_chars = 0
        self.released = anyio.Event()

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        await self.released.wait()
        self.calls += 1
        self.input_chars += len(previous or "") + sum(len(e.content) for e in episodes)
        await anyio.lowlevel.checkpoint()
        first, last = episodes[0].seq, episodes[-1].seq
        text = f"{previous or 'Summary:'} [{first}..{last}: {episodes[-1].content[:40]!r}]"
        return text[-SUMMARY_CHARS:]

    async def fold(self, summaries: Sequence[str]) -> str:
        await self.released.wait()
        self.calls += 1
        self.folds += 1
        self.input_chars += sum(len(summary) for summary in summaries)
        await anyio.lowlevel.checkpoint()
        return " ".join(summaries)[-SUMMARY_CHARS:]


async def whole(engine, session) -> Any:
    """The context once every evicted episode is summarized and, for segments, every merge due is made."""
    await session.context(wait_for_summary=True)
    while True:
        state = await engine.store.segment_repair("chat")
        if state is None or (isinstance(state, Composed) and not state.state.folds_due and not state.state.holes):
            return await session.context()
        await anyio.sleep(0.005)


async def build(path: Path, episodes: int, config: SessionConfig) -> tuple[float, HeldSummarizer]:
    rng = random.Random(28)
    summarizer = HeldSummarizer()
    summarizer.released.set()
    started = time.perf_counter()
    async with open_engine(path, summarizer=summarizer, config=config) as engine:
        session = engine.session("chat")
        for start in range(0, episodes, ADD_CHUNK):
            chunk = range(start, min(start + ADD_CHUNK, episodes))
            await session.add([Episode("user" if n % 2 == 0 else "assistant", content(rng, n)) for n in chunk])
        context = await whole(engine, session)
        assert len(context.episodes) <= WINDOW, len(context.episodes)
    return time.perf_counter() - started, summarizer


async def delete_at(path: Path, episodes: int, position: float, config: SessionConfig) -> dict[str, Any]:
    seq = max(1, round(episodes * position))
    summarizer = HeldSummarizer()
    async with open_engine(path, summarizer=summarizer, config=config) as engine:
        session = engine.session("chat")
        assert await session.delete_episodes([seq]) == 1
        meanwhile = await session.context()
        summarizer.released.set()
        started = time.perf_counter()
        after = await whole(engine, session)
        elapsed = time.perf_counter() - started
    deleted = f"[{seq - 1}] "  # how the deleted episode's text begins (content n is seq n + 1)
    assert all(deleted not in (text or "") for text in (meanwhile.summary, after.summary))
    return {
        "seq": seq,
        "raw_meanwhile": len(meanwhile.episodes),
        "through_meanwhile": meanwhile.summarized_through,
        # A segmented summary shows the hole's live episodes in its place, up to a bound, and says how many
        # it leaves out past it.
        "hole": sum(last - first + 1 for first, last in meanwhile.resummarizing)
        - (1 if meanwhile.resummarizing else 0),
        "hole_said": sum(
            int(count)
            for count in re.findall(r"\.\.\d+ \((\d+), \d+ characters\) are left out here", meanwhile.summary or "")
        ),
        "calls": summarizer.calls,
        "input_chars": summarizer.input_chars,
        "raw_after": len(after.episodes),
        "seconds": elapsed,
    }


def copy_store(source: Path, target: Path) -> None:
    """A copy of the SQLite store, its WAL included (the backup API reads it as a reader would)."""
    with closing(sqlite3.connect(source)) as read, closing(sqlite3.connect(target)) as write:
        read.backup(write)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as directory:
        built: dict[str, Path] = {}
        print(f"{args.episodes:,} episodes of 1-10 KB, window {WINDOW}, summarized to the end ({args.backend}):")
        for mode, config in MODES.items():
            built[mode] = Path(directory) / f"built-{mode}.db"
            seconds, summarizer = await build(built[mode], args.episodes, config)
            print(
                f"  {mode:>9}: {summarizer.calls} calls ({summarizer.folds} of them merges), "
                f"input {summarizer.input_chars / 1e6:.1f} MB, {seconds:.1f} s"
            )
        print("one delete per copy of the store:")
        print(
            f"{'summaries':>9} {'deleted':>8} {'seq':>7} {'raw meanwhile':>14} {'summary through':>16} "
            f"{'hole shown':>11} {'hole said':>10} {'calls':>6} {'input MB':>9} {'raw after':>10} {'s (fake LLM)':>13}"
        )
        for position in POSITIONS:
            for mode, config in MODES.items():
                copy = Path(directory) / f"at-{position}-{mode}.db"
                copy_store(built[mode], copy)
                result = await delete_at(copy, args.episodes, position, config)
                print(
                    f"{mode:>9} {position:>8.0%} {result['seq']:>7} {result['raw_meanwhile']:>14,} "
                    f"{result['through_meanwhile']:>16,} {result['hole'] - result['hole_said']:>11} "
                    f"{result['hole_said']:>10} {result['calls']:>6} "
                    f"{result['input_chars'] / 1e6:>9.1f} {result['raw_after']:>10} {result['seconds']:>13.1f}"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=20_000)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    arguments = parser.parse_args()
    anyio.run(main, arguments, backend=arguments.backend)
