"""What one Agents SDK item with a tool's output of megabytes costs the rest of the event loop: its longest stall.

A monitor task sleeps 1 ms in a loop and records how late it wakes, while a
``MemEngineSession`` is given one ``function_call_output`` item of
``--chars`` characters (code, JSON, base64 and non-Latin text, cycled) after
its call. Printed per size: the add's duration, and the monitor's longest
and 99th-percentile lateness during it (medians over the rounds).

Side by side in one process, alternating: the item's JSON made a slice at a
time (memengine/json_slices.py, as shipped) and in one go (``LONG_STRING``
set past the item's size: how every item was converted before). The window
is large enough that nothing is evicted, so no summarizer works meanwhile:
what is measured is the add's own path.

Run: ``.venv/bin/python benchmarks/large_item_stall.py [--chars 1000000 3500000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from memengine import SessionConfig, json_slices, open_engine
from memengine.integrations.openai_agents import MemEngineSession

CONFIG = SessionConfig(max_episodes=10_000, max_chars=100_000_000)
SLICED = json_slices.LONG_STRING


def tool_output(chars: int) -> str:
    rng = random.Random(chars)
    pieces = [
        'def total(rows):\n    return sum(row["amount"] for row in rows)\n',
        json.dumps({"order": 55433, "status": "in_transit", "note": 'said "soon"'}) + "\n",
        base64.b64encode(rng.randbytes(300)).decode() + "\n",
        "Посылка покинула склад во вторник. 包裹已于周二离开仓库。\n",
    ]
    parts: list[str] = []
    size = 0
    while size < chars:
        parts.append(rng.choice(pieces))
        size += len(parts[-1])
    return "".join(parts)[:chars]


async def one_add(output: str, sliced: bool) -> tuple[float, float, float]:
    """(the add's ms, the monitor's longest and p99 lateness in ms) for one item."""
    json_slices.LONG_STRING = SLICED if sliced else len(output) + 1
    lateness: list[float] = []
    with tempfile.TemporaryDirectory() as directory:
        async with open_engine(Path(directory) / "m.db", config=CONFIG) as engine:
            session = MemEngineSession(engine, "s")
            call = {"type": "function_call", "call_id": "c1", "name": "export", "arguments": "{}"}
            await session.add_items([call])
            done = False

            async def monitor() -> None:
                while not done:
                    start = time.perf_counter()
                    await anyio.sleep(0.001)
                    lateness.append((time.perf_counter() - start - 0.001) * 1e3)

            item: dict[str, Any] = {"type": "function_call_output", "call_id": "c1", "output": output}
            async with anyio.create_task_group() as group:
                group.start_soon(monitor)
                await anyio.sleep(0.01)
                start = time.perf_counter()
                await session.add_items([item])
                took = (time.perf_counter() - start) * 1e3
                done = True
    json_slices.LONG_STRING = SLICED
    lateness.sort()
    return took, lateness[-1], lateness[int(len(lateness) * 0.99) - 1] if len(lateness) > 1 else lateness[-1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, nargs="+", default=[1_000_000, 3_500_000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"one function_call_output item per add, {args.rounds} rounds each way, alternating; ms, medians")
    for chars in args.chars:
        output = tool_output(chars)
        results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.rounds):
            for sliced in (False, True):
                results[sliced].append(await one_add(output, sliced))
        rows = {}
        for sliced, label in ((False, "in one go"), (True, "in slices")):
            took, longest, p99 = (statistics.median(column) for column in zip(*results[sliced], strict=True))
            rows[sliced] = (took, longest)
            print(
                f"  {chars:>9,} chars  {label:<10} add {took:7.1f}   "
                f"loop's longest stall {longest:6.1f}   p99 {p99:5.1f}"
            )
        print(
            f"  {chars:>9,} chars  in slices / in one go: add {rows[True][0] / rows[False][0]:.2f}, "
            f"longest stall {rows[True][1] / rows[False][1]:.2f}"
        )


if __name__ == "__main__":
    anyio.run(main)
