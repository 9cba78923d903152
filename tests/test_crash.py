"""A process killed with SIGKILL loses nothing it acknowledged; its pending summary is made after restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memengine import SessionConfig, open_engine

from .crash_worker import RESTARTED_OWNER
from .fakes import RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


def run_until_killed(db_path: Path, session_id: str, count: int, *extra: str) -> list[int]:
    """Start the worker, kill -9 it once every add is acknowledged and the summarizer is stuck."""
    acknowledged: list[int] = []
    blocked = False
    with subprocess.Popen(
        [sys.executable, "-m", "tests.crash_worker", str(db_path), session_id, str(count), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        try:
            assert worker.stdout is not None
            for line in worker.stdout:
                word, _, value = line.strip().partition(" ")
                if word == "ack":
                    acknowledged.append(int(value))
                elif word == "blocked":
                    blocked = True
                if blocked and len(acknowledged) == count:
                    break
        finally:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    assert worker.returncode == -signal.SIGKILL
    return acknowledged


async def test_kill_9_mid_summary_loses_nothing_acknowledged(db_path, stored) -> None:
    acknowledged = run_until_killed(db_path, "victim", 25)
    assert acknowledged == list(range(1, 26))
    # Everything acknowledged is in the file the killed process left behind.
    assert [seq for seq, _ in stored.episodes("victim")] == acknowledged
    assert stored.summaries("victim") == []

    summarizer = RecordingSummarizer()
    async with open_engine(
        db_path, summarizer=summarizer, config=SessionConfig(evict_to=1.0, max_episodes=3), owner=RESTARTED_OWNER
    ) as engine:
        context = await engine.session("victim").context(wait_for_summary=True)
    assert covered(context.summary) + [e.content for e in context.episodes] == [f"turn {i}" for i in range(1, 26)]
    assert context.summarized_through == 22
    assert stored.summaries("victim")[-1][0] == 22


async def test_kill_9_before_delivery_then_restart_delivers_every_turn_once(db_path, stored) -> None:
    acknowledged = run_until_killed(db_path, "victim", 8, "3")
    assert acknowledged == list(range(1, 9))
    # Two full batches were in the outbox; nothing was delivered (the sink never returned).
    assert stored.query("SELECT first_seq, last_seq FROM retain_outbox ORDER BY id") == [(1, 3), (4, 6)]

    sink = RecordingSink()
    config = SessionConfig(evict_to=1.0, max_episodes=3, retain_every=3)
    async with open_engine(
        db_path, summarizer=RecordingSummarizer(), retain_sink=sink, config=config, owner=RESTARTED_OWNER
    ):
        await sink.wait_for(3)  # the two batches, and the tail the crash never flushed
    assert sink.delivered_contents() == [f"turn {i}" for i in range(1, 9)]
    assert [(b.first_seq, b.last_seq) for b in sink.batches] == [(1, 3), (4, 6), (7, 8)]
    assert stored.query("SELECT count(*) FROM retain_outbox") == [(0,)]
