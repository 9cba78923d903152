"""PostgreSQL: a replica frozen in the middle of a sink call never lands its batch after the forget.

Replica ``frozen`` (a real process, tests/stale_sink_worker.py) is stopped
with SIGSTOP inside its sink call, and its liveness connection is dropped;
this test's engine reaps it after the grace, deletes the episode (a forget
for the sink, delivered), and only then is the frozen process continued.
Its call must not land: a sink call is bounded by the process's own proof
of life (``store.alive_until()``) as well as by its claim, and a call that
returns after either lapsed is never counted as delivered. The shared sink
(a table) must end holding nothing of the deleted episode. Both libraries.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from memengine import SessionConfig, open_engine

from .conftest import postgres_schema, postgres_unreachable
from .processes import read_line
from .stale_sink_worker import SINK_TABLE, SharedTableSink
from .test_owner_liveness import terminate_liveness_backend
from .test_replicas import ROOT

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(postgres_unreachable() is not None, reason=str(postgres_unreachable())),
]

GUARD = 60  # seconds: nothing here takes that long unless something is stuck


def read_op(process: subprocess.Popen, timeout: float) -> str:
    """The next JSON line's ``op`` from the child, or AssertionError after ``timeout`` seconds."""
    # (Not select() on the pipe: a line read ahead into the text wrapper's buffer is not on the pipe any more.)
    try:
        line = read_line(process, timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("the worker printed nothing in time") from None
    assert line, f"the worker exited: {process.wait()} {process.stderr.read()}"  # type: ignore[union-attr]
    return json.loads(line)["op"]  # type: ignore[no-any-return]


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + GUARD
    while Path(f"/proc/{process.pid}/stat").read_text().split(")")[-1].split()[0] != "T":
        assert time.monotonic() < deadline
        time.sleep(0.001)  # every thread stopped, not only signalled


async def test_a_frozen_replicas_sink_call_never_lands_after_the_forget(anyio_backend, tmp_path) -> None:
    go_file = tmp_path / "go"
    with postgres_schema() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SINK_TABLE)
        worker_backend = "trio" if anyio_backend == "asyncio" else "asyncio"
        frozen = subprocess.Popen(  # noqa: ASYNC220 - started once, before any engine runs here
            [sys.executable, "-m", "tests.stale_sink_worker", url, worker_backend, str(go_file)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert await anyio.to_thread.run_sync(read_op, frozen, GUARD) == "entered"
            with psycopg.connect(url) as conn:
                (lock_key,) = conn.execute("SELECT lock_key FROM engine_owners WHERE owner = 'frozen'").fetchone()
            stop(frozen)
            assert terminate_liveness_backend(url, lock_key) == 1
            sink = SharedTableSink(url)
            config = SessionConfig(retain_every=1, passivate_after=None, lease_wait=GUARD)
            with anyio.fail_after(GUARD):
                async with open_engine(url, retain_sink=sink, config=config, owner="b", retain_grace=5) as engine:
                    # Waits for the frozen owner to be reaped (after the grace), then deletes: a forget for the sink.
                    assert await engine.session("s").delete_episodes([1]) == 1
                    with psycopg.connect(url) as conn:
                        while conn.execute("SELECT count(*) FROM retain_outbox").fetchone() != (0,):
                            conn.rollback()
                            await anyio.sleep(0.05)
            go_file.touch()
            frozen.send_signal(signal.SIGCONT)
            outcome = await anyio.to_thread.run_sync(read_op, frozen, GUARD)
            with psycopg.connect(url) as conn:
                held = conn.execute("SELECT session_id, seq, content FROM sink_episodes").fetchall()
            assert held == [], f"the frozen replica's call landed after the forget ({outcome})"
            assert outcome == "cancelled"
        finally:
            frozen.kill()
            frozen.wait()
            for pipe in (frozen.stdout, frozen.stderr):
                if pipe is not None:
                    pipe.close()
