"""Several engine processes, one truth: real processes sharing one store.

Each test runs on PostgreSQL and on one SQLite file; the processes are
``tests/replica_worker.py``, one on asyncio and one on trio. What is checked is
what users and the database see: every acknowledged episode stored exactly
once, dense seqs, reads without gap or overlap, one owner per session at a
time (from the lease log each process prints), and the fate of a killed or
paused owner's writes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from .conftest import StoreRows
from .fakes import covered as covered_by_fold
from .processes import communicate, read_line
from .replica_worker import tagged_by, untagged


def covered(summary: str | None) -> list[str]:
    return covered_by_fold(untagged(summary))


def stored_summaries_by(rows: StoreRows) -> set[str]:
    """The processes whose summaries the store holds."""
    return {tagged_by(summary) for (summary,) in rows.query("SELECT summary FROM summaries")}


ROOT = Path(__file__).resolve().parent.parent
#: Seconds a worker may print nothing while a test waits for its next line: a deadline for a stuck worker, not a pace.
READ_TIMEOUT = 300.0


class Worker:
    """One replica process, its stdout parsed line by line."""

    def __init__(self, store: str, backend: str, name: str, mode: str, seconds: float = 0, **env: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.replica_worker", store, backend, name, mode, str(seconds)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.records: list[dict[str, Any]] = []
        try:
            self.wait_for("ready")
        except BaseException:
            self.stop()  # its pipes closed here, not by the garbage collector during a later test
            raise

    def read(self, timeout: float = READ_TIMEOUT) -> dict[str, Any]:
        try:
            line = read_line(self.process, timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            err = "(its stderr did not end)"
            with contextlib.suppress(subprocess.TimeoutExpired):  # (a child it forked may hold the pipe open)
                err = communicate(self.process, 30)[1][-3000:]
            raise AssertionError(f"{self.name} printed nothing in {timeout} s: {err}") from None
        if not line:
            raise AssertionError(f"{self.name} exited: {self.process.wait()} {self.process.stderr.read()}")  # type: ignore[union-attr]
        record = json.loads(line)
        self.records.append(record)
        return record

    def wait_for(self, op: str) -> dict[str, Any]:
        while True:
            record = self.read()
            if record["op"] == op:
                return record

    def ask(self, **command: Any) -> dict[str, Any]:
        """Send one command; return its answer (skipping lease and summary lines)."""
        self.process.stdin.write(json.dumps(command) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        while True:
            record = self.read()
            if record["op"] not in ("lease", "summarized", "retained", "forgot", "try", "beat", "beat_error"):
                return record

    def finish(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Let the process end on its own (after ``exit`` or its hammer time); return everything it printed."""
        out, err = communicate(self.process, timeout)  # what readline() buffered too
        self.records.extend(json.loads(line) for line in out.splitlines())
        self.logged = err
        assert self.process.returncode == 0, f"{self.name} failed ({self.process.returncode}): {err[-3000:]}"
        assert self.records[-1]["op"] == "exited", err[-3000:]
        return self.records

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.process.wait()

    def pause_outside_a_write(self, store: str) -> None:
        """SIGSTOP this process at a moment it holds no write lock.

        A process frozen inside a write transaction blocks every writer of a SQLite file, and
        makes a PostgreSQL takeover of the rows it locked refuse at once (``SessionBusyError``);
        the tests that pause an owner are about its lease, so they pause it between its writes
        (a renewal or an eviction record may be in flight at any moment).
        """
        for _ in range(200):
            self.process.send_signal(signal.SIGSTOP)
            while Path(f"/proc/{self.process.pid}/stat").read_text().split(")")[-1].split()[0] != "T":
                time.sleep(0.001)  # every thread stopped, not only signalled
            if not write_locked(store):
                return
            self.process.send_signal(signal.SIGCONT)
            time.sleep(0.01)
        raise AssertionError(f"{self.name} held a write lock at every one of 200 tries")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def write_locked(store: str) -> bool:
    """Whether some process holds a write lock a takeover would meet (SQLite's file lock, PostgreSQL's row locks)."""
    if store.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(store) as conn:
            for table in ("session_leases", "sessions"):
                everything = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                free = conn.execute(
                    f"SELECT count(*) FROM (SELECT 1 FROM {table} FOR UPDATE SKIP LOCKED) AS t"
                ).fetchone()
                conn.rollback()
                if everything != free:
                    return True
        return False
    conn = sqlite3.connect(store, timeout=0)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.rollback()
        return False
    except sqlite3.OperationalError as error:
        if "locked" not in str(error) and "busy" not in str(error):
            raise
        return True
    finally:
        conn.close()


