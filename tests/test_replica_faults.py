"""Replicas under real faults (issue #14): frozen owners, held row locks, dropped connections, chaos.

The faults are real: processes stopped with SIGSTOP (inside a write
transaction that holds a lease row lock, see ``FreezeTrap`` in
replica_worker.py), row locks held by a raw psycopg connection, connections
killed by the server (``pg_terminate_backend``). Most of them are PostgreSQL's
own (row locks, server-side connection kills), so those tests run on
PostgreSQL only. Every wait has a timeout: a test fails, it never hangs.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from memengine import Episode, LeaseLostError, MemEngineError, SessionConfig, open_engine

from .conftest import POSTGRES_SERVER, StoreRows, postgres_schema
from .replica_worker import untagged
from .test_replicas import ROOT, covered, lease_overlaps, retain_problems

psycopg = pytest.importorskip("psycopg")


# -- helpers ------------------------------------------------------------------------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh schema on the test server (PostgreSQL only: the faults below are PostgreSQL's)."""
    with postgres_schema() as url:
        yield url


def named(url: str, application_name: str) -> str:
    """``url`` whose connections carry ``application_name``, so the test can find (and kill) them."""
    return f"{url}{'&' if '?' in url else '?'}application_name={application_name}"


def terminate_backends(application_name: str, wait: float = 0.0) -> int:
    """Kill every server connection of ``application_name`` (never the test's own); how many.

    With ``wait`` (seconds), each kill returns once that backend has exited (or
    ``wait`` ran out: then it does not count), not once it was signalled.
    """
    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity WHERE application_name = %s "
            "AND pid <> pg_backend_pid()",
            (round(wait * 1000), application_name),
        ).fetchall()
    return sum(1 for (killed,) in rows if killed)


def process_state(pid: int) -> str:
    """The kernel's state letter of ``pid`` (``T``: stopped)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def covered_digest(contents: list[str]) -> str:
    """A digest of a list of contents, for comparing a read's summary with the store's contents."""
    return hashlib.sha256(json.dumps(contents).encode()).hexdigest()


def compact_read(record: dict[str, Any]) -> None:
    """A read record without its summary: what the summary covers as a digest, and its start for messages.

    A summary covers the whole history before the window, so keeping every read's (the hammer makes
    thousands) would hold gigabytes in this process over a soak's minute.
    """
    summary = record.pop("summary")
    try:
        record["covered"] = covered_digest(covered(summary))
    except Exception as exc:  # (in the reader's thread: a mismatch the check reports, not a lost record)
        record["covered"] = f"a summary the test cannot read: {exc!r}"
    record["summary_start"] = untagged(summary)[:200] if summary else summary


class FaultWorker:
    """A replica_worker process whose stdout is read by a thread, so every wait has a timeout."""

    def __init__(self, store: str, backend: str, name: str, mode: str = "serve", seconds: float = 0, **env: str):
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.replica_worker", store, backend, name, mode, str(seconds)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        )
        self.records: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        self.wait_for("ready", timeout=30)

    def _read_stdout(self) -> None:
        try:
            for line in self.process.stdout:  # type: ignore[union-attr]
                if not line.endswith("\n"):
                    break  # killed in the middle of printing a record: its last line is cut short, and unsaid
                try:
                    record = json.loads(line)
                except ValueError as exc:
                    self._stderr.append(f"[test] unreadable record from {self.name}: {exc}: {line[:300]!r}\n")
                    raise
                if record.get("op") == "read":
                    compact_read(record)
                elif record.get("op") == "summarized":
                    record.pop("summary", None)  # (read by no check here; each holds the history before it)
                self.records.append(record)
                self._lines.put(record)
        finally:
            self._lines.put(None)  # whatever happened, nobody waits for records that will not come

    def _read_stderr(self) -> None:
        for line in self.process.stderr:  # type: ignore[union-attr]
            self._stderr.append(line)

    def stderr(self) -> str:
        return "".join(self._stderr)[-3000:]

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next record, or None if none came within ``timeout`` seconds."""
        try:
            record = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if record is None:
            self._lines.put(None)
            raise AssertionError(f"{self.name} exited: {self.process.wait()} {self.stderr()}")
        return record

    def wait_for(self, *ops: str, timeout: float) -> dict[str, Any] | None:
        """The next record whose op is one of ``ops``; None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            record = self.next(left)
            if record is None:
                return None
            if record["op"] in ops:
                return record
        return None

    def send(self, **command: Any) -> None:
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]

    def ask(self, timeout: float, **command: Any) -> dict[str, Any] | None:
        """Send a call; its answer (``ack``, ``context``, ``error``, ...), or None after ``timeout`` seconds."""
        self.send(**command)
        return self.wait_for("ack", "context", "error", "recalled", "active", "armed", timeout=timeout)

    def signal(self, sig: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Wait for the process to end on its own; everything it printed."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not end within {timeout} s: {self.stderr()}") from None
        self._readers[0].join(10)  # it has parsed every line the process printed
        assert self.process.returncode == 0, f"{self.name} failed ({self.process.returncode}): {self.stderr()}"
        assert self.records and self.records[-1]["op"] == "exited", self.stderr()
        return self.records

    def collect(self) -> list[dict[str, Any]]:
        """After the process was killed: everything it printed."""
        self.process.wait(10)
        self._readers[0].join(10)
        return self.records

    def exit(self, timeout: float = 30) -> list[dict[str, Any]]:
        self.send(op="exit")
        return self.finish(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
        for reader in self._readers:
            reader.join(10)  # the process has ended: its pipes reach their end
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass


class RowLockHolder:
    """A raw connection holding ``SELECT ... FOR SHARE`` on one lease row, in an open transaction, until released."""

    def __init__(self, url: str, session_id: str, mode: str = "FOR SHARE") -> None:
        self.conn = psycopg.connect(url)  # not autocommit: the SELECT opens a transaction
        row = self.conn.execute(f"SELECT owner, token FROM session_leases WHERE session_id = %s {mode}", (session_id,))
        assert row.fetchone() is not None, f"no lease row for {session_id!r}"

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


def lease_row_locked(url: str, session_id: str) -> bool:
    """Whether another transaction holds a lock on ``session_id``'s lease row (FOR UPDATE NOWAIT fails)."""
    with psycopg.connect(url) as conn:
        try:
            conn.execute("SELECT 1 FROM session_leases WHERE session_id = %s FOR UPDATE NOWAIT", (session_id,))
        except psycopg.errors.LockNotAvailable:
            return True
        conn.rollback()
        return False


