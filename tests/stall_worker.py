"""A child process for the stalled-connection tests: PostgreSQL goes silent under a running engine.

Usage: python -m tests.stall_worker SCENARIO BACKEND URL

The engine reaches PostgreSQL at URL through a :class:`StallingProxy`. It adds
episodes to a few sessions, then the proxy stalls (no byte passes, nothing is
closed). Then, by SCENARIO:

- ``in_flight``: one more add is made, then a recall; each must fail with
  ``StoreError`` (the client's own bound on a reply, ``reply_timeout``, is
  short here);
- ``exit``: an add is in flight when the engine is left (``reply_timeout`` is
  long here: leaving must not wait for it).

It prints one JSON line: the seqs acknowledged per session, the add's outcome
and how long it took, and how long leaving the engine took. The test runs it
with a timeout, so a hang fails the test.
"""

from __future__ import annotations

import json
import sys
import time

import anyio

from memengine import Episode, SessionConfig, StoreError, open_engine

from .stalling_proxy import StallingProxy

SESSIONS = ("alice", "bob", "carol")
CONFIG = SessionConfig(lease_ttl=5.0, lease_wait=1.0, passivate_after=None)
#: Client-side bounds per scenario (seconds), added to the URL.
REPLY_TIMEOUT = {"in_flight": 3, "exit": 20}
CONNECT_TIMEOUT = 2


def through(proxy: StallingProxy, url: str, scenario: str) -> str:
    url = proxy.url(url)
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}reply_timeout={REPLY_TIMEOUT[scenario]}&connect_timeout={CONNECT_TIMEOUT}"


async def main(scenario: str, url: str) -> dict:
    host_port = url.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.rsplit(":", 1)
    proxy = StallingProxy((host, int(port)))
    acknowledged: dict[str, list[int]] = {s: [] for s in SESSIONS}
    outcome: dict[str, object] = {"add_error": None, "add_seconds": None}
    async with open_engine(through(proxy, url, scenario), config=CONFIG, owner="stalled") as engine:
        for round_ in range(3):
            for session_id in SESSIONS:
                stored = await engine.session(session_id).add([Episode("user", f"{session_id} {round_}")])
                acknowledged[session_id].extend(e.seq for e in stored)
        proxy.stall()
        if scenario == "in_flight":
            started = time.monotonic()
            try:
                await engine.session("alice").add([Episode("user", "into the silence")])
            except StoreError as exc:
                outcome = {"add_error": type(exc).__name__, "add_message": str(exc)}
            else:
                outcome = {"add_error": "none: the add was acknowledged"}
            outcome["add_seconds"] = time.monotonic() - started
            started = time.monotonic()
            try:
                await engine.recall("silence", all_sessions=True)  # on the read connection, which is silent too
            except StoreError as exc:
                outcome["recall_error"] = type(exc).__name__
            else:
                outcome["recall_error"] = "none: the recall answered"
            outcome["recall_seconds"] = time.monotonic() - started
        else:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(engine.session("alice").add, [Episode("user", "into the silence")])
                await anyio.sleep(2.5)  # long enough for a liveness heartbeat to be waiting too
                tasks.cancel_scope.cancel()
        left_at = time.monotonic()
    outcome["exit_seconds"] = time.monotonic() - left_at
    return {"acknowledged": acknowledged, **outcome}


if __name__ == "__main__":
    scenario, backend, url = sys.argv[1:4]
    result = anyio.run(main, scenario, url, backend=backend)
    print(json.dumps(result), flush=True)