def lease_overlaps(records_by_process: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Times two processes served one session at once, from the leases they logged.

    A process serves a session from the moment its lease was taken until it
    stopped serving (logged before it releases the lease), or until ``ttl``
    after it last asked for the lease to be taken or renewed, whichever comes
    first. (The database's own lease interval is a little wider: it holds
    from the commit inside ``activate`` to the commit of the release.)

    Within that, it answers from memory only while its own proof of life holds
    too (``alive`` lease records: ``store.alive_until()`` after each heartbeat; see
    session/lease.py); past it, a read renews the lease first and is answered
    as of that renewal (counted at the moment it was asked for: the store
    confirmed the lease after it, before any other process could take it).
    Where a process logged no ``alive`` record, the proof of life is unbounded.
    """
    taken: dict[tuple[str, int], tuple[str, float]] = {}
    confirmations: dict[tuple[str, int], list[float]] = defaultdict(list)
    ttls: dict[tuple[str, int], float] = {}
    released: dict[tuple[str, int], float] = {}
    released_all: dict[str, float] = {}
    alive: dict[str, list[tuple[float, float, float]]] = defaultdict(list)  # process -> (at, after, until)
    for name, records in records_by_process.items():
        for r in records:
            if r["op"] != "lease":
                continue
            if r["event"] == "alive":
                after = -math.inf if r.get("after") is None else r["after"]
                alive[name].append((r["at"], after, math.inf if r["until"] is None else r["until"]))
            elif r["event"] == "taken":
                lease = (r["session"], r["token"])
                taken[lease] = (name, r["at"])
                confirmations[lease].append(r["asked_at"])
                ttls[lease] = r["ttl"]
            elif r["event"] == "renewed":
                for session, token in r["leases"]:
                    confirmations[(session, token)].append(r["asked_at"])
            elif r["event"] == "released":
                released[(r["session"], r["token"])] = r["at"]
            elif r["event"] == "released_all":
                released_all[name] = r["at"]
    problems = []
    by_session: dict[str, list[int]] = defaultdict(list)
    for session, token in taken:
        by_session[session].append(token)
    for session, tokens in by_session.items():
        tokens.sort()
        for earlier, later in itertools.pairwise(tokens):
            owner, _ = taken[(session, earlier)]
            next_owner, next_at = taken[(session, later)]
            if owner == next_owner:
                continue  # a process re-activating a session it just passivated
            lease = (session, earlier)
            end = min(
                released.get(lease, math.inf),
                released_all.get(owner, math.inf),
                serving_end(sorted(confirmations[lease]), ttls[lease], alive[owner]),
            )
            if end > next_at:
                problems.append(f"{session}: {owner} (token {earlier}) until {end}, {next_owner} from {next_at}")
    return problems


def serving_end(confirmed: list[float], ttl: float, alive: list[tuple[float, float, float]]) -> float:
    """The last moment a lease confirmed at ``confirmed`` (sorted) may have been served from memory.

    From each confirmation, for ``ttl`` (or until the next one), while the
    process's proof of life holds: ``alive`` lists each heartbeat's
    ``(at, after, until)``, and the last one before a moment is in force then
    (memory is served from ``after`` until ``until``). Each confirmation
    itself is a moment served.
    """
    end = confirmed[-1]
    heartbeats = sorted(alive, key=lambda heartbeat: heartbeat[0])
    for start, next_start in zip(confirmed, [*confirmed[1:], math.inf], strict=True):
        stop = min(start + ttl, next_start)
        cursor, after, until = start, -math.inf, math.inf
        for at, its_after, its_until in heartbeats:
            if at <= start:
                after, until = its_after, its_until
                continue
            if at >= stop:
                break
            if min(at, until) > max(cursor, after):
                end = max(end, min(at, until))
            cursor, after, until = at, its_after, its_until
        if min(stop, until) > max(cursor, after):
            end = max(end, min(stop, until))
    return end


def test_the_single_owner_check_counts_a_lease_served_while_both_it_and_its_owners_proof_of_life_hold() -> None:
    """The check the replica tests rest on: it must see an overlap wherever the engine could have served one."""

    def taken(session: str, token: int, at: float) -> dict[str, Any]:
        return {"op": "lease", "event": "taken", "session": session, "token": token, "at": at, "asked_at": at, "ttl": 2}

    def renewed(session: str, token: int, at: float) -> dict[str, Any]:
        return {"op": "lease", "event": "renewed", "leases": [[session, token]], "asked_at": at, "ttl": 2}

    def alive(at: float, until: float | None, after: float | None = None) -> dict[str, Any]:
        return {"op": "lease", "event": "alive", "at": at, "after": after, "until": until}

    b_takes = {"b": [taken("s", 2, 11.5)]}
    # No proof of life logged: the lease counts for its ttl (until 12).
    assert len(lease_overlaps({"a": [taken("s", 1, 10.0)], **b_takes})) == 1
    # Its proof of life lapsed at 11 (reads renew first from then): nothing served after 11.
    assert lease_overlaps({"a": [alive(9.0, 11.0), taken("s", 1, 10.0)], **b_takes}) == []
    # A renewal at 11.2 is a moment served, and still before b took it.
    assert lease_overlaps({"a": [alive(9.0, 11.0), taken("s", 1, 10.0), renewed("s", 1, 11.2)], **b_takes}) == []
    # ...but a heartbeat at 11.3 that proved it alive again makes the lease count again: an overlap.
    a = [alive(9.0, 11.0), taken("s", 1, 10.0), renewed("s", 1, 11.2), alive(11.3, 14.0)]
    assert len(lease_overlaps({"a": a, **b_takes})) == 1
    # No bound logged counts as unbounded: the stricter reading.
    assert len(lease_overlaps({"a": [alive(9.0, 11.0), taken("s", 1, 10.0), alive(10.5, None)], **b_takes})) == 1
    # Taken for dead at 10.5 until 13 (every read renews first meanwhile): nothing served from memory after 10.5.
    assert lease_overlaps({"a": [taken("s", 1, 10.0), alive(10.5, 20.0, after=13.0)], **b_takes}) == []
    # ...but a spell taken for dead that ends before the ttl does lets the lease count again.
    assert len(lease_overlaps({"a": [taken("s", 1, 10.0), alive(10.5, 20.0, after=11.0)], **b_takes})) == 1
    # A release ends it whatever else holds.
    a = [taken("s", 1, 10.0), {"op": "lease", "event": "released", "session": "s", "token": 1, "at": 11.0}]
    assert lease_overlaps({"a": a, **b_takes}) == []


def retain_problems(
    retained: list[dict[str, Any]],
    stored: dict[str, list[tuple[int, str, str]]],
    dedupe: bool,
    not_counted: frozenset[str] = frozenset(),
) -> tuple[list[str], int]:
    """What is wrong with the batches a retain sink was handed (``retained`` records), and how many came again.

    With ``dedupe``, the sink drops a batch whose ``key`` it has seen (the
    documented way to drop a batch stored but not acknowledged): a key may then
    come again, but only with the same range and episodes. Without, a key
    coming twice is a problem. Then every stored episode (``stored``: session
    -> ``(seq, id, content)``) must have been handed on exactly once, each
    session's batches in seq order, each starting right after the previous.
    """
    problems = []
    first_by_key: dict[str, dict[str, Any]] = {}
    redelivered = 0
    for r in sorted(retained, key=lambda r: r["at"]):
        earlier = first_by_key.get(r["key"])
        if earlier is None:
            first_by_key[r["key"]] = r
            continue
        redelivered += 1
        same = (earlier["session"], earlier["first_seq"], earlier["last_seq"], earlier["episodes"]) == (
            r["session"],
            r["first_seq"],
            r["last_seq"],
            r["episodes"],
        )
        if not same or not (dedupe or r["key"] in not_counted):
            problems.append(f"batch {r['key']} delivered again: {earlier} / {r}")
    delivered: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in first_by_key.values():  # in order of first delivery
        delivered[r["session"]].append(r)
    for session in set(stored) | set(delivered):
        eps = stored.get(session, [])
        batches = delivered.get(session, [])
        seqs = [seq for b in batches for seq, _ in b["episodes"]]
        ids = [episode_id for b in batches for _, episode_id in b["episodes"]]
        if seqs != list(range(1, len(eps) + 1)) or ids != [episode_id for _, episode_id, _ in eps]:
            problems.append(
                f"retain of {session}: delivered seqs {seqs} (batches "
                f"{[(b['first_seq'], b['last_seq']) for b in batches]}), stored 1..{len(eps)}"
            )
    return problems, redelivered


def drain_retain_outbox(store: str, env: dict[str, str], timeout: float = 30) -> tuple[list[dict[str, Any]], int]:
    """Start a fresh replica with the printing sink until the retain outbox is empty; its records, batches left."""
    drainer = Worker(store, "trio", "drainer", "serve", **env)
    try:
        rows = StoreRows(store)
        deadline = time.monotonic() + timeout
        while rows.query("SELECT count(*) FROM retain_outbox")[0][0] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = rows.query("SELECT count(*) FROM retain_outbox")[0][0]
        drainer.process.stdin.write(json.dumps({"op": "exit"}) + "\n")  # type: ignore[union-attr]
        drainer.process.stdin.flush()  # type: ignore[union-attr]
        return drainer.finish(), left
    finally:
        drainer.stop()


@pytest.mark.parametrize("retain", [False, True], ids=["no-sink", "retain-sink"])
def test_two_processes_hammering_the_same_sessions_agree_on_one_truth(store_url: str, retain: bool) -> None:
    seconds = 6.0
    # Optionally with a retain sink that prints every batch it is handed (every 5 episodes, and each
    # passivation's tail): every session moves and passivates all the time, so there are many tails.
    env = {"MEMENGINE_TEST_RETAIN": "1"} if retain else {}
    workers = [
        Worker(store_url, "asyncio", "replica-a", "hammer", seconds, **env),
        Worker(store_url, "trio", "replica-b", "hammer", seconds, **env),
    ]
    try:
        records = {worker.name: worker.finish() for worker in workers}
    finally:
        for worker in workers:
            worker.stop()
    drained, left = drain_retain_outbox(store_url, env) if retain else ([], 0)
    everything = [r for rs in records.values() for r in rs]
    acks = [r for r in everything if r["op"] == "ack"]
    reads = [r for r in everything if r["op"] == "read"]
    # (The sink's outbox writes share each process's one connection: about half as many adds get through.)
    assert len(acks) > (100 if retain else 200) and len(reads) > (25 if retain else 50), (len(acks), len(reads))
    # Sessions really moved between the processes.
    owners = defaultdict(set)
    for name, rs in records.items():
        for r in rs:
            if r["op"] == "lease" and r["event"] == "taken":
                owners[r["session"]].add(name)
    assert sum(len(names) == 2 for names in owners.values()) >= 10, dict(owners)

    rows = StoreRows(store_url)
    stored = defaultdict(list)
    for session, seq, episode_id, content in rows.query(
        "SELECT session_id, seq, id, content FROM episodes ORDER BY session_id, seq"
    ):
        stored[session].append((seq, episode_id, content))
    # Every acknowledged episode is stored once, at the seq it was acknowledged with.
    stored_by_id = {episode_id: (session, seq) for session, eps in stored.items() for seq, episode_id, _ in eps}
    assert len(stored_by_id) == sum(len(eps) for eps in stored.values())
    for ack in acks:
        assert stored_by_id.get(ack["id"]) == (ack["session"], ack["seq"]), ack
    assert len(stored_by_id) == len(acks)  # nothing stored that nobody acknowledged
    # Seqs are dense and unique per session.
    for session, eps in stored.items():
        assert [seq for seq, _, _ in eps] == list(range(1, len(eps) + 1)), session
    # Every read: the summary covers episodes 1..k and the raw episodes are exactly k+1.., as stored.
    for read in reads:
        contents = [content for _, _, content in stored[read["session"]]]
        raw = read["episodes"]
        k = read["summarized_through"]
        assert covered(read["summary"]) == contents[:k], read
        assert [seq for seq, _, _ in raw] == list(range(k + 1, k + 1 + len(raw))), read
        assert [content for _, _, content in raw] == contents[k : k + len(raw)], read
    # One owner at a time.
    assert lease_overlaps(records) == []
    if not retain:
        return
    # Exactly-once retain: no fault here, so no redelivery the sink would have to drop, but for one rule:
    retained = [r for r in [*everything, *drained] if r["op"] == "retained"]
    assert left == 0, f"{left} batches still in the retain outbox"
    # A sink call that returned after its process's claim or proof of life could have lapsed is not
    # counted, and its batch goes out again with the same key (retain/delivery.py, the README): on a
    # loaded machine a heartbeat can come late enough. Only a batch its replica said so of may come again.
    not_counted = frozenset(
        key for worker in workers for key in re.findall(r"returned batch '([^']+)' after this process", worker.logged)
    )
    problems, _ = retain_problems(retained, stored, dedupe=False, not_counted=not_counted)
    assert problems == [], "\n".join(problems[:20])


def test_deletes_and_clears_from_either_replica_reach_the_sink_once_in_order(store_url: str) -> None:
    """add 10 on one replica / retain / delete 3 on the other / clear on the first: whoever delivers."""
    env = {"MEMENGINE_TEST_RETAIN": "1", "MEMENGINE_TEST_RETAIN_EVERY": "10"}
    rows = StoreRows(store_url)

    def handed_on(through: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (recorded,) = rows.query("SELECT retained_through FROM sessions WHERE session_id = 's'") or [(0,)]
            if recorded[0] >= through and rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]:
                return
            time.sleep(0.02)
        raise AssertionError(f"not delivered: {rows.query('SELECT id, mode, last_seq FROM retain_outbox')}")

    a = Worker(store_url, "asyncio", "replica-a", "serve", **env)
    b = Worker(store_url, "trio", "replica-b", "serve", **env)
    try:
        assert a.ask(op="add", session="s", contents=[f"turn {i}" for i in range(1, 11)])["op"] == "ack"
        handed_on(10)
        assert b.ask(op="delete", session="s", seqs=[2, 5, 7]) == {"op": "deleted", "session": "s", "deleted": 3}
        handed_on(10)
        assert a.ask(op="clear", session="s") == {"op": "cleared", "session": "s"}
        handed_on(10)
        for worker in (a, b):
            worker.process.stdin.write(json.dumps({"op": "exit"}) + "\n")  # type: ignore[union-attr]
            worker.process.stdin.flush()  # type: ignore[union-attr]
        records = [r for worker in (a, b) for r in worker.finish()]
    finally:
        a.stop()
        b.stop()
    calls = sorted((r for r in records if r["op"] in ("retained", "forgot")), key=lambda r: r["at"])
    assert [
        ("retain", [seq for seq, _ in r["episodes"]]) if r["op"] == "retained" else ("forget", r["seqs"]) for r in calls
    ] == [("retain", list(range(1, 11))), ("forget", [2, 5, 7]), ("forget", None)], "\n".join(map(str, records))
    assert len({r["key"] for r in calls}) == 3


def test_a_killed_owner_is_taken_over_at_once_and_nothing_acknowledged_is_lost(store_url: str) -> None:
    # A lease far longer than the test: the heir can only take over because the owner's liveness lock
    # died with it (store/owners.py).
    env = {"MEMENGINE_TEST_LEASE_TTL": "60", "MEMENGINE_TEST_SUMMARY_DELAY": "3600"}  # its summary never ends
    owner = Worker(store_url, "asyncio", "doomed", "serve", **env)
    try:
        for n in range(1, 8):
            assert owner.ask(op="add", session="s", contents=[f"turn {n}"])["seqs"] == [n]
        killed_at = time.time()
        owner.kill()  # kill -9, with a summary of turns 1..3 in flight
    finally:
        owner.stop()
    heir = Worker(store_url, "trio", "heir", "serve", MEMENGINE_TEST_LEASE_TTL="60")
    try:
        context = heir.ask(op="context", session="s", wait=True)
        assert context["op"] == "context", context
        assert covered(context["summary"]) + [c for _, _, c in context["episodes"]] == [
            f"turn {n}" for n in range(1, 8)
        ]
        # Long before the lease (renewed at most 20 s before the kill) could have expired.
        # The heir's token is the next after the owner's last: the owner may have let the session go and
        # taken it again between its adds, when they came more than passivate_after (0.05 s) apart.
        owned = [r["token"] for r in owner.records if r["op"] == "lease" and r["event"] == "taken"]
        (taken,) = [r for r in heir.records if r["op"] == "lease" and r["event"] == "taken"]
        assert taken["token"] == owned[-1] + 1 and taken["at"] - killed_at < 15, (taken, owned, killed_at)
        assert heir.ask(op="add", session="s", contents=["turn 8"])["seqs"] == [8]
        heir.ask(op="exit")
        heir.finish()
    finally:
        heir.stop()
    rows = StoreRows(store_url)
    assert rows.query("SELECT seq, content FROM episodes ORDER BY seq") == [(n, f"turn {n}") for n in range(1, 9)]
    # The killed owner's summary never landed: every stored summary is one the heir computed.
    assert stored_summaries_by(rows) == {"heir"}


def test_a_paused_owner_cannot_write_after_its_lease_expired_and_gives_the_session_up(store_url: str) -> None:
    ttl = "1.0"
    # lease_wait 0: once it has given the session up, its next call does not wait for the idle heir to
    # hand the session over (store/handover.py) but reports it busy at once.
    paused = Worker(
        store_url,
        "trio",
        "paused",
        "serve",
        MEMENGINE_TEST_LEASE_TTL=ttl,
        MEMENGINE_TEST_SUMMARY_DELAY="1.5",
        MEMENGINE_TEST_LEASE_WAIT="0",
    )
    heir = None
    try:
        for n in range(1, 6):
            assert paused.ask(op="add", session="s", contents=[f"turn {n}"])["seqs"] == [n]
        paused.pause_outside_a_write(store_url)  # mid-summary, holding the lease
        time.sleep(2.0)  # past its lease
        # The heir keeps the session (no passivation) while the paused owner comes back.
        heir = Worker(
            store_url, "asyncio", "heir", "serve", MEMENGINE_TEST_LEASE_TTL=ttl, MEMENGINE_TEST_PASSIVATE_AFTER="60"
        )
        assert heir.ask(op="add", session="s", contents=["from the heir"])["seqs"] == [6]
        paused.kill(signal.SIGCONT)
        time.sleep(2.0)  # its summary call ends and tries to store; its renewal runs
        answer = paused.ask(op="add", session="s", contents=["from the paused owner"])
        assert answer["op"] == "error" and answer["error"] in ("LeaseLostError", "SessionBusyError"), answer
        assert "heir" in answer["message"] or "lease" in answer["message"], answer
        assert paused.ask(op="active", session="s")["active"] is False
        context = heir.ask(op="context", session="s", wait=True)
        everything = covered(context["summary"]) + [c for _, _, c in context["episodes"]]
        assert everything == [f"turn {n}" for n in range(1, 6)] + ["from the heir"]
        for worker in (paused, heir):
            worker.ask(op="exit")
            worker.finish()
    finally:
        paused.kill(signal.SIGCONT) if paused.process.poll() is None else None
        paused.stop()
        if heir is not None:
            heir.stop()
    rows = StoreRows(store_url)
    assert [content for (content,) in rows.query("SELECT content FROM episodes ORDER BY seq")] == [
        *(f"turn {n}" for n in range(1, 6)),
        "from the heir",
    ]
    # The paused owner's summary, whether it finished (and was refused) or was cancelled when the
    # owner gave the session up, never landed: every stored summary is one the heir computed.
    assert stored_summaries_by(rows) == {"heir"}


@pytest.mark.parametrize("attempt", range(3))
def test_processes_opening_a_fresh_database_at_once_all_start(store_url: str, attempt: int) -> None:
    start_at = time.time() + 1.0
    script = (
        "import sys, time, anyio\n"
        "from memengine import Episode, open_engine\n"
        "async def main(store, name, start_at):\n"
        "    time.sleep(max(0.0, start_at - time.time()))\n"
        "    async with open_engine(store, owner=name) as engine:\n"
        "        await engine.session(name).add([Episode('user', 'hello from ' + name)])\n"
        "    print('ok', flush=True)\n"
        "anyio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]), backend=sys.argv[4])\n"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, store_url, f"boot-{n}", str(start_at), backend],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n, backend in enumerate(["asyncio", "trio", "asyncio"])
    ]
    outcomes = [process.communicate(timeout=60) for process in processes]
    for process, (out, err) in zip(processes, outcomes, strict=True):
        assert process.returncode == 0 and out.strip() == "ok", err[-3000:]
    rows = StoreRows(store_url)
    assert sorted(rows.query("SELECT session_id, content FROM episodes")) == [
        (f"boot-{n}", f"hello from boot-{n}") for n in range(3)
    ]
