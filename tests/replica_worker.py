"""One engine process of a multi-process test (see test_replicas.py).

``python -m tests.replica_worker STORE BACKEND NAME MODE [SECONDS]`` opens an
engine on STORE (a SQLite file or a PostgreSQL URL) under the owner name NAME,
with short leases, and prints JSON lines on stdout:

- every lease this process takes, renews and gives up, with the wall-clock
  time (``{"op": "lease", ...}``), so the test can check single activation;
- in ``hammer`` mode, for SECONDS: random adds and reads over 50 shared
  sessions, each acknowledged add and each context read as it was returned;
- in ``erase`` mode, for SECONDS: adds, reads, deletes, clears and tenant
  forgets over 12 sessions of 4 tenants (``t<k>/s<j>``), from 8 clients;
- in ``serve`` mode: one JSON command per stdin line (``add``, ``context``,
  ``delete``, ``clear``, ``active``, ``recall``, ``forget``, ``exit``), answered with one line each; and
  ``heartbeat`` (answered ``heartbeat_started``): from then on, adds to the
  given sessions every ``interval`` seconds, each printed as ``beat`` (or
  ``beat_error``) with its latency; ``freeze`` (see below).

Fault knobs (environment):

- ``MEMENGINE_TEST_RETAIN=1``: a retain sink (batches every
  ``MEMENGINE_TEST_RETAIN_EVERY`` episodes, default 5; a refused batch waits
  ``MEMENGINE_TEST_RETAIN_RETRY_LATER`` seconds after a round, default 60) that prints every
  batch it is handed (``{"op": "retained", ...}``) and every forget
  (``{"op": "forgot", ...}``) before returning;
- ``MEMENGINE_TEST_SINK_TABLE=1``: instead, the shared table sink of
  stale_sink_worker.py (the README's DictSink as a table every process writes);
- ``MEMENGINE_TEST_FREEZE_IN_TRANSACTION=1``: the ``freeze`` command arms a
  trap on a session: the next write of that session checks its lease
  (``SELECT ... FOR SHARE`` on the session's lease row, inside the commit's
  open transaction, on the engine's own connection) and then the whole
  process stops itself with SIGSTOP, holding the transaction and the row lock
  until the test sends SIGCONT (or kills it); with ``"at": "renewal"``, the
  next lease renewal that extends the session's lease does the same;
- ``MEMENGINE_TEST_OPEN_FROM``: the directory to open the store from (the
  store may be a relative path), ``MEMENGINE_TEST_CHDIR_AFTER_OPEN``: the
  directory to move to once it is open (path aliases, issue #26);
- ``MEMENGINE_TEST_FORK_CHILD=1``: in ``hammer`` mode, once it holds leases,
  fork a child that lives on, idle (its pid printed: ``forked``);
- in ``hammer`` mode, ``MEMENGINE_TEST_HAMMER_SESSIONS`` (default 50) shared
  sessions; any engine error of a call is printed (``refused``, or ``doubt``
  with the episode id when the add may or may not be stored) instead of
  ending the process.

The summarizer is :func:`fakes.fold` (a summary lists what it covers), slowed
by ``MEMENGINE_TEST_SUMMARY_DELAY`` seconds and tagged with NAME, so a summary
stored by a process that lost its lease would be recognised. For the
single-owner check, an activation serves from the moment ``activate``
returned until it asks for the release (it has stopped serving by then), or
until its lease may have expired (``ttl`` after it last asked for it).
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio

from memengine import (
    Episode,
    ForgetRequest,
    LeaseLostError,
    MemEngineError,
    RetainBatch,
    SessionBusyError,
    SessionConfig,
    StoreError,
    UncertainCommitError,
    open_engine,
)
from memengine.store import leases as lease_sql

from .fakes import fold
from .stale_sink_worker import SharedTableSink

SESSIONS = [f"shared-{n:02d}" for n in range(int(os.environ.get("MEMENGINE_TEST_HAMMER_SESSIONS", "50")))]
CONFIG = SessionConfig(
    evict_to=1.0,
    max_episodes=4,
    # Short by default: in the hammer, sessions move between the processes all the time.
    passivate_after=float(os.environ.get("MEMENGINE_TEST_PASSIVATE_AFTER", "0.05")),
    lease_ttl=float(os.environ.get("MEMENGINE_TEST_LEASE_TTL", "2.0")),
    lease_wait=float(os.environ.get("MEMENGINE_TEST_LEASE_WAIT", "5.0")),
    summarize_backoff=0.01,
    summarize_retry_later=0.1,
    retain_every=int(os.environ.get("MEMENGINE_TEST_RETAIN_EVERY", "5")),
    retain_retry_later=float(os.environ.get("MEMENGINE_TEST_RETAIN_RETRY_LATER", "60")),
)


_EMITTING = threading.Lock()


def emit(**record: Any) -> None:
    """One JSON line on stdout, written whole: records printed from the store's threads never interleave.

    Written with os.write, every byte accounted for: through ``sys.stdout``, a
    long line (over the pipe's 64 KB) written while the test paused the process
    (SIGSTOP, SIGCONT) lost bytes in the middle, and the test's reader got a
    garbled record (reproduced beside the worker: 108 of 47,548 lines of 70 KB;
    none with os.write).
    """
    data = memoryview((json.dumps(record) + "\n").encode())
    with _EMITTING:
        while data:
            data = data[os.write(1, data) :]


TAG = "#by="


def untagged(summary: str | None) -> str | None:
    """The summary without the name of the process that computed it."""
    return None if summary is None else summary.split(TAG)[0]


def tagged_by(summary: str) -> str:
    return summary.split(TAG)[1]


class TaggedFold:
    """fold(), tagged with the process that computed it (``...#by=NAME``), after an optional delay."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.delay = float(os.environ.get("MEMENGINE_TEST_SUMMARY_DELAY", "0"))

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        if self.delay:
            await anyio.sleep(self.delay)
        summary = f"{fold(untagged(previous), episodes)}{TAG}{self.name}"
        emit(op="summarized", by=self.name, through=episodes[-1].seq, summary=summary)
        return summary


class PrintingSink:
    """A retain sink that prints every batch it is handed, then accepts it."""

    async def retain(self, batch: RetainBatch) -> None:
        emit(
            op="retained",
            session=batch.session_id,
            first_seq=batch.first_seq,
            last_seq=batch.last_seq,
            key=batch.key,
            episodes=[[e.seq, e.id] for e in batch.episodes],
            at=time.time(),
        )

    async def forget(self, request: ForgetRequest) -> None:
        emit(op="forgot", session=request.session_id, seqs=request.seqs, key=request.key, at=time.time())


class FreezeTrap:
    """Stops the whole process (SIGSTOP) inside a transaction that holds a session's lease row lock.

    ``at="write"``: in a write of the session, after its lease check, which
    locks the session's lease row (``FOR SHARE`` on PostgreSQL).
    ``at="renewal"``: in a lease renewal that extended the session's lease
    (the ``UPDATE`` locks the row of every lease it renews).
    Either way on the engine's own connection, in the commit's open
    transaction: the stopped process holds the locks until it is continued
    or killed, as a replica frozen by the OS, a VM pause or a GC would.
    """

    def __init__(self) -> None:
        self.session: str | None = None
        self.at = "write"
        self.lock = threading.Lock()
        require, all_held, renew = lease_sql.require, lease_sql.all_held, lease_sql.renew

        def trapped_require(db: Any, session_id: str, token: int) -> None:
            require(db, session_id, token)
            self.spring("write", [session_id])

        def trapped_all_held(db: Any, held: Sequence[tuple[str, int]]) -> bool:
            result = all_held(db, held)
            if result:
                self.spring("write", [session_id for session_id, _ in held])
            return result

        def trapped_renew(db: Any, owner: str, leases: Any, ttl: float, **options: Any) -> set[str]:
            renewed = renew(db, owner, leases, ttl, **options)
            self.spring("renewal", sorted(renewed))
            return renewed

        lease_sql.require, lease_sql.all_held, lease_sql.renew = trapped_require, trapped_all_held, trapped_renew

    def arm(self, session_id: str, at: str) -> None:
        with self.lock:
            self.session, self.at = session_id, at

    def spring(self, at: str, sessions: Sequence[str]) -> None:
        with self.lock:
            if self.session is None or self.session not in sessions or self.at != at:
                return
            self.session = None
        emit(op="freezing", session=sessions, at=time.time())
        # Directed at this thread (the store's, inside the open transaction), so this very thread stops
        # before it returns: sent to the process, another thread might take it while this one commits.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        emit(op="thawed", at=time.time())


TRAP = FreezeTrap() if os.environ.get("MEMENGINE_TEST_FREEZE_IN_TRANSACTION") == "1" else None


def log_leases(store: Any) -> None:
    """Record every lease taken and given up (times are the wall clock, shared by the processes)."""
    activate, renew, release, release_all, keep_alive = (
        store.activate,
        store.renew_leases,
        store.release_lease,
        store.release_leases,
        store.keep_alive,
    )

    async def logged_activate(session_id: str, ttl: float):
        asked_at = time.time()
        token, snapshot = await activate(session_id, ttl)
        emit(op="lease", event="taken", session=session_id, token=token, at=time.time(), asked_at=asked_at, ttl=ttl)
        return token, snapshot

    async def logged_renew(held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        asked_at = time.time()
        renewed = await renew(held, ttl)
        leases = [[session_id, token] for session_id, token in held if session_id in renewed]
        emit(op="lease", event="renewed", leases=leases, asked_at=asked_at, ttl=ttl)
        return renewed

    async def logged_release(session_id: str, token: int) -> None:
        # The activation has stopped serving by now (it releases only after leaving the registry).
        emit(op="lease", event="released", session=session_id, token=token, at=time.time())
        await release(session_id, token)

    async def logged_release_all() -> None:
        emit(op="lease", event="released_all", at=time.time())  # every activation has stopped
        await release_all()

    async def logged_keep_alive() -> bool:
        held = await keep_alive()
        log_alive(store)
        return held

    store.activate, store.renew_leases = logged_activate, logged_renew
    store.release_lease, store.release_leases = logged_release, logged_release_all
    store.keep_alive = logged_keep_alive
    emit(op="lease", event="alive", at=time.time(), after=None, until=None)  # a new process: no earlier bound
    log_alive(store)


def log_alive(store: Any) -> None:
    """When this process answers reads from memory without renewing first, as its last heartbeat left it.

    A session's lease is counted on only while both it and the process's own
    proof of life are (session/lease.py, ``store.alive_until()``): from
    ``after`` (the end of a spell taken for dead: until then every read renews
    first) until ``until`` (the proof of life's end); past either, a read
    renews the lease first, and is answered at the renewal, or refused. Wall
    clock; ``None``: no bound. (The store's own two bounds, read as it keeps them.)
    """
    now, wall_now = anyio.current_time(), time.time()
    after, until = store._reaped_until, store._alive_until
    emit(
        op="lease",
        event="alive",
        at=wall_now,
        after=wall_now + (after - now) if math.isfinite(after) else None,
        until=wall_now + (until - now) if math.isfinite(until) else None,
    )


def context_record(session_id: str, context: Any) -> dict[str, Any]:
    return {
        "session": session_id,
        "summary": context.summary,
        "summarized_through": context.summarized_through,
        "episodes": [[e.seq, e.id, e.content] for e in context.episodes],
    }


async def hammer(engine: Any, name: str, seconds: float) -> None:
    rng = random.Random(name)
    deadline = time.monotonic() + seconds
    count = 0

    async def one_client(client: int) -> None:
        nonlocal count
        while time.monotonic() < deadline:
            session_id = rng.choice(SESSIONS)
            handle = engine.session(session_id)
            try:
                if rng.random() < 0.7:
                    count += 1
                    episode = Episode("user", f"{name} {count}")
                    emit(op="try", session=session_id, id=episode.id)  # may be stored if this process is killed now
                    try:
                        (stored,) = await handle.add([episode])
                    except (UncertainCommitError, StoreError) as exc:
                        # Maybe stored, maybe not (a StoreError after a lost connection is no better).
                        emit(op="doubt", session=session_id, id=episode.id, error=type(exc).__name__, message=str(exc))
                        raise
                    emit(
                        op="ack",
                        session=session_id,
                        id=stored.id,
                        seq=stored.seq,
                        content=stored.content,
                        at=time.time(),
                    )
                else:
                    started_at = time.time()  # every add acknowledged before now must be in the read
                    context = await handle.context()
                    emit(op="read", started_at=started_at, **context_record(session_id, context))
            except (SessionBusyError, LeaseLostError) as exc:
                emit(op="refused", session=session_id, error=type(exc).__name__, message=str(exc))
            except MemEngineError as exc:
                emit(op="refused", session=session_id, error=type(exc).__name__, message=str(exc))
            await anyio.sleep(rng.random() * 0.01)

    async with anyio.create_task_group() as clients:
        for client in range(8):
            clients.start_soon(one_client, client)


ERASE_SESSIONS = [f"t{tenant}/s{chat}" for tenant in range(4) for chat in range(3)]


async def erase_hammer(engine: Any, name: str, seconds: float) -> None:
    """For ``seconds``: adds, reads, deletes, clears and tenant forgets over 12 sessions of 4 tenants."""
    rng = random.Random(f"erase {name}")
    deadline = time.monotonic() + seconds
    count = 0
    last_seq: dict[str, int] = {}

    async def one_client() -> None:
        nonlocal count
        while time.monotonic() < deadline:
            session_id = rng.choice(ERASE_SESSIONS)
            handle = engine.session(session_id)
            roll = rng.random()
            try:
                if roll < 0.6:
                    count += 1
                    (stored,) = await handle.add([Episode("user", f"{name} {count}")])
                    last_seq[session_id] = max(last_seq.get(session_id, 0), stored.seq)
                    emit(op="ack", session=session_id, seq=stored.seq)
                elif roll < 0.75:
                    await handle.context()
                elif roll < 0.9:
                    seq = rng.randint(1, max(1, last_seq.get(session_id, 1)))
                    emit(op="deleted", session=session_id, deleted=await handle.delete_episodes([seq]))
                elif roll < 0.96:
                    await handle.clear()
                    emit(op="cleared", session=session_id)
                else:
                    tenant = session_id.split("/")[0]
                    report = await engine.forget(tenant=tenant)
                    emit(op="erased", tenant=tenant, sessions=report.sessions)
            except MemEngineError as exc:
                emit(op="refused", session=session_id, error=type(exc).__name__, message=str(exc))
            await anyio.sleep(rng.random() * 0.01)

    async with anyio.create_task_group() as clients:
        for _ in range(8):
            clients.start_soon(one_client)


async def heartbeat(engine: Any, sessions: Sequence[str], interval: float) -> None:
    """Adds to ``sessions`` in turn every ``interval`` seconds, each printed with its latency."""
    beat = 0
    while True:
        session_id = sessions[beat % len(sessions)]
        beat += 1
        episode = Episode("user", f"beat {beat}")
        started, at = time.monotonic(), time.time()
        try:
            (stored,) = await engine.session(session_id).add([episode])
        except MemEngineError as exc:
            emit(
                op="beat_error",
                session=session_id,
                id=episode.id,
                at=at,
                latency=time.monotonic() - started,
                error=type(exc).__name__,
                message=str(exc),
            )
        else:
            emit(op="beat", session=session_id, id=stored.id, seq=stored.seq, at=at, latency=time.monotonic() - started)
        await anyio.sleep(interval)


async def serve(engine: Any) -> None:
    async with anyio.create_task_group() as background:
        await serve_commands(engine, background)
        background.cancel_scope.cancel()


async def serve_commands(engine: Any, background: Any) -> None:
    while True:
        line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            return
        command = json.loads(line)
        op = command["op"]
        if op == "exit":
            return
        if op == "active":
            emit(op="active", session=command["session"], active=engine.is_active(command["session"]))
            continue
        if op == "heartbeat":
            background.start_soon(heartbeat, engine, command["sessions"], command.get("interval", 0.05))
            emit(op="heartbeat_started")
            continue
        if op == "freeze":
            assert TRAP is not None, "set MEMENGINE_TEST_FREEZE_IN_TRANSACTION=1"
            TRAP.arm(command["session"], command.get("at", "write"))
            emit(op="armed", session=command["session"])
            continue
        if op == "recall":
            try:
                session = command.get("session")
                scope = {"session_id": session} if session is not None else {"all_sessions": True}
                hits = await engine.recall(command["query"], **scope)
            except MemEngineError as exc:
                emit(op="error", error=type(exc).__name__, message=str(exc))
            else:
                emit(op="recalled", hits=[[h.session_id, h.episode.seq, h.episode.content] for h in hits])
            continue
        if op == "forget":
            try:
                report = await engine.forget(tenant=command.get("tenant"), session_id=command.get("session"))
            except MemEngineError as exc:
                emit(op="error", error=type(exc).__name__, message=str(exc))
            else:
                emit(op="erased", sessions=report.sessions, episodes=report.episodes, summaries=report.summaries)
            continue
        # Each call runs on its own, so a call stuck on one session does not hold up the others.
        background.start_soon(one_call, engine, command)


async def one_call(engine: Any, command: dict[str, Any]) -> None:
    op = command["op"]
    handle = engine.session(command["session"])
    started = time.monotonic()
    try:
        if op == "add":
            stored = await handle.add([Episode("user", text) for text in command["contents"]])
            emit(op="ack", session=command["session"], seqs=[e.seq for e in stored], latency=time.monotonic() - started)
        elif op == "delete":
            deleted = await handle.delete_episodes(command["seqs"])
            emit(op="deleted", session=command["session"], deleted=deleted)
        elif op == "clear":
            await handle.clear()
            emit(op="cleared", session=command["session"])
        elif op == "context":
            context = await handle.context(wait_for_summary=command.get("wait", False))
            emit(op="context", **context_record(command["session"], context))
    except MemEngineError as exc:
        emit(
            op="error",
            session=command["session"],
            error=type(exc).__name__,
            message=str(exc),
            latency=time.monotonic() - started,
        )


def fork_a_child_that_lives_on(lifetime: float) -> None:
    """Fork a child that does nothing for ``lifetime`` seconds (it holds copies of every descriptor).

    Its pid is printed (``forked``) so the test can end it. The child lets go of
    stdout and stderr at once, so the test still reads the end of its parent's output.
    """
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        time.sleep(lifetime)
        os._exit(0)
    emit(op="forked", pid=pid, at=time.time())


async def main(store: str, name: str, mode: str, seconds: float) -> None:
    sink: Any = PrintingSink() if os.environ.get("MEMENGINE_TEST_RETAIN") == "1" else None
    if os.environ.get("MEMENGINE_TEST_SINK_TABLE") == "1":
        sink = SharedTableSink(store)
    if os.environ.get("MEMENGINE_TEST_OPEN_FROM"):
        os.chdir(os.environ["MEMENGINE_TEST_OPEN_FROM"])  # the store's path may be relative to it
    async with open_engine(store, summarizer=TaggedFold(name), config=CONFIG, owner=name, retain_sink=sink) as engine:
        if os.environ.get("MEMENGINE_TEST_CHDIR_AFTER_OPEN"):
            os.chdir(os.environ["MEMENGINE_TEST_CHDIR_AFTER_OPEN"])  # a relative path now names another file
        log_leases(engine.store)
        emit(op="ready", name=name)
        if mode == "hammer":
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(hammer, engine, name, seconds)
                if os.environ.get("MEMENGINE_TEST_FORK_CHILD") == "1":
                    await anyio.sleep(min(1.0, seconds / 4))  # once it holds leases
                    fork_a_child_that_lives_on(seconds + 600)
        elif mode == "erase":
            await erase_hammer(engine, name, seconds)
        else:
            await serve(engine)
    emit(op="exited", name=name)


if __name__ == "__main__":
    store_arg, backend, name_arg, mode_arg = sys.argv[1:5]
    seconds_arg = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    anyio.run(main, store_arg, name_arg, mode_arg, seconds_arg, backend=backend)