def stored_episodes(url: str) -> dict[str, list[tuple[int, str, str]]]:
    stored: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for session, seq, episode_id, content in StoreRows(url).query(
        "SELECT session_id, seq, id, content FROM episodes ORDER BY session_id, seq"
    ):
        stored[session].append((seq, episode_id, content))
    return stored


def random_faults(
    rng: random.Random,
    names: list[str],
    live: dict[str, FaultWorker],
    until: float,
    kill_and_restart: Callable[[str], None],
    postgres: bool,
    faults: list[str],
) -> float:
    """Until ``until`` (monotonic), fault a random one of ``names`` every 0.2-1 s; the wall-clock time of the last.

    A fault is a kill -9 and a restart (``kill_and_restart``), a pause (SIGSTOP 0.5-3 s), or, on
    PostgreSQL, its server connections killed; each is logged in ``faults``.
    """
    last_fault = time.time()
    while time.monotonic() < until:
        name = rng.choice(names)
        victim, roll = live[name], rng.random()
        if roll < 0.15:
            kill_and_restart(name)
            faults.append(f"killed -9 and restarted {name}")
        elif not postgres or roll < 0.6:
            pause = rng.uniform(0.5, 3.0)
            victim.signal(signal.SIGSTOP)
            time.sleep(pause)
            victim.signal(signal.SIGCONT)
            faults.append(f"paused {name} {pause:.1f} s")
        else:
            faults.append(f"killed {terminate_backends(name)} connections of {name}")
        last_fault = time.time()
        time.sleep(rng.uniform(0.2, 1.0))
    return last_fault


def drained_by_a_fresh_replica(
    url: str, env: dict[str, str], workers: list[FaultWorker], seconds: float
) -> tuple[int, list[dict[str, Any]]]:
    """A fresh replica delivers what the others left in the retain outbox: the rows left, and what it printed."""
    drainer = FaultWorker(url, "trio", "drainer", **env)
    workers.append(drainer)
    rows = StoreRows(url)
    deadline = time.monotonic() + seconds
    while rows.query("SELECT count(*) FROM retain_outbox")[0][0] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = rows.query("SELECT count(*) FROM retain_outbox")[0][0]
    return left, drainer.exit(30)


# -- 1. a replica frozen inside a transaction that holds its lease row lock -------------------------------

#: How long a call on a session whose lease row is locked by a frozen replica may take to answer.
LOCKED_SESSION_BOUND = 15.0
HEARTBEAT = 0.05


def heartbeat_report(records: list[dict[str, Any]], start: float, end: float) -> tuple[int, float, list[dict]]:
    """Beats acknowledged between ``start`` and ``end`` (wall clock), the longest time without one, the errors."""
    beats = [r for r in records if r["op"] == "beat" and start <= r["at"] and r["at"] + r["latency"] <= end]
    errors = [r for r in records if r["op"] == "beat_error"]
    done = sorted([start, end] + [r["at"] + r["latency"] for r in beats])
    longest = max(later - earlier for earlier, later in itertools.pairwise(done))
    return len(beats), longest, errors


