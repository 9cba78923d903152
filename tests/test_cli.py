"""The ``memengine`` command line: ``demo`` replays a sample conversation, ``inspect`` reads a store."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from importlib.resources import files
from pathlib import Path

import anyio
import pytest

from memengine import Episode, open_engine
from memengine.cli import main


def query(db: Path, sql: str, *params: object) -> list[tuple]:
    """What is really in the file, read behind the CLI's back."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql, params).fetchall()


def stored_episodes(db: Path) -> list[tuple[str, str]]:
    return query(db, "SELECT role, content FROM episodes WHERE session_id = 'demo' ORDER BY seq")


def latest_summary(db: Path) -> tuple[int, str]:
    """The newest summary, with the number of episodes it covers (seqs continue across runs)."""
    ((through, summary, first_seq),) = query(
        db,
        "SELECT through_seq, summary, (SELECT min(seq) FROM episodes WHERE session_id = 'demo') "
        "FROM summaries WHERE session_id = 'demo' ORDER BY through_seq DESC LIMIT 1",
    )
    return through - first_seq + 1, summary


def run_demo(db: Path, *args: str) -> int:
    return main(["demo", "--db", str(db), *args])


@pytest.fixture
def demo_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A store holding one demo run of 60 turns (window: 20 episodes)."""
    db = tmp_path / "demo.db"
    assert run_demo(db, "--turns", "60") == 0
    capsys.readouterr()
    return db


# -- the bundled conversation ---------------------------------------------------


def test_the_sample_conversation_is_a_few_hundred_alternating_turns() -> None:
    resource = files("memengine.cli").joinpath("sample_conversation.jsonl")
    raw = resource.read_bytes()
    turns = [json.loads(line) for line in raw.decode("utf-8").splitlines()]
    assert len(raw) < 120_000
    assert 250 <= len(turns) <= 350
    assert [turn["role"] for turn in turns] == ["user", "assistant"] * (len(turns) // 2)
    assert all(turn["content"].strip() for turn in turns)
    assert any("not Bola" in turn["content"] for turn in turns)  # a correction the memory must keep straight


# -- demo -----------------------------------------------------------------------


def test_demo_stores_the_turns_and_prints_checkpoints_summary_and_final_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "demo.db"

    assert run_demo(db, "--turns", "80", "--every", "40") == 0

    out = capsys.readouterr().out
    assert len(stored_episodes(db)) == 80
    covered, summary = latest_summary(db)
    # The final read waited until everything evicted from the 20-episode window was summarized: it evicts
    # down to half the window each time it overflows (at turns 21, 32, ..., 76), so through seq 66.
    assert covered == 66
    assert "turn 40 (seq 40)" in out
    assert "turn 80 (seq 80)" in out
    assert "summarized_through:" in out and "evicted_through:" in out
    assert "Final context after 80 turns (read with wait_for_summary=True):" in out
    assert "summary (covers seqs up to 66):" in out
    assert summary.splitlines()[0][:60] in out  # the stored summary is what was shown
    assert "raw episodes after the summary (14, of which 0 wait for a summary):" in out
    assert f"memengine inspect {db} demo" in out


def test_demo_writes_memengine_demo_db_in_the_current_directory_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)

    assert main(["demo", "--turns", "30"]) == 0

    assert len(stored_episodes(tmp_path / "memengine-demo.db")) == 30
    assert "memengine inspect memengine-demo.db demo" in capsys.readouterr().out


def test_running_the_demo_again_replaces_the_earlier_run(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first_episodes = stored_episodes(demo_db)
    first_coverage, _ = latest_summary(demo_db)

    assert run_demo(demo_db, "--turns", "60") == 0

    assert "Cleared session 'demo' from an earlier run" in capsys.readouterr().out
    assert stored_episodes(demo_db) == first_episodes  # the same 60 turns, not 120
    assert latest_summary(demo_db)[0] == first_coverage == 44
    assert query(demo_db, "SELECT count(*) FROM summaries WHERE through_seq <= 60") == [(0,)]


def test_demo_window_options_shape_the_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(tmp_path / "demo.db", "--turns", "30", "--max-episodes", "5", "--every", "10") == 0

    out = capsys.readouterr().out
    assert "Window: at most 5 raw episodes and 8000 characters" in out
    # Evicted down to max(1, 5 // 2) = 2 episodes at each overflow (turns 6, 10, ..., 30).
    assert "raw episodes after the summary (2, of which 0 wait for a summary):" in out
    assert "summary (covers seqs up to 28):" in out


def test_demo_leaves_the_other_sessions_of_a_store_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "shared.db"

    async def remember_alice() -> None:
        async with open_engine(db) as engine:
            await engine.session("alice").add([Episode("user", "I live in Porto.")])

    anyio.run(remember_alice)

    assert run_demo(db, "--turns", "30") == 0

    assert "Cleared" not in capsys.readouterr().out
    assert query(db, "SELECT content FROM episodes WHERE session_id = 'alice'") == [("I live in Porto.",)]
    assert len(stored_episodes(db)) == 30


def test_demo_runs_on_trio(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(tmp_path / "demo.db", "--turns", "30", "--backend", "trio") == 0

    assert "Final context after 30 turns" in capsys.readouterr().out
    assert len(stored_episodes(tmp_path / "demo.db")) == 30


def test_demo_asking_for_more_turns_than_the_sample_has_replays_them_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_demo(tmp_path / "demo.db", "--turns", "100000", "--every", "1000") == 0

    out = capsys.readouterr().out
    available = len(stored_episodes(tmp_path / "demo.db"))
    assert f"replaying {available} turns (the sample has only {available})" in out


@pytest.mark.parametrize(
    "option",
    [["--turns", "0"], ["--turns", "-5"], ["--every", "0"], ["--max-episodes", "-1"], ["--max-chars", "0"]],
)
def test_demo_rejects_numbers_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_demo(tmp_path / "demo.db", *option)

    assert exit_info.value.code == 2
    assert f"argument {option[0]}: must be at least 1, got {int(option[1])}" in capsys.readouterr().err
    assert not (tmp_path / "demo.db").exists()


def test_demo_rejects_a_number_that_is_not_a_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_demo(tmp_path / "demo.db", "--turns", "many")

    assert exit_info.value.code == 2
    assert "argument --turns: expected a whole number, got 'many'" in capsys.readouterr().err


def test_demo_refuses_to_write_into_a_file_that_is_not_a_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")

    assert run_demo(notes, "--turns", "10") == 3  # the store cannot be used

    assert "not a readable SQLite database" in capsys.readouterr().err
    assert notes.read_text() == "my notes\n"


def test_demo_refuses_a_db_in_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(tmp_path / "missing" / "demo.db", "--turns", "10") == 3

    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


# -- inspect --------------------------------------------------------------------


def test_inspect_lists_every_session(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(demo_db)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{demo_db}: 1 session"
    assert lines[1].split() == ["SESSION", "GENERATION", "EPISODES", "SUMMARIZED_THROUGH", "LAST_SEQ"]
    assert lines[2].split() == ["demo", "0", "60", "44", "60"]


def test_inspect_shows_a_sessions_summary_and_raw_episodes(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(demo_db), "demo"]) == 0

    out = capsys.readouterr().out
    _, summary = latest_summary(demo_db)
    assert f"session 'demo' in {demo_db}" in out
    assert "generation 0, 60 stored episodes, last seq 60" in out
    assert "summary (covers seqs up to 44):" in out
    assert summary.splitlines()[-1][:60] in out
    assert "raw episodes after the summary (16):" in out
    episode_lines = [line.strip() for line in out.splitlines() if line.strip().startswith("#")]
    assert [line.split()[0] for line in episode_lines] == [f"#{seq}" for seq in range(45, 61)]
    last_role, last_content = stored_episodes(demo_db)[-1]
    assert episode_lines[-1].split(maxsplit=2)[1] == last_role
    assert episode_lines[-1].split(maxsplit=2)[2].startswith(last_content[:60])


def test_inspect_limit_shows_the_latest_episodes(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(demo_db), "demo", "--limit", "3"]) == 0

    out = capsys.readouterr().out
    assert "raw episodes after the summary (16, showing the latest 3):" in out
    assert [line.split()[0] for line in out.splitlines() if line.strip().startswith("#")] == ["#58", "#59", "#60"]


def test_inspect_does_not_change_the_store(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = query(demo_db, "SELECT * FROM summaries"), stored_episodes(demo_db)

    assert main(["inspect", str(demo_db), "demo"]) == 0

    assert (query(demo_db, "SELECT * FROM summaries"), stored_episodes(demo_db)) == before


def test_inspect_unknown_session_exits_1(demo_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(demo_db), "nobody"]) == 1

    captured = capsys.readouterr()
    assert "session 'nobody' has no stored episodes" in captured.err
    assert captured.out == ""


def test_inspect_missing_file_exits_3_without_creating_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.db"

    assert main(["inspect", str(missing)]) == 3

    assert f"{missing} has no memengine tables (no such file)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_inspect_leaves_other_sqlite_databases_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE things (name TEXT)")

    assert main(["inspect", str(other)]) == 3

    assert "has no memengine tables (another SQLite database)" in capsys.readouterr().err
    assert query(other, "SELECT name FROM sqlite_master") == [("things",)]


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])

    assert exit_info.value.code == 2
    assert "required: COMMAND" in capsys.readouterr().err


# -- the installed entry point --------------------------------------------------


def test_python_dash_m_runs_the_demo(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"

    result = subprocess.run(
        [sys.executable, "-m", "memengine.cli", "demo", "--db", str(db), "--turns", "60"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=tmp_path,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "Final context after 60 turns" in result.stdout
    assert len(stored_episodes(db)) == 60
