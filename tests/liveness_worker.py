"""Engine processes for test_liveness_proof.py: one that holds a session, one that wants it.

``python -m tests.liveness_worker hold STORE [options]``: opens an engine (owner
``holder`` unless ``--owner``), adds two turns to session ``"s"`` with
``max_episodes=1`` so a summary is in flight for ever (its summarizer never
returns: the session is never idle, so never handed over), prints
``{"op": "holding", "pid": ...}`` and waits to be killed. ``--fork`` first forks
a child that outlives it doing nothing (``{"op": "forked", "child": pid}``).
``--lease-ttl`` sets ``lease_ttl`` (default 10 s).

``python -m tests.liveness_worker want STORE [options]``: opens an engine
(owner ``wanter``), adds a turn to ``"s"`` waiting up to ``--lease-wait``
seconds (default 3), prints ``{"op": "busy", "owner": ...}`` or
``{"op": "took", "seq": ...}`` and exits.

Both: ``--chdir DIR`` changes the working directory once the engine is open
(a relative STORE then names another file, or none); ``--liveness-url URL``
is passed to ``open_engine``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import anyio

from memengine import Episode, SessionBusyError, SessionConfig, open_engine


def emit(**record: object) -> None:
    print(json.dumps(record), flush=True)


class NeverSummarizer:
    async def summarize(self, previous, episodes) -> str:
        emit(op="summarizing", pid=os.getpid())
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def engine_options(args: argparse.Namespace) -> dict:
    return {} if args.liveness_url is None else {"liveness_url": args.liveness_url}


async def hold(args: argparse.Namespace) -> None:
    config = SessionConfig(passivate_after=None, max_episodes=1, evict_to=1.0, lease_ttl=args.lease_ttl)
    async with open_engine(
        args.store, config=config, owner=args.owner or "holder", summarizer=NeverSummarizer(), **engine_options(args)
    ) as engine:
        if args.chdir:
            os.chdir(args.chdir)
        await engine.session("s").add([Episode("user", "held 1"), Episode("user", "held 2")])
        if args.fork:
            child = os.fork()
            if child == 0:  # the child does nothing with the engine; it outlives its parent
                time.sleep(600)  # noqa: ASYNC251  # a forked child: no event loop of its own
                os._exit(0)
            emit(op="forked", child=child)
        emit(op="holding", pid=os.getpid())
        await anyio.sleep_forever()


async def want(args: argparse.Namespace) -> None:
    config = SessionConfig(passivate_after=None, lease_wait=args.lease_wait)
    async with open_engine(args.store, config=config, owner=args.owner or "wanter", **engine_options(args)) as engine:
        if args.chdir:
            os.chdir(args.chdir)
        try:
            (episode,) = await engine.session("s").add([Episode("user", "wanted")])
        except SessionBusyError as busy:
            emit(op="busy", owner=busy.owner)
        else:
            emit(op="took", seq=episode.seq)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["hold", "want"])
    parser.add_argument("store")
    parser.add_argument("--backend", default="asyncio")
    parser.add_argument("--chdir")
    parser.add_argument("--owner")
    parser.add_argument("--fork", action="store_true")
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--lease-wait", type=float, default=3.0)
    parser.add_argument("--liveness-url")
    args = parser.parse_args()
    anyio.run(hold if args.mode == "hold" else want, args, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
