"""A call from another thread's event loop is refused at once, naming the portal; it never hangs.

The engine's actors answer a caller by waking it on the engine's own event
loop, which cannot wake a task of another loop (nor safely touch it from
another thread). Every public call of the engine and of a session handle
checks where it comes from first and raises :class:`ForeignLoopError`, which
says how to make the call instead (a portal). Each scenario runs in a child
process (tests/foreign_loop_worker.py) with a timeout, so a hang fails the
test rather than the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memengine import ForeignLoopError, MemEngineError

from .foreign_loop_worker import GIVE_UP

ROOT = Path(__file__).resolve().parent.parent
#: A child that takes this long is hung (each call gives up after GIVE_UP seconds).
HANG = 6 * GIVE_UP

BACKENDS = ["asyncio", "trio"]


def run_child(tmp_path: Path, *arguments: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "tests.foreign_loop_worker",
        *arguments[:2],
        str(tmp_path / "m.db"),
        *arguments[2:],
    ]
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"a call from another event loop hung ({arguments}); stderr:\n{expired.stderr}")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_error_is_a_memengine_error_and_a_runtime_error() -> None:
    assert issubclass(ForeignLoopError, MemEngineError)
    assert issubclass(ForeignLoopError, RuntimeError)


@pytest.mark.parametrize("caller_backend", BACKENDS)
@pytest.mark.parametrize("engine_backend", BACKENDS)
def test_every_public_call_from_another_loop_raises_naming_the_portal(
    tmp_path: Path, engine_backend: str, caller_backend: str
) -> None:
    report = run_child(tmp_path, engine_backend, caller_backend)

    message = report.pop("message")
    afterwards = report.pop("afterwards")
    assert report == {name: "ForeignLoopError" for name in report}, report
    assert len(report) == 14
    assert "portal" in message and "from_thread" in message, message
    # Nothing was done: the refused add stored nothing, the refused clear cleared nothing,
    # the refused close left the session serving its own loop.
    assert afterwards == ["seeded on the engine's loop"]


@pytest.mark.parametrize("engine_backend", BACKENDS)
def test_runner_run_sync_without_a_portal_raises_naming_portal(tmp_path: Path, engine_backend: str) -> None:
    pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed")
    report = run_child(tmp_path, engine_backend, "asyncio", "agents")

    assert report["Runner.run_sync"] == "ForeignLoopError", report
    assert "portal=" in report["message"], report["message"]
    assert report["afterwards"] == ["seeded on the engine's loop"]