@pytest.mark.parametrize("freeze", ["sigstop-in-transaction", "sigstop-in-renewal", "row-lock-held-by-test"])
def test_a_frozen_replica_holding_a_lease_row_lock_does_not_stall_the_other_replica(pg_url: str, freeze: str) -> None:
    """Replica A freezes holding a lock on its session's lease row; replica B must go on serving.

    ``sigstop-in-transaction``: A (a real engine process) stops itself with
    SIGSTOP in the middle of a write of session ``a-1``, after its lease check
    took ``FOR SHARE`` on the row, inside the open transaction.
    ``sigstop-in-renewal``: A stops itself in a lease renewal, after the
    ``UPDATE`` that extended (and locked) the lease rows of its sessions.
    ``row-lock-held-by-test``: the test emulates that with its own connection
    (``SELECT ... FOR SHARE`` in an open transaction on the row of a session
    ``a-1`` whose owner A was killed).

    While A is frozen: B's heartbeat adds on its own sessions (every 50 ms)
    keep completing, promptly, and none of B's leases lapse; a call on A's
    session (after A's lease expired) answers within ``LOCKED_SESSION_BOUND``
    seconds with a memengine error (SessionBusyError or a StoreError), never
    hangs. Once A's transaction is over (A continued then killed, or the lock
    released), B's call on A's session succeeds; nothing acknowledged is lost.
    """
    ttl = "2.0"
    env = {"MEMENGINE_TEST_LEASE_TTL": ttl, "MEMENGINE_TEST_PASSIVATE_AFTER": "60", "MEMENGINE_TEST_LEASE_WAIT": "5"}
    problems: list[str] = []
    a = b = None
    holder = None
    answer = late = later = None
    try:
        a = FaultWorker(pg_url, "asyncio", "frozen-a", MEMENGINE_TEST_FREEZE_IN_TRANSACTION="1", **env)
        for n in range(1, 4):
            answer = a.ask(10, op="add", session="a-1", contents=[f"a turn {n}"])
            assert answer is not None and answer["op"] == "ack" and answer["seqs"] == [n], answer
        b = FaultWorker(pg_url, "trio", "replica-b", **env)
        b.send(op="heartbeat", sessions=["b-1", "b-2"], interval=HEARTBEAT)
        for _ in range(10):
            assert b.wait_for("beat", timeout=10) is not None, "B's heartbeat never started"

        if freeze.startswith("sigstop"):
            at = "write" if freeze == "sigstop-in-transaction" else "renewal"
            assert a.ask(10, op="freeze", session="a-1", at=at) == {"op": "armed", "session": "a-1"}
            if at == "write":
                a.send(op="add", session="a-1", contents=["a turn 4 (frozen)"])
            assert a.wait_for("freezing", timeout=10) is not None, f"A never reached its {at}"
            deadline = time.monotonic() + 10
            while process_state(a.process.pid) != "T":
                assert time.monotonic() < deadline, "A did not stop"
                time.sleep(0.01)
        else:
            a.signal(signal.SIGKILL)  # dies with its lease on a-1 unreleased
            a.process.wait(10)
            holder = RowLockHolder(pg_url, "a-1")
        frozen_at = time.time()
        assert lease_row_locked(pg_url, "a-1"), "the lease row of a-1 is not locked"

        time.sleep(float(ttl) + 0.5)  # A's lease has expired by now (it was renewed at most ttl ago)
        answer = b.ask(LOCKED_SESSION_BOUND + 1, op="add", session="a-1", contents=["b on a-1 while frozen"])
        asked_until = time.time()
        if answer is None:
            problems.append(f"B's add on a-1 (lease row locked by frozen A) did not answer in {LOCKED_SESSION_BOUND} s")
        elif answer["op"] == "error":
            if answer["error"] not in ("SessionBusyError", "StoreError", "UncertainCommitError"):
                problems.append(f"B's add on a-1 failed with an unexpected error: {answer}")
            if answer["latency"] > LOCKED_SESSION_BOUND:
                problems.append(f"B's add on a-1 took {answer['latency']:.1f} s to fail")
        else:
            problems.append(f"B's add on a-1 succeeded while A's transaction was still open: {answer}")
        time.sleep(1.0)  # B keeps beating meanwhile
        beats, longest, errors = heartbeat_report(b.records, frozen_at, time.time())
        window = time.time() - frozen_at
        if beats < window / HEARTBEAT / 4:
            problems.append(f"B acknowledged only {beats} heartbeat adds in the {window:.1f} s A was frozen")
        if longest > 1.0:
            problems.append(f"B acknowledged no heartbeat add for {longest:.1f} s while A was frozen")
        if errors:
            problems.append(f"B's heartbeat adds failed: {errors[:3]} ({len(errors)} in all)")

        # A's transaction ends: A is continued and killed (or the test's lock released).
        if holder is not None:
            holder.release()
        else:
            a.signal(signal.SIGCONT)
            time.sleep(0.5)
            a.signal(signal.SIGKILL)
            a.process.wait(10)
        if answer is None:
            late = b.wait_for("ack", "error", timeout=LOCKED_SESSION_BOUND)
            problems.append(f"  its answer came {time.time() - asked_until:.1f} s after A's transaction ended: {late}")
        later = b.ask(LOCKED_SESSION_BOUND, op="add", session="a-1", contents=["b on a-1 after the freeze"])
        if later is None or later["op"] != "ack":
            problems.append(f"B's add on a-1 after A's transaction ended did not succeed: {later}")
        time.sleep(0.3)
        b.send(op="exit")
        records_b = b.finish(60)
    finally:
        if holder is not None:
            holder.release()
        for worker in (a, b):
            if worker is not None:
                worker.stop()

    lost = [r for r in records_b if r["op"] == "error" and r["error"] == "LeaseLostError"]
    lost += [r for r in records_b if r["op"] == "beat_error" and r["error"] == "LeaseLostError"]
    if lost:
        problems.append(f"B lost leases: {lost[:3]}")
    # Nothing acknowledged was lost: A's and B's acknowledged adds are all stored.
    stored = stored_episodes(pg_url)
    stored_ids = {episode_id for eps in stored.values() for _, episode_id, _ in eps}
    missing = [r for r in records_b if r["op"] == "beat" and r["id"] not in stored_ids]
    if missing:
        problems.append(f"acknowledged heartbeat adds not stored: {missing[:3]}")
    a_contents = [content for _, _, content in stored["a-1"]]
    # a-1: A's turns; then A's frozen add if its transaction committed after SIGCONT (it held the lease
    # row all along, so nobody wrote a-1 before it); then what B added and was acknowledged, in order.
    base = ["a turn 1", "a turn 2", "a turn 3"]
    b_acked = [
        content
        for reply, content in ((answer or late, "b on a-1 while frozen"), (later, "b on a-1 after the freeze"))
        if reply is not None and reply["op"] == "ack"
    ]
    allowed = [base + b_acked, [*base, "a turn 4 (frozen)", *b_acked]]
    if a_contents not in allowed:
        problems.append(f"a-1 holds {a_contents}, not one of {allowed}")
    if a is not None and len([r for r in a.records if r["op"] == "ack"]) == 4 and "a turn 4 (frozen)" not in a_contents:
        problems.append(f"A acknowledged its frozen add (after SIGCONT) but a-1 holds {a_contents}")
    for session, eps in stored.items():
        if [seq for seq, _, _ in eps] != list(range(1, len(eps) + 1)):
            problems.append(f"{session}: seqs not dense: {[seq for seq, _, _ in eps]}")
    overlaps = lease_overlaps({"frozen-a": a.records if a else [], "replica-b": records_b})
    if overlaps:
        problems.append(f"two owners at once: {overlaps}")
    assert not problems, "\n".join(problems) + f"\n(B asked on a-1 from {frozen_at:.1f} until {asked_until:.1f})"


