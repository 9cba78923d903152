"""Every forget that is recorded wakes delivery at once, whoever records it.

A delete or clear through a session handle, ``engine.forget(...)`` over a
tenant, and a forget recorded by another process (one without a sink, as
``memengine forget`` on the command line, which may come and go between two
of this engine's heartbeats) reach the sink of an engine that
can deliver them without waiting for its timer: ``retain_retry_later`` is
an hour here, so only a wake-up gets them there within the test's guard.
On both stores and both async libraries; the other process is real.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from memengine import Episode, SessionConfig, open_engine

from .test_erasure_set_aside import RefusingDictSink
from .test_replicas import ROOT, Worker
from .test_retain_delivery import GUARD, QUICK

CONFIG = SessionConfig(retain_every=1, retain_retry_later=3600, **QUICK)


@pytest.mark.anyio
async def test_a_tenant_forget_reaches_the_sink_at_once(store_url) -> None:
    sink = RefusingDictSink(refused=None)
    async with open_engine(store_url, retain_sink=sink, config=CONFIG, retain_grace=0) as engine:
        for chat in ("t/a", "t/b", "u/c"):
            await engine.session(chat).add([Episode("user", f"{chat} words")])
        await sink.wait_until(lambda: len(sink.sessions) == 3)
        report = await engine.forget(tenant="t")
        assert report.sessions == 2
        await sink.wait_until(lambda: {("t/a", None), ("t/b", None)} <= set(sink.forgets))
        assert sink.sessions == {"t/a": {}, "t/b": {}, "u/c": {1: "u/c words"}}


def test_a_forget_another_process_records_reaches_this_ones_sink_at_once(store_url) -> None:
    holder = Worker(
        store_url,
        "trio",
        "holder",
        "serve",
        MEMENGINE_TEST_RETAIN="1",
        MEMENGINE_TEST_RETAIN_EVERY="1",
        MEMENGINE_TEST_RETAIN_RETRY_LATER="3600",
        MEMENGINE_TEST_PASSIVATE_AFTER="60",
    )
    eraser = None
    watchdog = threading.Timer(GUARD * 2, holder.stop)  # a forget that never comes ends the read (EOF)
    try:
        assert holder.ask(op="add", session="alice/chat", contents=["alice's words"])["seqs"] == [1]
        holder.wait_for("retained")
        eraser = Worker(store_url, "asyncio", "eraser", "serve")  # no sink: it records the forget only
        watchdog.start()
        forgot = eraser.ask(op="forget", tenant="alice")
        assert (forgot["op"], forgot["sessions"]) == ("erased", 1), forgot
        record = holder.wait_for("forgot")
        assert (record["session"], record["seqs"]) == ("alice/chat", None)
        watchdog.cancel()
        for worker in (holder, eraser):
            worker.ask(op="exit")
            worker.finish()
    finally:
        watchdog.cancel()
        holder.stop()
        if eraser is not None:
            eraser.stop()


def test_a_forget_by_the_command_line_reaches_a_running_engines_sink_at_once(store_url) -> None:
    """`memengine forget` (an engine without a sink, come and gone between two heartbeats) records the forget."""
    holder = Worker(
        store_url,
        "asyncio",
        "holder",
        "serve",
        MEMENGINE_TEST_RETAIN="1",
        MEMENGINE_TEST_RETAIN_EVERY="1",
        MEMENGINE_TEST_RETAIN_RETRY_LATER="3600",
        MEMENGINE_TEST_PASSIVATE_AFTER="0.05",  # the session is let go: the command erases it without a hand-over
    )
    watchdog = threading.Timer(GUARD * 2, holder.stop)
    try:
        assert holder.ask(op="add", session="alice/chat", contents=["alice's words"])["seqs"] == [1]
        holder.wait_for("retained")
        watchdog.start()
        erased = subprocess.run(
            [sys.executable, "-m", "memengine.cli", "forget", store_url, "--tenant", "alice", "--yes"],
            capture_output=True,
            text=True,
            timeout=GUARD,
            cwd=ROOT,
        )
        assert erased.returncode == 0 and "erased 1 session" in erased.stdout, erased
        record = holder.wait_for("forgot")
        assert (record["session"], record["seqs"]) == ("alice/chat", None)
        watchdog.cancel()
        holder.ask(op="exit")
        holder.finish()
    finally:
        watchdog.cancel()
        holder.stop()
