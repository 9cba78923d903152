"""The ``memengine`` command as a user runs it: one line and a documented exit status when something is wrong.

Every test runs the real command in a subprocess (``python -m memengine``, the
same ``main`` as the console script) and checks what the user sees: stdout,
stderr and the exit status. Read-only commands are checked against the
store itself: nothing created, no table added.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import memengine

from .conftest import POSTGRES_SERVER, postgres_schema

REPO = Path(memengine.__file__).resolve().parent.parent
STORE_UNUSABLE = 3
DOWN = "postgresql://app:s3cret@127.0.0.1:1/memory?connect_timeout=3"


def cli(*args: str, cwd: Path | None = None, command: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``memengine ARGS`` (this checkout's code) and capture what it printed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [*(command or [sys.executable, "-m", "memengine"]), *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=cwd,
        env=env,
        timeout=120,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert result.returncode == status, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def postgres_table_count(url: str) -> int:
    import psycopg

    schema = url.rsplit("%3D", 1)[1]
    with psycopg.connect(POSTGRES_SERVER) as conn:
        (count,) = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)).fetchone()
    return int(count)


def stored(db: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute(sql).fetchall()


# -- the command itself -----------------------------------------------------------


def test_version_is_printed_by_python_dash_m_memengine() -> None:
    result = cli("--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"memengine {memengine.__version__}"


def test_the_console_script_runs_this_code() -> None:
    script = Path(sys.executable).with_name("memengine")
    if not script.exists():
        pytest.skip("the memengine console script is not installed next to this Python")

    result = cli("--version", command=[str(script)])

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"memengine {memengine.__version__}"


def test_help_lists_the_exit_statuses() -> None:
    result = cli("--help")

    assert result.returncode == 0
    assert "exit status:" in result.stdout
    for status in ("0 ", "1 ", "2 ", "3 ", "130 "):
        assert f"\n  {status}" in result.stdout


# -- a store that cannot be opened ----------------------------------------------


@pytest.mark.parametrize("command", ["inspect", "reindex", "migrate"])
def test_a_postgres_server_that_is_down_is_one_line_without_the_password(command: str) -> None:
    pytest.importorskip("psycopg")

    err = assert_one_line_error(cli(command, DOWN), STORE_UNUSABLE)

    assert "postgresql://app:***@127.0.0.1:1/memory?connect_timeout=3:" in err  # the URL as given
    assert "s3cret" not in err
    assert "check that the server is running" in err


@pytest.mark.parametrize("command", [["inspect"], ["reindex"], ["migrate"], ["demo", "--db"]])
def test_a_url_of_another_database_is_refused(tmp_path: Path, command: list[str]) -> None:
    err = assert_one_line_error(cli(*command, "mysql://app:s3cret@db/memory", cwd=tmp_path), STORE_UNUSABLE)

    assert "mysql://app:***@db/memory" in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "random.bin"
    junk.write_bytes(os.urandom(4096))

    err = assert_one_line_error(cli("demo", "--db", str(junk)), STORE_UNUSABLE)

    assert str(junk) in err


def test_a_directory_given_as_the_store_is_named(tmp_path: Path) -> None:
    err = assert_one_line_error(cli("inspect", str(tmp_path)), STORE_UNUSABLE)

    assert str(tmp_path) in err


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    db = tmp_path / "nowhere" / "memory.db"

    err = assert_one_line_error(cli("demo", "--db", str(db)), STORE_UNUSABLE)

    assert f"directory {db.parent} does not exist" in err


def test_replay_into_a_missing_directory_is_named(tmp_path: Path) -> None:
    log = tmp_path / "messages.jsonl"
    log.write_text("")
    db = tmp_path / "nowhere" / "replayed.db"

    err = assert_one_line_error(cli("replay", str(log), "--db", str(db)), STORE_UNUSABLE)

    assert f"directory {db.parent} does not exist" in err


# -- inspect only reads -----------------------------------------------------------


def test_inspect_on_an_empty_postgres_schema_creates_no_table() -> None:
    with postgres_schema() as url:
        assert postgres_table_count(url) == 0

        err = assert_one_line_error(cli("inspect", url), STORE_UNUSABLE)

        assert "has no memengine tables" in err
        assert postgres_table_count(url) == 0


def test_reindex_on_an_empty_postgres_schema_creates_no_table() -> None:
    with postgres_schema() as url:
        err = assert_one_line_error(cli("reindex", url), STORE_UNUSABLE)

        assert "has no memengine tables" in err
        assert postgres_table_count(url) == 0


def test_inspect_on_a_missing_sqlite_path_creates_no_file(tmp_path: Path) -> None:
    db = tmp_path / "missing.db"

    err = assert_one_line_error(cli("inspect", str(db)), STORE_UNUSABLE)

    assert "has no memengine tables" in err
    assert not db.exists()
    assert list(tmp_path.iterdir()) == []


def test_inspect_on_an_empty_sqlite_file_adds_no_table(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.touch()

    err = assert_one_line_error(cli("inspect", str(db)), STORE_UNUSABLE)

    assert "has no memengine tables" in err
    assert db.stat().st_size == 0


def test_inspect_reads_a_postgres_store_and_shows_its_url_without_the_password() -> None:
    import anyio

    with postgres_schema() as url:
        secret_url = url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")

        async def write() -> None:
            async with memengine.open_engine(url) as engine:
                await engine.session("s").add([memengine.Episode("user", "hello")])

        anyio.run(write)
        listing = cli("inspect", secret_url)
        session = cli("inspect", secret_url, "s", "--json")

    assert listing.returncode == session.returncode == 0, listing.stderr + session.stderr
    assert listing.stdout.startswith("postgresql://postgres:***@")
    assert "s3cret" not in listing.stdout
    assert [episode["content"] for episode in json.loads(session.stdout)["episodes"]] == ["hello"]


# -- inspect shows everything when asked ----------------------------------------

LONG = "The tenant in flat 4B reported a leak under the kitchen sink. " * 5


@pytest.fixture
def long_store(tmp_path: Path) -> Path:
    db = tmp_path / "long.db"

    async def write() -> None:
        async with memengine.open_engine(db) as engine:
            await engine.session("s").add([memengine.Episode("user", LONG.strip(), id="long")])

    import anyio

    anyio.run(write)
    return db


def test_inspect_cuts_lines_by_default_and_full_shows_all_of_them(long_store: Path) -> None:
    short = cli("inspect", str(long_store), "s")
    full = cli("inspect", str(long_store), "s", "--full")

    assert short.returncode == full.returncode == 0
    assert LONG.strip() not in short.stdout
    assert LONG.strip() in full.stdout


def test_inspect_json_prints_a_session_in_full(long_store: Path) -> None:
    result = cli("inspect", str(long_store), "s", "--json")

    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["session_id"] == "s"
    assert shown["summary"] is None
    assert shown["episode_count"] == 1 and "stored_episodes" not in shown  # the count, named as in the listing
    ((episode),) = shown["episodes"]  # "episodes" is always a list of episodes
    assert (episode["seq"], episode["id"], episode["role"], episode["content"]) == (1, "long", "user", LONG.strip())


def test_inspect_json_lists_the_sessions(long_store: Path) -> None:
    result = cli("inspect", str(long_store), "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "sessions": [{"session_id": "s", "generation": 0, "episode_count": 1, "summarized_through": 0, "last_seq": 1}],
        "set_aside": [],
    }


# -- demo on PostgreSQL ----------------------------------------------------------


def test_demo_runs_on_postgresql_and_shows_the_url_without_the_password() -> None:
    import psycopg

    with postgres_schema() as url:
        secret_url = url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
        for _ in range(2):  # the second run clears the first
            result = cli("demo", "--db", secret_url, "--turns", "30")

            assert result.returncode == 0, result.stderr
            assert "Final context after 30 turns" in result.stdout
            assert "postgresql://postgres:***@" in result.stdout and "s3cret" not in result.stdout
        with psycopg.connect(url) as conn:
            (count,) = conn.execute("SELECT count(*) FROM episodes WHERE session_id = 'demo'").fetchone()
    assert count == 30


# -- demo into a pipe that closes early ------------------------------------------


def covered_by_summary(db: Path) -> tuple[int, str]:
    """How many of the demo's episodes its latest summary covers, and that summary."""
    ((through, summary, first_seq),) = stored(
        db,
        "SELECT through_seq, summary, (SELECT min(seq) FROM episodes WHERE session_id = 'demo') "
        "FROM summaries WHERE session_id = 'demo' ORDER BY through_seq DESC LIMIT 1",
    )
    return through - first_seq + 1, summary


def test_demo_piped_into_head_finishes_its_work_and_exits_0(tmp_path: Path) -> None:
    reference, piped = tmp_path / "reference.db", tmp_path / "piped.db"
    assert cli("demo", "--db", str(reference), "--turns", "120").returncode == 0
    command = f"set -o pipefail; {sys.executable} -m memengine demo --db {piped} --turns 120 --every 1 | head -3"

    for _ in range(2):  # the second run clears the first, then is cut off too
        result = cli(command=["bash", "-c", command])

        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        assert len(result.stdout.splitlines()) == 3
        assert stored(piped, "SELECT count(*) FROM episodes WHERE session_id = 'demo'") == [(120,)]
        # Everything evicted is summarized, as at the end of a run nobody cut off: the demo ran to its end.
        # (How far, not the text: how evictions coalesce into summarizer calls, and so the text, depends on
        # the pace of the run; under load the two texts differed.)
        assert covered_by_summary(piped)[0] == covered_by_summary(reference)[0]
