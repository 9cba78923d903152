"""memengine is a typed package: it ships py.typed, and mypy finds no error in it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_the_package_is_marked_typed() -> None:
    assert (ROOT / "memengine" / "py.typed").is_file()


def test_mypy_finds_no_error_in_memengine() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    # The configuration is pyproject.toml's [tool.mypy]; no cache, so the result never depends on a stale one.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", "/dev/null", "memengine"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
