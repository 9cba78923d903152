"""Message replay: a recorded log, played into a fresh store, reproduces the same state."""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.cli import main
from memengine.replay import read_log, replay

from .fakes import RecordingSummarizer, add_each, turns

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(evict_to=1.0, max_episodes=3)


def final_state(path: Path) -> dict[str, object]:
    conn = sqlite3.connect(path)
    try:
        episodes = conn.execute(
            "SELECT session_id, seq, id, role, content, created_at, metadata FROM episodes ORDER BY 1, 2"
        )
        latest = conn.execute(
            "SELECT session_id, max(through_seq), summary FROM summaries GROUP BY session_id ORDER BY session_id"
        )
        return {"episodes": episodes.fetchall(), "latest summaries": latest.fetchall()}
    finally:
        conn.close()


async def record_workload(db: Path, log: Path) -> None:
    async with open_engine(db, summarizer=RecordingSummarizer(), config=CONFIG, record_to=log) as engine:
        alice, bob = engine.session("alice"), engine.session("bob")
        again = Episode("user", "said twice", metadata={"n": 1})
        await add_each(alice, turns(6, prefix="alice"))
        await alice.add([again, Episode("assistant", "reply")])
        await alice.add([again])  # idempotent: stores nothing new
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(add_each, bob, turns(5, prefix="bob"))
            tasks.start_soon(functools.partial(alice.context, wait_for_summary=True))
        await alice.delete_episodes([2, 8])
        await bob.clear()
        await add_each(bob, turns(4, prefix="bob again"))
        with pytest.raises(TypeError):
            await alice.delete_episodes(["x"])  # refused before sending: not recorded
        await alice.context(wait_for_summary=True)
        await bob.close()


async def test_replay_reproduces_episodes_seqs_and_summaries(tmp_path) -> None:
    original, log, fresh = tmp_path / "original.db", tmp_path / "messages.jsonl", tmp_path / "fresh.db"
    await record_workload(original, log)
    kinds = [record["type"] for record in read_log(log) if record["type"] != "engine"]
    assert {"add", "read", "delete", "clear", "close"} <= set(kinds)

    async with open_engine(fresh, summarizer=RecordingSummarizer(), config=CONFIG) as engine:
        report = await replay(log, engine)
        for session_id in report.sessions:
            await engine.session(session_id).context(wait_for_summary=True)
    assert report.mismatches == ()
    assert report.messages == len(kinds)
    assert final_state(fresh) == final_state(original)


async def test_cli_replay(tmp_path, capsys) -> None:
    original, log, fresh = tmp_path / "original.db", tmp_path / "messages.jsonl", tmp_path / "fresh.db"
    await record_workload(original, log)
    status = await anyio.to_thread.run_sync(main, ["replay", str(log), "--db", str(fresh)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every outcome matched" in out
    assert final_state(fresh)["episodes"] == final_state(original)["episodes"]
    # A replay needs a fresh store, and a readable log.
    assert await anyio.to_thread.run_sync(main, ["replay", str(log), "--db", str(fresh)]) == 2
    assert (
        await anyio.to_thread.run_sync(
            main, ["replay", str(tmp_path / "missing.jsonl"), "--db", str(tmp_path / "x.db")]
        )
        == 2
    )


async def test_a_test_written_as_a_log(tmp_path) -> None:
    """Scenario: three turns, the middle one deleted, the session cleared, one more turn."""
    lines = [
        {
            "session": "s",
            "type": "add",
            "payload": {
                "episodes": [
                    {"id": f"e{i}", "role": "user", "content": f"turn {i}", "created_at": "2026-11-29T10:00:00+00:00"}
                    for i in (1, 2, 3)
                ]
            },
            "outcome": {"seqs": [1, 2, 3]},
        },
        {"session": "s", "type": "delete", "payload": {"seqs": [2]}, "outcome": {"deleted": 1}},
        {"session": "s", "type": "read", "payload": {"wait_for_summary": True}},
        {"session": "s", "type": "clear", "payload": {}},
        {
            "session": "s",
            "type": "add",
            "payload": {
                "episodes": [
                    {"id": "e4", "role": "user", "content": "after clear", "created_at": "2026-11-29T10:01:00+00:00"}
                ]
            },
            "outcome": {"seqs": [4]},
        },
    ]
    log = tmp_path / "scenario.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with open_engine(tmp_path / "s.db") as engine:
        report = await replay(log, engine)
        context = await engine.session("s").context()
    assert report.mismatches == ()
    assert [(e.seq, e.id, e.content) for e in context.episodes] == [(4, "e4", "after clear")]


async def test_a_log_that_no_longer_matches_is_reported(tmp_path) -> None:
    log = tmp_path / "wrong.jsonl"
    record = {
        "session": "s",
        "type": "add",
        "payload": {
            "episodes": [{"id": "e1", "role": "user", "content": "hi", "created_at": "2026-11-29T10:00:00+00:00"}]
        },
        "outcome": {"seqs": [7]},
    }
    log.write_text(json.dumps(record) + "\n" + "not json\n")
    async with open_engine(tmp_path / "s.db") as engine:
        with pytest.raises(ValueError, match=r"wrong\.jsonl:2"):
            await replay(log, engine)
    log.write_text(json.dumps(record) + "\n")
    async with open_engine(tmp_path / "t.db") as engine:
        report = await replay(log, engine)
    assert report.mismatches == ("message 1 (add on 's'): recorded {'seqs': [7]}, replayed {'seqs': [1]}",)


async def test_a_recorder_that_cannot_write_never_breaks_the_session(tmp_path, caplog) -> None:
    log_path = tmp_path / "messages.jsonl"
    async with open_engine(tmp_path / "memory.db", record_to=log_path) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "recorded")])
        recorder = engine._services.recorder

        class FullDisk:
            def write(self, text: str) -> int:
                raise OSError(28, "No space left on device")

            def flush(self) -> None:
                pass

            def close(self) -> None:
                pass

        recorder._file.close()
        recorder._file = FullDisk()
        (second,) = await session.add([Episode("user", "not recorded")])
        (third,) = await session.add([Episode("user", "nor this")])
        assert (second.seq, third.seq) == (2, 3)
        assert [e.seq for e in (await session.context()).episodes] == [1, 2, 3]
    assert any("No space left on device" in record.getMessage() for record in caplog.records)
