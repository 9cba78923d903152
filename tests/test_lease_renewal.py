"""A large add never costs another session of the engine its lease (issue #26, item 7).

Every lease of an engine is renewed by one task on the event loop, every third
of ``lease_ttl``. Whatever holds the loop longer than that lets leases expire,
and an expired lease is never revived: the other session was given up with
LeaseLostError. A 100,000-episode add held the loop for about a second when
its completion counted every episode's tokens on the loop (one by one, each a
short content), so it cost an unrelated session its lease with a 0.9 s lease.
Now a batch of many contents, or long ones together, is counted in a worker
thread, before the add is sent to the session.

The worker's tokenizer takes at least a millisecond per content, so counting
the large add on the loop would hold it for several lease periods on any
machine; nothing here measures time. Run in a child process (it could hang).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .lease_renewal_worker import LARGE

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_large_add_costs_no_other_session_its_lease(store_url: str, backend: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.lease_renewal_worker", store_url, backend],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The first context() after the import holds all of it; the other session's adds all went on.
    assert done.stdout.split() == ["ok", str(LARGE), "True"], done.stdout + done.stderr[-3000:]
