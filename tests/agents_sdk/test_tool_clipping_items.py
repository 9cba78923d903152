"""MemEngineSession with old tool outputs clipped: get_items() shows them clipped, stored whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memengine import SessionConfig, ToolClipping, open_engine
from memengine.integrations.openai_agents import MemEngineSession

pytestmark = pytest.mark.anyio

OUTPUT = "".join(f"{n:04d}: log line of the build\n" for n in range(200))  # 6,000 characters


async def test_get_items_shows_old_outputs_clipped_after_their_calls(tmp_path: Path) -> None:
    clipping = ToolClipping(keep_turns=2, over_chars=1000, head_chars=100, tail_chars=100)
    config = SessionConfig(max_episodes=100, max_chars=10**6, tool_clipping=clipping)
    items = []
    for n in range(2):
        items += [
            {"type": "function_call", "call_id": f"call_{n}", "name": "build_log", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"call_{n}", "output": OUTPUT},
        ]
    async with open_engine(tmp_path / "memory.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(items)
        shown = await session.get_items()
        records = [r async for r in engine.export(session_id="s") if r["type"] == "episode"]
    head = "".join(f"{n:04d}: log line of the build\n" for n in range(3))[:-1]  # 3 lines: up to 100 characters
    tail = "".join(f"{n:04d}: log line of the build\n" for n in range(197, 200))
    clipped = f"{head}\n[… 5,433 characters clipped; full output: seq 2 …]\n{tail}"
    assert shown == [items[0], {**items[1], "output": clipped}, items[2], items[3]]
    assert records[1]["seq"] == 2 and json.dumps(OUTPUT) in json.dumps(records[1])  # stored whole
