"""Leaving ``open_engine`` is bounded whatever happens around it, and the caller gets its own error.

Each scenario runs in a child process (tests/exit_worker.py) with a timeout, so
an exit that hangs fails the test instead of hanging the suite: a sibling task
that fails, a cancelled scope, ``move_on_after``/``fail_after`` around the
engine, the body raising, another client holding the store's lock while the
engine exits. Every run adds episodes first; some also meet a retain sink that
never returns.

Then, on the store the child left behind: every acknowledged add is stored,
leases are released (or, when the store was locked, taken over at the next
start), and a restart with a working sink hands every episode on exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from memengine import open_engine

from .conftest import StoreRows
from .exit_worker import CONFIG, GRACE, SESSIONS
from .fakes import RecordingSink

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
#: What leaving may take: the store's own work, plus the sink's grace when one is configured.
EXIT_BOUND = 2.0
#: Room for a slow, shared machine (process start, imports, a busy core).
SLACK = 2.5
#: A child that takes this long is hung.
HANG = 60

#: scenario -> (retain sink configured, what must reach the caller: error type and leaf types)
SCENARIOS = {
    "sibling": (True, ("ExceptionGroup", ["ValueError"])),
    "cancel": (True, (None, [])),
    "move_on_after": (False, (None, [])),
    "fail_after": (True, ("TimeoutError", ["TimeoutError"])),
    "raises": (False, ("ValueError", ["ValueError"])),
    "normal": (True, (None, [])),
    "locked": (True, (None, [])),
}


def run_child(scenario: str, backend: str, store: str, with_sink: bool) -> dict:
    command = [sys.executable, "-m", "tests.exit_worker", scenario, backend, store]
    if with_sink:
        command.append("--sink")
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"leaving the engine hung ({scenario}, {backend}); stderr:\n{expired.stderr}")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_leaving_is_bounded_and_loses_nothing_acknowledged(
    scenario: str, anyio_backend: str, store_url: str, rows: StoreRows
) -> None:
    with_sink, (error, error_leaves) = SCENARIOS[scenario]
    outcome = run_child(scenario, anyio_backend, store_url, with_sink)  # the child runs on the same library

    assert (outcome["error"], outcome["leaves"]) == (error, error_leaves), outcome
    assert outcome["elapsed"] <= EXIT_BOUND + (GRACE if with_sink else 0) + SLACK, outcome
    acknowledged = outcome["acknowledged"]
    assert all(len(seqs) == 3 for seqs in acknowledged.values()), outcome
    for session_id in SESSIONS:
        stored = [
            seq for (seq,) in rows.query("SELECT seq FROM episodes WHERE session_id = ? ORDER BY seq", session_id)
        ]
        assert stored == acknowledged[session_id]
    if scenario != "locked":
        assert rows.query("SELECT session_id FROM session_leases WHERE owner IS NOT NULL") == []

    # The next start picks up what the exit could not finish. When the store was locked, leases and
    # a delivery claim are still held: a restart under the same name takes them back at once.
    sink = RecordingSink()
    owner = "exiting" if scenario == "locked" else "restarted"
    async with open_engine(store_url, retain_sink=sink, config=CONFIG, owner=owner) as engine:
        with anyio.fail_after(20):
            if with_sink:
                while len(sink.delivered_contents()) < 3 * len(SESSIONS):
                    await sink.wait_for(len(sink.batches) + 1)
            for session_id in SESSIONS:
                context = await engine.session(session_id).context()
                assert [e.seq for e in context.episodes][-1] == acknowledged[session_id][-1]
    if with_sink:
        for session_id in SESSIONS:
            seqs = [e.seq for b in sink.batches if b.session_id == session_id for e in b.episodes]
            assert seqs == acknowledged[session_id]