# -- 2. a takeover that waited for the lease row lock ----------------------------------------------------


@pytest.mark.anyio
async def test_a_takeover_that_waited_for_the_lease_row_lock_gets_a_fresh_lease(pg_url: str) -> None:
    """The lease of S (owner A) has expired; a transaction holds FOR SHARE on its row for 3 s.

    B (lease_ttl 2 s) activates S: its takeover waits for the row lock, then
    must get a lease that runs ``ttl`` from when it was granted, not from when
    it was asked for (already expired after a 3 s wait), so the add succeeds.
    """
    config = SessionConfig(lease_ttl=2.0, lease_wait=10.0, passivate_after=None)
    async with open_engine(pg_url, owner="owner-a", config=config) as a:
        await a.session("S").add([Episode("user", "from A")])
    with psycopg.connect(pg_url, autocommit=True) as conn:  # A died without releasing: its lease has expired
        conn.execute(
            "UPDATE session_leases SET owner = 'owner-a', "
            "expires_at = extract(epoch from clock_timestamp())::float8 - 1 WHERE session_id = 'S'"
        )
    holder = RowLockHolder(pg_url, "S")
    timer = threading.Timer(3.0, holder.release)
    timer.start()
    try:
        with anyio.fail_after(20):
            async with open_engine(pg_url, owner="owner-b", config=config) as b:
                started = time.monotonic()
                try:
                    (stored,) = await b.session("S").add([Episode("user", "from B")])
                except LeaseLostError as exc:
                    pytest.fail(f"B's add after waiting {time.monotonic() - started:.1f} s for the row lock: {exc!r}")
                waited = time.monotonic() - started
                assert stored.seq == 2
                (expires_in,) = StoreRows(pg_url).query(
                    "SELECT expires_at - extract(epoch from clock_timestamp())::float8 FROM session_leases "
                    "WHERE session_id = 'S' AND owner = 'owner-b'"
                )[0]
                assert expires_in > 0.5, f"B's lease expires in {expires_in:.2f} s right after its add"
                assert waited >= 2.0, f"the add did not wait for the row lock ({waited:.2f} s)"
                (again,) = await b.session("S").add([Episode("user", "from B again")])
                assert again.seq == 3
    finally:
        timer.cancel()
        holder.release()
    assert [c for (c,) in StoreRows(pg_url).query("SELECT content FROM episodes ORDER BY seq")] == [
        "from A",
        "from B",
        "from B again",
    ]


# -- 3. the engine's idle connections are dropped by the server --------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("first", ["add", "activate", "context", "recall"])
async def test_calls_after_the_servers_dropped_the_idle_connections_succeed(pg_url: str, first: str) -> None:
    """Every connection of the engine is killed by the server (``pg_terminate_backend``) while idle.

    A failover, a pooler or an idle timeout does this. The next calls, whatever
    comes first (an add to an active session, the first activation of a new
    session, a context read, a recall), must succeed, not raise StoreError.
    """
    app = f"memengine-fault-{uuid.uuid4().hex[:10]}"
    config = SessionConfig(lease_ttl=30.0, passivate_after=None)  # no renewal touches the connection meanwhile
    with anyio.fail_after(60):
        async with open_engine(named(pg_url, app), owner="dropped", config=config) as engine:
            await engine.session("s").add([Episode("user", "first words")])
            assert (await engine.session("s").context()).episodes[0].content == "first words"
            assert await engine.recall("first", all_sessions=True)
            # Each kill waits until its backend has exited: no call below can still reach one.
            killed = await anyio.to_thread.run_sync(terminate_backends, app, 30.0)
            assert killed >= 2, f"killed {killed} connections of the engine (expected the writer and the reader)"
            calls = {
                "add": lambda: engine.session("s").add([Episode("user", "second words")]),
                "activate": lambda: engine.session("new").add([Episode("user", "a new session")]),
                "context": lambda: engine.session("s").context(),
                "recall": lambda: engine.recall("first", all_sessions=True),
            }
            order = [first] + [name for name in calls if name != first]
            failures = []
            for name in order:
                try:
                    await calls[name]()
                except MemEngineError as exc:
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
            assert not failures, f"after the connections were dropped ({first} first):\n" + "\n".join(failures)
            context = await engine.session("s").context()
            assert [e.content for e in context.episodes] == ["first words", "second words"]
            assert [e.content for e in (await engine.session("new").context()).episodes] == ["a new session"]
            hits = await engine.recall("words", all_sessions=True)
            assert sorted(h.episode.content for h in hits) == ["first words", "second words"]


