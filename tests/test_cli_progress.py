"""Long command-line work shows progress on stderr (a terminal, or asked with ``--progress``), never on stdout."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from memengine import Episode, open_engine
from memengine.cli import progress
from memengine.cli.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_at_most_every_second_with_count_share_and_rate_then_a_closing_line() -> None:
    stream, clock = io.StringIO(), Clock()
    counter = Progress("memengine replay", "messages", stream, total=350, clock=clock)
    for done in range(1, 351):
        clock.now = 100.0 + done / 100  # 100 messages a second, for 3.5 s
        counter.advance(done)
    counter.finish()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "memengine replay: 100/350 messages (28%), 100/s, 1 s",
        "memengine replay: 200/350 messages (57%), 100/s, 2 s",
        "memengine replay: 300/350 messages (85%), 100/s, 3 s",
        "memengine replay: 350/350 messages (100%) in 3.5 s (100/s)",
    ]


def test_work_without_a_count_says_that_it_still_runs() -> None:
    stream, clock = io.StringIO(), Clock()
    counter = Progress("memengine reindex", "episodes indexed", stream, clock=clock)
    clock.now += 1.5
    counter.tick()
    clock.now += 0.5
    counter.finish(300)
    assert stream.getvalue().splitlines() == [
        "memengine reindex: 2 s so far",
        "memengine reindex: 300 episodes indexed in 2.0 s (150/s)",
    ]


def test_nowhere_to_say_it_says_nothing() -> None:
    counter = Progress("memengine replay", "messages", None, total=3)
    counter.advance(3)
    counter.finish()  # no stream: no error, no output


def test_progress_goes_to_stderr_when_it_is_a_terminal_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    monkeypatch.setattr(terminal, "isatty", lambda: True, raising=False)
    monkeypatch.setattr(sys, "stderr", terminal)
    assert progress.stream_for(None) is terminal
    assert progress.stream_for(False) is None
    monkeypatch.setattr(terminal, "isatty", lambda: False, raising=False)
    assert progress.stream_for(None) is None
    assert progress.stream_for(True) is terminal


# -- the commands, as a user runs them ---------------------------------------------


def memengine(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memengine", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    log = tmp_path / "messages.jsonl"

    async def session() -> None:
        async with open_engine(tmp_path / "original.db", record_to=log) as engine:
            for turn in range(30):
                await engine.session(f"s{turn % 3}").add([Episode("user", f"turn {turn} about Porto")])
            await engine.session("s0").context()

    anyio.run(session)
    return log


def test_replay_with_progress_reports_on_stderr_and_leaves_stdout_as_it_was(recorded: Path, tmp_path: Path) -> None:
    quiet = memengine("replay", str(recorded), "--db", str(tmp_path / "quiet.db"), cwd=tmp_path)
    shown = memengine("replay", str(recorded), "--db", str(tmp_path / "shown.db"), "--progress", cwd=tmp_path)

    assert (quiet.returncode, shown.returncode) == (0, 0), shown.stderr
    assert quiet.stderr == ""  # stderr is no terminal here: no progress unless asked for
    assert shown.stdout == quiet.stdout.replace("quiet.db", "shown.db")
    lines = shown.stderr.splitlines()
    assert lines[0].startswith("memengine replay: 31/31 messages (100%) in "), lines
    assert lines[-1].startswith("memengine replay: waiting for summaries: 3/3 sessions (100%) in "), lines


def test_reindex_with_progress_reports_on_stderr_and_leaves_stdout_as_it_was(recorded: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "original.db")
    quiet = memengine("reindex", db, cwd=tmp_path)
    shown = memengine("reindex", db, "--progress", cwd=tmp_path)

    assert (quiet.returncode, shown.returncode) == (0, 0), shown.stderr
    assert quiet.stderr == ""
    assert shown.stdout == quiet.stdout
    assert shown.stderr.splitlines()[-1].startswith("memengine reindex: 30 episodes indexed in "), shown.stderr
