"""An item with a tool's output of megabytes: converted a slice at a time, stored and read back exactly.

The adapter's JSON of such an item is made a slice at a time with the event
loop's other tasks running in between (memengine/json_slices.py), not in one
call that holds every session for tens of milliseconds; what is stored, read
back and refused is what the one-go conversion gives (tests/test_json_slices.py
holds the encoding to it on random values).
"""

from __future__ import annotations

import base64
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import SessionConfig, open_engine
from memengine.episode import encode_json
from memengine.integrations.openai_agents import ITEM_IN_CONTENT_KEY, ITEM_KEY, MemEngineSession
from memengine.json_slices import LONG_STRING
from memengine.tool_calls import RESULT_OF_KEY

pytestmark = pytest.mark.anyio

BIG = SessionConfig(max_episodes=10_000, max_chars=10_000_000)


def tool_output(chars: int) -> str:
    """Code, JSON, base64 and non-Latin text with quotes, backslashes and control characters, ``chars`` long."""
    rng = random.Random(chars)
    pieces = [
        'def total(rows):\n\treturn sum(row["amount"] for row in rows)  # a \\ b\n',
        json.dumps({"order": 55433, "note": 'said "soon"', "path": "C:\\tmp"}) + "\n",
        base64.b64encode(rng.randbytes(300)).decode() + "\n",
        "Посылка покинула склад во вторник. 包裹已于周二离开仓库。 😀\x01\x1f\n",
    ]
    text = ""
    while len(text) < chars:
        text += rng.choice(pieces)
    return text[:chars]


def call_output(chars: int, call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": tool_output(chars)}


CALL = {"type": "function_call", "call_id": "call_1", "name": "export", "arguments": "{}", "id": "fc_1"}


def stored_rows(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT content, metadata FROM episodes ORDER BY seq").fetchall()


async def test_a_long_item_is_stored_and_read_back_exactly(tmp_path: Path) -> None:
    item = call_output(5 * LONG_STRING + 123)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([CALL, item])
        assert await session.get_items() == [CALL, item]
    (_, (content, metadata)) = stored_rows(tmp_path / "m.db")
    assert content == encode_json(item)  # too large for metadata: the item's JSON is the content
    assert json.loads(metadata) == {RESULT_OF_KEY: ["call_1"], ITEM_IN_CONTENT_KEY: True}


async def test_a_long_item_kept_in_metadata_is_stored_exactly(tmp_path: Path) -> None:
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": tool_output(300_000)}]}
    config = SessionConfig(max_episodes=10_000, max_chars=10_000_000, max_metadata_bytes=2_000_000)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([item])
        assert await session.get_items() == [item]
    ((content, metadata),) = stored_rows(tmp_path / "m.db")
    assert content == item["content"][0]["text"]
    assert metadata == encode_json({ITEM_KEY: item})


async def test_the_event_loop_runs_other_tasks_while_a_long_item_is_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the add reaches the session, other tasks have had a turn between the output's slices."""
    slices = 6
    item = call_output(slices * LONG_STRING)
    turns = 0
    turns_when_sent: list[int] = []
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        add_private = type(session._session)._add_private

        async def sent(*args: Any) -> Any:
            turns_when_sent.append(turns)
            return await add_private(*args)

        monkeypatch.setattr(type(session._session), "_add_private", sent)
        done = anyio.Event()

        async def add() -> None:
            await session.add_items([CALL, item])
            done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(add)
            while not done.is_set():
                turns += 1
                await anyio.lowlevel.checkpoint()
        assert await session.get_items() == [CALL, item]
    (when,) = turns_when_sent
    assert when >= slices - 1, turns_when_sent  # one turn between two slices at least (0 when made in one go)


@pytest.mark.parametrize(
    ("spoil", "error", "words"),
    [
        (
            lambda item: item.update(output=item["output"][:400_000] + "\ud83d" + item["output"][400_000:]),
            ValueError,
            "surrogate",
        ),
        (lambda item: item.update(score=float("nan")), ValueError, "must be JSON"),
        (lambda item: item.update(when=object()), TypeError, "must be JSON"),
    ],
    ids=["a lone surrogate deep in the output", "NaN beside it", "a value JSON has no type for"],
)
async def test_a_long_item_is_refused_as_a_short_one_and_nothing_is_stored(
    tmp_path: Path, spoil: Any, error: type, words: str
) -> None:
    item = call_output(4 * LONG_STRING)
    spoil(item)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        with pytest.raises(error, match=words) as refused:
            await session.add_items([{"role": "user", "content": "before it"}, item])
        assert type(refused.value) is error
        assert len(str(refused.value)) < 400  # the message does not quote the item
        assert await session.get_items() == []
    assert stored_rows(tmp_path / "m.db") == []


async def test_an_add_cancelled_while_its_long_item_is_converted_stores_nothing(tmp_path: Path) -> None:
    item = call_output(6 * LONG_STRING)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(session.add_items, [CALL, item])
                for _ in range(2):  # the conversion has its next slices to go: nothing is sent yet
                    await anyio.lowlevel.checkpoint()
                scope.cancel()
        assert scope.cancelled_caught
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "the session works on"}])
        assert await session.get_items() == [{"role": "user", "content": "the session works on"}]
    assert [content for content, _ in stored_rows(tmp_path / "m.db")] == ["the session works on"]
