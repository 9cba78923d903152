"""``memengine replay`` as a user runs it: the recorded config, reads compared, nothing half-written left.

Every test records a log in this process, then runs the real command in a
subprocess and checks what the user sees (stdout, stderr, the exit status)
and what the new store holds.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import postgres_schema

FIVE = SessionConfig(max_episodes=5)


def memengine(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memengine", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        timeout=120,
    )


def record(db: Path, log: Path, config: SessionConfig = FIVE) -> None:
    """The issue's session: twelve turns in a window of five (summarized through 8), then two reads."""

    async def session() -> None:
        async with open_engine(db, config=config, record_to=log) as engine:
            chat = engine.session("chat")
            for turn in range(1, 13):
                await chat.add([Episode("user", f"turn {turn} about the trip to Porto")])
            await chat.context(wait_for_summary=True)
            await chat.context()

    anyio.run(session)


def summarized_through(db: Path) -> int:
    with closing(sqlite3.connect(db)) as conn:
        (through,) = conn.execute("SELECT coalesce(max(through_seq), 0) FROM summaries").fetchone()
    return through


def rewrite(log: Path, change) -> None:
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    log.write_text("".join(json.dumps(line) + "\n" for line in change(lines)), encoding="utf-8")


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    log = tmp_path / "messages.jsonl"
    record(tmp_path / "original.db", log)
    assert summarized_through(tmp_path / "original.db") == 8
    return log


def test_a_session_recorded_with_max_episodes_5_replays_with_that_config_and_matches(
    recorded: Path, tmp_path: Path
) -> None:
    result = memengine("replay", str(recorded), "--db", "fresh.db", cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "every outcome matched the log" in result.stdout
    assert summarized_through(tmp_path / "fresh.db") == 8


def test_a_tampered_config_reports_the_reads_that_differ(recorded: Path, tmp_path: Path) -> None:
    def tamper(lines: list[dict]) -> list[dict]:
        lines[0]["config"]["max_episodes"] = 20
        return lines

    rewrite(recorded, tamper)

    result = memengine("replay", str(recorded), "--db", "fresh.db", cwd=tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "every outcome matched" not in result.stdout
    assert "differs: message 13 (read on 'chat'): evicted_through recorded 8, replayed 0" in result.stdout
    assert "differs: message 13 (read on 'chat'): summarized_through recorded 8, replayed 0" in result.stdout


def test_default_config_replays_with_the_defaults_and_says_so(recorded: Path, tmp_path: Path) -> None:
    result = memengine("replay", str(recorded), "--db", "fresh.db", "--default-config", cwd=tmp_path)

    assert result.returncode == 1
    assert "replaying with the default config (--default-config)" in result.stdout
    assert "evicted_through recorded 8, replayed 0" in result.stdout


def test_a_log_without_a_config_is_replayed_with_the_defaults_and_its_reads_compared(
    recorded: Path, tmp_path: Path
) -> None:
    rewrite(recorded, lambda lines: [line for line in lines if line["type"] != "engine"])

    result = memengine("replay", str(recorded), "--db", "fresh.db", cwd=tmp_path)

    assert result.returncode == 1
    assert "the log records no config" in result.stdout
    assert "summarized_through recorded 8, replayed 0" in result.stdout


def test_a_log_that_is_not_json_is_refused_before_a_store_is_made(recorded: Path, tmp_path: Path) -> None:
    recorded.write_text(recorded.read_text(encoding="utf-8") + "not json\n", encoding="utf-8")

    result = memengine("replay", str(recorded), "--db", "fresh.db", cwd=tmp_path)

    assert result.returncode == 2
    assert "messages.jsonl:16: not a JSON line" in result.stderr
    assert not any(path.name.startswith("fresh.db") for path in tmp_path.iterdir())


def test_a_replay_that_fails_halfway_leaves_no_store_behind(recorded: Path, tmp_path: Path) -> None:
    rewrite(recorded, lambda lines: [*lines, {"session": "chat", "type": "add", "payload": {}}])

    result = memengine("replay", str(recorded), "--db", "fresh.db", cwd=tmp_path)

    assert result.returncode == 2
    assert "message 15 (add) lacks 'episodes'" in result.stderr
    assert "nothing was kept of fresh.db" in result.stderr
    assert not any(path.name.startswith("fresh.db") for path in tmp_path.iterdir())


def test_replay_into_postgresql_matches_and_refuses_a_schema_that_holds_a_store(recorded: Path, tmp_path: Path) -> None:
    with postgres_schema() as url:
        result = memengine("replay", str(recorded), "--db", url, cwd=tmp_path)
        again = memengine("replay", str(recorded), "--db", url, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "every outcome matched the log" in result.stdout
    assert again.returncode == 2
    assert "already holds a store; replay needs a fresh store" in again.stderr


def test_a_failed_replay_into_postgresql_drops_the_tables_it_created(recorded: Path, tmp_path: Path) -> None:
    import psycopg

    rewrite(recorded, lambda lines: [*lines, {"session": "chat", "type": "add", "payload": {}}])
    with postgres_schema() as url:
        result = memengine("replay", str(recorded), "--db", url, cwd=tmp_path)
        with psycopg.connect(url) as conn:
            tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()").fetchone()

    assert result.returncode == 2, result.stdout + result.stderr
    assert tables == (0,)
