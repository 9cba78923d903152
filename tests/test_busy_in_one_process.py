"""Two engines on one store in one process: the busy session's owner is named as such.

Each engine holds its sessions' leases under its own owner name, so a second
engine in the same process waits ``lease_wait`` for a session the first one
holds with work in flight, like any other process would (an idle one is
handed over). The error then says the owner is an
engine of this very process, which is what a user needs to see to fix it.
"""

from __future__ import annotations

import os
import re
import socket

import pytest

from memengine import Episode, SessionBusyError, SessionConfig, open_engine

from .fakes import GatedSummarizer

pytestmark = pytest.mark.anyio

SHORT_WAIT = SessionConfig(lease_wait=0.3, passivate_after=None)


async def test_a_session_held_by_another_engine_of_this_process_says_so(store_url: str) -> None:
    # The first engine's session has a summary in flight, so it is not handed over (store/handover.py).
    summarizer = GatedSummarizer()
    busy = SessionConfig(lease_wait=0.3, passivate_after=None, max_episodes=1, evict_to=1.0)
    async with (
        open_engine(store_url, config=busy, summarizer=summarizer) as first,
        open_engine(store_url, config=SHORT_WAIT) as second,
    ):
        await first.session("s").add([Episode("user", "hello"), Episode("user", "again")])
        await summarizer.wait_until_called()

        with pytest.raises(SessionBusyError) as caught:
            await second.session("s").context()
        summarizer.release()

    message = str(caught.value)
    assert "another engine in this same process" in message
    assert f"pid {os.getpid()}" in message
    assert caught.value.owner.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    # How long it waited: lease_wait (0.3 s) at least, more on a loaded machine (0.4 s was seen).
    waited = re.search(r"waited (\d+\.\d) s", message)
    assert waited is not None and float(waited.group(1)) >= 0.3, message


def test_an_owner_of_another_process_is_not_called_this_process() -> None:
    other = SessionBusyError("s", f"{socket.gethostname()}:{os.getpid() + 1}:abcdef12", 5.0, 12.0)
    named = SessionBusyError("s", "worker-7", 5.0, 12.0)

    assert "this same process" not in str(other)
    assert "this same process" not in str(named)
    assert "is owned by 'worker-7'" in str(named)
