"""PostgreSQL goes silent under a running engine: calls fail in bounded time, exit is bounded, nothing is lost.

The engine reaches the server through a proxy that stops passing bytes
without closing anything (tests/stalling_proxy.py): a partition that drops
nothing, a frozen server. The server-side timeouts cannot help (the server
never sees the statement), nor can keepalives (the proxy's end answers them);
only the client's own bound, ``reply_timeout``, does. Each scenario runs in a
child process (tests/stall_worker.py) with a timeout, so a hang fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from memengine import open_engine
from memengine.engine import EXIT_STORE_SECONDS
from memengine.store.committer import INTERRUPT_SECONDS

from .conftest import StoreRows, postgres_schema
from .stall_worker import CONFIG, CONNECT_TIMEOUT, REPLY_TIMEOUT, SESSIONS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
#: Room for a slow, shared machine (process start, imports, a busy core).
SLACK = 3.0
#: A child that takes this long is hung.
HANG = 150


def run_child(scenario: str, backend: str, url: str) -> dict:
    """The child's report, with ``process_seconds``: how long the child process ran, start to end."""
    command = [sys.executable, "-m", "tests.stall_worker", scenario, backend, url]
    started = time.monotonic()
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the engine hung on a silent server ({scenario}, {backend}); stderr:\n{expired.stderr}")
    assert result.returncode == 0, result.stderr
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "process_seconds": time.monotonic() - started}


@pytest.mark.parametrize("scenario", ["in_flight", "exit"])
async def test_a_silent_server_fails_calls_in_bounded_time_and_loses_nothing_acknowledged(
    scenario: str, anyio_backend: str
) -> None:
    with postgres_schema() as url:
        outcome = run_child(scenario, anyio_backend, url)

        if scenario == "in_flight":
            # Silence past reply_timeout gives the connection up; the reconnect meets connect_timeout.
            assert outcome["add_error"] in ("StoreError", "UncertainCommitError"), outcome
            assert outcome["add_seconds"] <= REPLY_TIMEOUT[scenario] + CONNECT_TIMEOUT + SLACK, outcome
            # Reads too: the read connection is given up the same way, and its reconnect fails in time.
            # Reads take the read connection one at a time, and the engine's own (looking for sessions
            # other processes want) may be ahead: each of those pays the same bound first.
            assert outcome["recall_error"] == "StoreError", outcome
            reads_ahead = 3
            bound = (1 + reads_ahead) * (REPLY_TIMEOUT[scenario] + CONNECT_TIMEOUT) + SLACK
            assert outcome["recall_seconds"] <= bound, outcome
        # Leaving does not wait for the silent server (nor for reply_timeout, which is long in "exit").
        assert outcome["exit_seconds"] <= EXIT_STORE_SECONDS + INTERRUPT_SECONDS + SLACK, outcome
        if scenario == "exit":
            # The threads left waiting on the silent server were given up: they do not keep the
            # process alive until reply_timeout (an asyncio program waits for its threads at exit).
            assert outcome["process_seconds"] < REPLY_TIMEOUT[scenario], outcome

        rows = StoreRows(url)
        for session_id in SESSIONS:
            stored = rows.query("SELECT seq FROM episodes WHERE session_id = ? ORDER BY seq", session_id)
            assert [seq for (seq,) in stored][:3] == outcome["acknowledged"][session_id]
        # The add that met the silence is stored at most once (it may have reached the server before it).
        assert len(rows.query("SELECT seq FROM episodes WHERE content = 'into the silence'")) <= 1

        # The next start, under the same name, takes its sessions back and finds every acknowledged add.
        async with open_engine(url, config=CONFIG, owner="stalled") as engine:
            with anyio.fail_after(20):
                for session_id in SESSIONS:
                    context = await engine.session(session_id).context()
                    assert [e.seq for e in context.episodes][:3] == outcome["acknowledged"][session_id]