@pytest.mark.anyio
async def test_an_add_succeeds_when_the_new_connection_is_dropped_too(pg_url: str) -> None:
    """The engine's connections are killed, and the first connection made to replace the writer is killed as it is
    made (the chaos soak kills several backends of a replica at once): BEGIN finds it gone too, nothing is in flight,
    and the add goes on a third connection instead of failing with "could not begin a transaction"."""
    app = f"memengine-fault-{uuid.uuid4().hex[:10]}"
    config = SessionConfig(lease_ttl=30.0, passivate_after=None)  # no renewal touches the connections meanwhile
    with anyio.fail_after(60):
        async with open_engine(named(pg_url, app), owner="dropped", config=config) as engine:
            await engine.session("s").add([Episode("user", "first words")])
            store: Any = engine.store
            new_connection = store._new_connection
            made: list[Any] = []

            def dropped_as_it_is_made() -> Any:
                conn = new_connection()
                if not made:
                    pid = conn.info.backend_pid
                    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as killer:
                        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
                        while killer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                            time.sleep(0.01)  # until the server has ended it (the test's deadline bounds this)
                made.append(conn)
                return conn

            store._new_connection = dropped_as_it_is_made
            # Each kill waits until its backend has exited: the add cannot still find its writer alive.
            assert await anyio.to_thread.run_sync(terminate_backends, app, 30.0) >= 1
            (stored,) = await engine.session("s").add([Episode("user", "second words")])
            assert stored.seq == 2
            assert len(made) == 2  # the first replacement was gone too; the second one served
    assert [c for (c,) in StoreRows(pg_url).query("SELECT content FROM episodes ORDER BY seq")] == [
        "first words",
        "second words",
    ]


@pytest.mark.anyio
async def test_leases_are_kept_across_a_dropped_connection(pg_url: str) -> None:
    """The engine's connections are killed while it holds a session; lease renewals come due meanwhile.

    The renewals (every third of ``lease_ttl``) must reach the database over a
    new connection: the session stays this process's, and the next add
    succeeds, without LeaseLostError (or a StoreError).
    """
    app = f"memengine-fault-{uuid.uuid4().hex[:10]}"
    config = SessionConfig(lease_ttl=1.5, lease_wait=5.0, passivate_after=None)
    with anyio.fail_after(60):
        async with open_engine(named(pg_url, app), owner="renewing", config=config) as engine:
            await engine.session("s").add([Episode("user", "before the drop")])
            killed = await anyio.to_thread.run_sync(terminate_backends, app)
            assert killed >= 1
            await anyio.sleep(3.0)  # two ttl's: renewals came due (and the lease lapsed if they failed)
            try:
                (stored,) = await engine.session("s").add([Episode("user", "after the drop")])
            except MemEngineError as exc:
                pytest.fail(f"the add 3 s after the connections were dropped: {type(exc).__name__}: {exc}")
            assert stored.seq == 2
            (owner, expires_in), *_ = StoreRows(pg_url).query(
                "SELECT owner, expires_at - extract(epoch from clock_timestamp())::float8 FROM session_leases "
                "WHERE session_id = 's'"
            )
            assert owner == "renewing" and expires_in > 0, (owner, expires_in)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_replica_waiting_behind_a_held_lease_row_lock_still_exits_in_bounded_time(pg_url: str, backend: str) -> None:
    """A call of replica B waits for a lease row another transaction keeps locked (a frozen replica's).

    Asked to exit meanwhile, B leaves ``open_engine`` within its documented
    bound (``EXIT_STORE_SECONDS`` plus ``retain_grace``, 7 s here; 12 s with
    the process's own start and stop), exits cleanly, and keeps everything it
    had acknowledged.
    """
    b = FaultWorker(pg_url, backend, "stuck-b", MEMENGINE_TEST_LEASE_TTL="2.0", MEMENGINE_TEST_LEASE_WAIT="30")
    holder = None
    try:
        answer = b.ask(10, op="add", session="mine", contents=["acknowledged before"])
        assert answer is not None and answer["op"] == "ack", answer
        with psycopg.connect(pg_url, autocommit=True) as conn:  # a replica that died holding "theirs"
            conn.execute(
                "INSERT INTO session_leases (session_id, owner, token, expires_at) "
                "VALUES ('theirs', 'frozen', 1, extract(epoch from clock_timestamp())::float8 - 1)"
            )
        holder = RowLockHolder(pg_url, "theirs")
        b.send(op="add", session="theirs", contents=["stuck"])
        time.sleep(1.5)
        asked = time.monotonic()
        b.send(op="exit")
        try:
            b.process.wait(timeout=12)
        except subprocess.TimeoutExpired:
            pytest.fail(f"B did not exit within 12 s of being asked, while the lease row stayed locked: {b.stderr()}")
        took = time.monotonic() - asked
        b.finish(5)
        assert took < 12, took
    finally:
        if holder is not None:
            holder.release()
        b.stop()
    assert StoreRows(pg_url).query("SELECT session_id, content FROM episodes WHERE session_id = 'mine'") == [
        ("mine", "acknowledged before")
    ]


