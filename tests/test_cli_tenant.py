"""``memengine export`` and ``memengine forget``: a tenant's sessions as JSON lines, or erased after a confirmation."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import pytest

from memengine import Episode, open_engine
from memengine.cli import main

from .conftest import StoreRows


async def fill(db: str) -> None:
    async with open_engine(db) as engine:
        for session_id in ("alice/chat-1", "alice/chat-2", "alicex/chat", "bob/chat"):
            await engine.session(session_id).add([Episode("user", f"{session_id} says {n}") for n in range(3)])


@pytest.fixture
def filled(store_url: str) -> str:
    anyio.run(fill, store_url)
    return store_url


def contents(rows: StoreRows) -> list[str]:
    return [content for (content,) in rows.query("SELECT content FROM episodes ORDER BY session_id, seq")]


def test_export_writes_the_tenants_lines_to_a_file(filled: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "alice.jsonl"
    assert main(["export", filled, "--tenant", "alice", "-o", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["type"], r["session_id"], r.get("content")) for r in records] == [
        ("session", "alice/chat-1", None),
        *(("episode", "alice/chat-1", f"alice/chat-1 says {n}") for n in range(3)),
        ("session", "alice/chat-2", None),
        *(("episode", "alice/chat-2", f"alice/chat-2 says {n}") for n in range(3)),
    ]
    assert "exported tenant 'alice'" in (err := capsys.readouterr().err) and "2 sessions, 6 episodes" in err
    assert not (tmp_path / "alice.jsonl.partial").exists()
    assert main(["export", filled, "--tenant", "alice", "-o", str(out)]) == 2  # never overwrites
    assert "already exists" in capsys.readouterr().err


def test_export_to_stdout_and_its_usage_errors(filled: str, capsys) -> None:
    assert main(["export", filled, "--session", "bob/chat"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["type"] for line in captured.out.splitlines()] == [
        "session",
        "episode",
        "episode",
        "episode",
    ]
    assert "1 session, 3 episodes" in captured.err
    assert main(["export", filled, "--tenant", "a/b"]) == 2
    assert "must not contain '/'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["export", filled])  # a scope is required
    assert exited.value.code == 2


def test_export_of_a_tenant_in_a_store_whose_ids_have_no_slash_says_the_convention_is_not_followed(
    store_url: str, tmp_path: Path, capsys
) -> None:
    async def fill_without_tenants() -> None:
        async with open_engine(store_url) as engine:
            for session_id in ("demo", "demo-2", "user-42"):
                await engine.session(session_id).add([Episode("user", "hello")])

    anyio.run(fill_without_tenants)
    out = tmp_path / "demo.jsonl"
    assert main(["export", store_url, "--tenant", "demo", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no session id follows the 'tenant/...' convention" in err
    assert "'demo', 'demo-2', 'user-42'" in err and "--prefix" in err and "--session" in err
    assert not out.exists() and not (tmp_path / "demo.jsonl.partial").exists()
    assert main(["export", store_url, "--tenant", "demo"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "convention" in captured.err
    assert main(["export", store_url, "--session", "demo"]) == 0  # what does match still exports


def test_export_of_a_scope_that_matches_no_session_says_so(filled: str, capsys) -> None:
    assert main(["export", filled, "--tenant", "carol"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no session of tenant 'carol' (no session id starts with 'carol/')" in captured.err
    assert main(["export", filled, "--prefix", "zz"]) == 1
    assert "no session id starts with 'zz'" in capsys.readouterr().err
    assert main(["export", filled, "--session", "alice"]) == 1
    assert "no session 'alice'" in capsys.readouterr().err


def test_export_of_a_missing_store_creates_nothing(tmp_path: Path, capsys) -> None:
    assert main(["export", str(tmp_path / "none.db"), "--tenant", "a"]) == 3
    assert not (tmp_path / "none.db").exists()


def test_forget_dry_run_shows_the_counts_and_erases_nothing(filled: str, capsys) -> None:
    rows = StoreRows(filled)
    before = contents(rows)
    assert main(["forget", filled, "--tenant", "alice", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "tenant 'alice'" in out and "2 sessions, 6 episodes, 0 summaries, 0 undelivered retain batches" in out
    assert "dry run: nothing erased" in out
    assert contents(rows) == before


def test_forget_asks_first_and_erases_only_after_yes(filled: str, capsys, monkeypatch) -> None:
    rows = StoreRows(filled)
    before = contents(rows)
    monkeypatch.setattr("sys.stdin", io.StringIO("no\n"))
    assert main(["forget", filled, "--tenant", "alice"]) == 1
    assert "nothing erased" in capsys.readouterr().out
    assert contents(rows) == before
    monkeypatch.setattr("sys.stdin", io.StringIO("yes\n"))
    assert main(["forget", filled, "--tenant", "alice"]) == 0
    assert "erased 2 sessions, 6 episodes" in capsys.readouterr().out
    assert contents(rows) == [c for c in before if not c.startswith("alice/")]
    assert rows.query("SELECT count(*) FROM session_leases WHERE substr(session_id, 1, 6) = 'alice/'") == [(0,)]


def test_forget_with_yes_does_not_ask(filled: str, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["forget", filled, "--prefix", "alice", "--yes"]) == 0
    assert "erased 3 sessions, 9 episodes" in capsys.readouterr().out
    assert contents(StoreRows(filled)) == ["bob/chat says 0", "bob/chat says 1", "bob/chat says 2"]
    assert main(["forget", filled, "--prefix", "alice", "--yes"]) == 0
    assert "nothing to erase" in capsys.readouterr().out