# -- 4. chaos: replicas paused and their connections killed at random, with a retain sink ---------------------

#: Seconds the hammer goes on after the faults end, for every replica to recover and acknowledge adds again
#: (a pause lasts up to 3 s; a loaded machine needs more than the 3 s this once was).
CALM_SECONDS = 12.0


@pytest.mark.parametrize(
    "fault_seconds",
    [
        pytest.param(float(os.environ.get("MEMENGINE_TEST_CHAOS_SECONDS", "6")), id="short"),
        pytest.param(
            float(os.environ.get("MEMENGINE_TEST_CHAOS_SOAK_SECONDS", "60")), id="soak", marks=pytest.mark.soak
        ),
    ],
)
def test_replicas_under_random_pauses_and_connection_kills_agree_on_one_truth(
    store_url: str, fault_seconds: float, tmp_path: Path
) -> None:
    """Three replicas hammer 12 shared sessions with a retain sink, while the test, at random,

    pauses one of them (SIGSTOP for 0.5-3 s, then SIGCONT), kills it (kill -9)
    and starts it again under the same name, or, on PostgreSQL, kills its
    server connections (``pg_terminate_backend``), for ``fault_seconds`` (6 s;
    60 s with ``--soak``; ``MEMENGINE_TEST_CHAOS_SECONDS`` sets the short
    run's, ``MEMENGINE_TEST_CHAOS_SOAK_SECONDS`` the soak's: 300 for issue #26's
    5-minute runs). The last CALM_SECONDS are fault-free. The replicas reach the store
    by different paths and one of them forks (issue #26): on SQLite, one opens
    it by a symlink from another directory, one by a relative path and then
    changes directory; on both stores, one forks a child that lives on, idle,
    after its parent is killed. Afterwards (and after a fresh replica drained the
    retain outbox):

    - every replica acknowledged adds again after the last fault (it
      recovered from every pause and every lost connection), and no call
      failed because a connection had been dropped while idle (BEGIN failed);

    - every acknowledged add is stored once, at the seq it was acknowledged
      with; an add that failed in doubt, or was under way in a killed
      process, is stored at most once; nothing else;
    - seqs are dense per session; every read is gap- and overlap-free, and
      no read is stale: it holds every add acknowledged (by any replica)
      before it began;
    - never two owners of a session at once (the lease log);
    - retain: the sink dedupes by ``RetainBatch.key`` (the documented way to
      drop a batch stored but not acknowledged), so a key may come again only
      with the same range and episodes; after that, every stored episode was
      delivered exactly once, and each session's batches came in seq order,
      each starting right after the previous one.
    """
    rng = random.Random(os.environ.get("MEMENGINE_TEST_CHAOS_SEED", "14"))
    env = {
        "MEMENGINE_TEST_RETAIN": "1",
        "MEMENGINE_TEST_RETAIN_EVERY": "3",
        "MEMENGINE_TEST_HAMMER_SESSIONS": "12",
        "MEMENGINE_TEST_LEASE_TTL": "2.0",
        "MEMENGINE_TEST_LEASE_WAIT": "5.0",
    }
    postgres = store_url.startswith("postgresql://")
    pg_url = store_url
    names = [f"chaos-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    backends = dict(zip(names, ["asyncio", "trio", "asyncio"], strict=True))
    workers: list[FaultWorker] = []  # every process started, for the cleanup
    live: dict[str, FaultWorker] = {}
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)  # by owner name, over its incarnations
    killed_tries: set[str] = set()  # ids a killed process was adding: they may or may not be stored
    faults: list[str] = []

    paths = {name: (named(store_url, name) if postgres else store_url, {}) for name in names}
    paths[names[0]][1]["MEMENGINE_TEST_FORK_CHILD"] = "1"  # its child lives on after it is killed
    if not postgres:
        database = Path(store_url)
        (tmp_path / "by-symlink").mkdir()
        (tmp_path / "by-symlink" / "memory.db").symlink_to(database)
        (tmp_path / "elsewhere").mkdir()
        paths[names[1]] = (str(tmp_path / "by-symlink" / "memory.db"), {})
        paths[names[2]] = (
            database.name,
            {
                "MEMENGINE_TEST_OPEN_FROM": str(database.parent),
                "MEMENGINE_TEST_CHDIR_AFTER_OPEN": str(tmp_path / "elsewhere"),
            },
        )

    def start(name: str, seconds: float) -> None:
        url, aliased = paths[name]
        live[name] = FaultWorker(url, backends[name], name, "hammer", seconds, **env, **aliased)
        workers.append(live[name])

    hammer_seconds = fault_seconds + CALM_SECONDS
    try:
        started = time.monotonic()
        for name in names:
            start(name, hammer_seconds)

        def kill_and_restart(name: str) -> None:
            # kill -9, and a new process under the same name (it takes its sessions back at once).
            # Its serving ends when it is killed: another replica may take its sessions the moment it is dead
            # (its lock is proof), before collect() returns, so the time after collect() would show an overlap.
            dead_at = time.time()
            live[name].signal(signal.SIGKILL)
            printed = live[name].collect()
            answered = {r["id"] for r in printed if r["op"] in ("ack", "doubt")}
            killed_tries.update(r["id"] for r in printed if r["op"] == "try" and r["id"] not in answered)
            records[name].extend(printed)
            # Its leases end with it (others may take its sessions at once: store/owners.py).
            ended = {(r["session"], r["token"]) for r in printed if r["op"] == "lease" and r["event"] == "released"}
            records[name].extend(
                {"op": "lease", "event": "released", "session": r["session"], "token": r["token"], "at": dead_at}
                for r in printed
                if r["op"] == "lease" and r["event"] == "taken" and (r["session"], r["token"]) not in ended
            )
            start(name, max(CALM_SECONDS, started + hammer_seconds - time.monotonic()))

        # No fault starts in the last CALM_SECONDS of the first replicas' hammer (a pause then lasts up to 3 s).
        # The first fault kills the replica that forked, once it has: its child lives on, holding copies of
        # its descriptors (the liveness lock file, the database's connections).
        forker = live[names[0]]
        assert forker.wait_for("forked", timeout=60) is not None, forker.stderr()
        kill_and_restart(names[0])
        faults.append(f"killed -9 and restarted {names[0]} (it had forked a child that lives on)")
        last_fault = random_faults(rng, names, live, started + fault_seconds, kill_and_restart, postgres, faults)
        for name, worker in live.items():
            records[name].extend(worker.finish(90))
        # A fresh replica delivers whatever the others left in the retain outbox (a deadline, not a pace: generous).
        left, records["drainer"] = drained_by_a_fresh_replica(pg_url, env, workers, 120)
    finally:
        for worker in workers:
            worker.stop()
        for worker in workers:
            for forked in [r for r in worker.records if r["op"] == "forked"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(forked["pid"], signal.SIGKILL)
    fault_log = "; ".join(faults)
    # Kept for a failure's diagnosis (pytest keeps the last runs' tmp_path): every process's records, in order.
    with (tmp_path / "records.jsonl").open("w") as kept:
        for name, rs in records.items():
            kept.writelines(json.dumps({"process": name, **r}) + "\n" for r in rs)
    fault_log += f" (records: {tmp_path / 'records.jsonl'})"
    everything = [r for rs in records.values() for r in rs]
    acks = [r for r in everything if r["op"] == "ack"]
    doubts = {r["id"]: r for r in everything if r["op"] == "doubt"}
    reads = [r for r in everything if r["op"] == "read"]
    refusals = defaultdict(int)
    for r in everything:
        if r["op"] == "refused":  # (an add in doubt is refused too)
            refusals[r["error"]] += 1
    assert len(acks) > 30, (len(acks), dict(refusals), fault_log)  # the hammer ran (its pace is the machine's)

    stored = stored_episodes(pg_url)
    problems: list[str] = []
    for name in names:
        last_ack = max((r["at"] for r in records[name] if r["op"] == "ack"), default=0.0)
        if last_ack < last_fault + 0.5:
            problems.append(
                f"{name} acknowledged no add after the last fault (its last {last_fault - last_ack:.1f} s before it, "
                f"then: {[r for r in records[name] if r['op'] in ('refused', 'doubt')][-3:]})"
            )
    stored_by_id = {episode_id: (session, seq) for session, eps in stored.items() for seq, episode_id, _ in eps}
    if len(stored_by_id) != sum(len(eps) for eps in stored.values()):
        problems.append("an episode id is stored twice")
    for ack in acks:
        if stored_by_id.get(ack["id"]) != (ack["session"], ack["seq"]):
            problems.append(f"acknowledged add not stored as acknowledged: {ack} -> {stored_by_id.get(ack['id'])}")
    acked_ids = {ack["id"] for ack in acks}
    unexplained = [i for i in stored_by_id if i not in acked_ids and i not in doubts and i not in killed_tries]
    if unexplained:
        problems.append(f"{len(unexplained)} stored episodes nobody added: {unexplained[:3]}")
    for session, eps in stored.items():
        if [seq for seq, _, _ in eps] != list(range(1, len(eps) + 1)):
            problems.append(f"{session}: seqs not dense")
    for read in reads:
        contents = [content for _, _, content in stored[read["session"]]]
        raw, k = read["episodes"], read["summarized_through"]
        if (
            read["covered"] != covered_digest(contents[:k])
            or [seq for seq, _, _ in raw] != list(range(k + 1, k + 1 + len(raw)))
            or [content for _, _, content in raw] != contents[k : k + len(raw)]
        ):
            problems.append(
                f"read with a gap or overlap: {read['session']} k={k}, summary starting {read['summary_start']!r}"
            )
            break
    acked_by_session: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for ack in acks:
        acked_by_session[ack["session"]].append((ack["at"], ack["seq"]))
    for read in reads:
        seen_through = read["episodes"][-1][0] if read["episodes"] else read["summarized_through"]
        missed = [
            seq for at, seq in acked_by_session[read["session"]] if at < read["started_at"] and seq > seen_through
        ]
        if missed:
            problems.append(
                f"stale read of {read['session']}: through seq {seen_through}, acknowledged before: {missed[:5]}"
            )
            break
    overlaps = lease_overlaps({name: rs for name, rs in records.items()})
    if overlaps:
        problems.append(f"two owners at once: {overlaps[:5]}")

    # Retain, as a sink that dedupes by key sees it.
    if left:
        problems.append(f"{left} batches still in the retain outbox after draining")
    # A connection the server dropped while it was idle must not fail a call: nothing was under way
    # (the engine can tell: BEGIN itself failed), so a new connection can simply be used.
    idle_drops = [r for r in everything if r["op"] == "refused" and "could not begin a transaction" in r["message"]]
    if idle_drops:
        problems.append(f"{len(idle_drops)} calls failed on a connection dropped while idle: {idle_drops[:2]}")
    retained = [r for r in everything if r["op"] == "retained"]
    retain_wrong, redelivered = retain_problems(retained, stored, dedupe=True)
    problems.extend(retain_wrong)
    print(
        f"chaos: {len(acks)} acks, {len(doubts)} in doubt, {len(reads)} reads, refusals {dict(refusals)}, "
        f"{len(retained)} batches, {redelivered} redelivered; faults: {fault_log}"
    )
    assert not problems, (
        "\n".join(problems[:20]) + f"\n({len(problems)} problems; {len(acks)} acks, {len(doubts)} in doubt, "
        f"refusals {dict(refusals)}, {redelivered} batches redelivered; faults: {fault_log})"
    )


# -- 5. chaos with erasure: deletes, clears and tenant forgets, and a sink every replica shares -----------

ERASE_CHAOS_SECONDS = float(os.environ.get("MEMENGINE_TEST_CHAOS_SECONDS", "20"))


def test_erasing_replicas_under_chaos_leave_the_sink_no_deleted_episode(pg_url: str) -> None:
    """Three replicas add, read, delete, clear and forget tenants over 12 shared sessions, with faults.

    As in the chaos test above: at random, one replica is paused (SIGSTOP 0.5-3 s), killed
    (kill -9) and started again, or has its server connections killed; the last 6 s are
    fault-free. The sink is the README's DictSink as a table all of them write
    (tests/stale_sink_worker.py). After a fresh replica drained the outbox, the sink holds
    exactly the live episodes: nothing deleted, cleared or forgotten (a stale call landing
    late would show here), and every live episode. ``MEMENGINE_TEST_CHAOS_SECONDS`` sets the
    length (default 20 s).
    """
    from .stale_sink_worker import SINK_TABLE

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SINK_TABLE)
    rng = random.Random(os.environ.get("MEMENGINE_TEST_CHAOS_SEED", "24"))
    env = {
        "MEMENGINE_TEST_SINK_TABLE": "1",
        "MEMENGINE_TEST_RETAIN_EVERY": "2",
        "MEMENGINE_TEST_LEASE_TTL": "2.0",
        "MEMENGINE_TEST_LEASE_WAIT": "5.0",
    }
    names = [f"erase-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    backends = dict(zip(names, ["asyncio", "trio", "asyncio"], strict=True))
    workers: list[FaultWorker] = []
    live: dict[str, FaultWorker] = {}
    records: list[dict[str, Any]] = []
    faults: list[str] = []

    def start(name: str, seconds: float) -> None:
        live[name] = FaultWorker(named(pg_url, name), backends[name], name, "erase", seconds, **env)
        workers.append(live[name])

    try:
        started = time.monotonic()
        for name in names:
            start(name, ERASE_CHAOS_SECONDS)

        def kill_and_restart(name: str) -> None:
            live[name].signal(signal.SIGKILL)
            records.extend(live[name].collect())
            start(name, max(5.0, started + ERASE_CHAOS_SECONDS - time.monotonic()))

        random_faults(rng, names, live, started + ERASE_CHAOS_SECONDS - 6, kill_and_restart, True, faults)
        for worker in live.values():
            records.extend(worker.finish(120))
        left, _ = drained_by_a_fresh_replica(pg_url, env, workers, 120)  # a deadline, not a pace
    finally:
        for worker in workers:
            worker.stop()
    ops = defaultdict(int)
    for record in records:
        ops[record["op"]] += 1
    summary = f"{dict(ops)}; faults: {'; '.join(faults)}"
    print(f"erasure chaos: {summary}")
    assert ops["ack"] > 30 and ops["deleted"] and ops["cleared"] and ops["erased"], summary
    assert left == 0, f"{left} rows left in the retain outbox after draining ({summary})"
    stored = {(session, seq): content for session, seq, _, content in _episodes(pg_url)}
    sink = {(session, seq): content for session, seq, content in StoreRows(pg_url).query("SELECT * FROM sink_episodes")}
    deleted_held = sorted(key for key, content in sink.items() if stored.get(key) != content)
    never_delivered = sorted(key for key in stored if key not in sink)
    assert deleted_held == [], f"the sink holds {len(deleted_held)} deleted episodes: {deleted_held[:5]} ({summary})"
    assert never_delivered == [], f"{len(never_delivered)} live episodes never delivered ({summary})"


def _episodes(url: str) -> list[tuple]:
    return StoreRows(url).query("SELECT session_id, seq, id, content FROM episodes")
