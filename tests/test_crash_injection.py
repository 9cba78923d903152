"""Crash injection: a seeded random workload in a child process, killed with SIGKILL at a random point.

For each seed, ``tests/crash_workload.py`` runs a random mix of adds (single,
multi, idempotent re-adds, duplicate ids in one batch, adds cancelled by a
timeout and retried, the same add from two tasks), reads (with and without
``wait_for_summary``, with timeouts), deletes, clears and closes over three
sessions, with a summarizer and a retain sink that sleep and fail at random.
The test reads the child's numbered stdout log and kills it with SIGKILL after
a random number of lines (or a while after it finished), then:

1. replays the log into a model of what was acknowledged: every acknowledged
   add's seqs (a new id gets a seq above every seq the session ever had; a
   stored id gets its stored seq), every delete's count, and every read's
   no-gap/no-overlap coverage at the moment it was made;
2. reads the database the killed process left: every acknowledged live
   episode is there with its seq, id and content, nothing deleted or cleared
   is, and an operation that was begun but not acknowledged either happened
   completely or not at all (at most one per session is in flight);
3. reopens the database in-process (on the ``anyio_backend`` under test, with
   a fold summarizer and a recording sink): summaries left pending by the
   crash are made without any client touching the session; every stored
   summary covers exactly the live episodes up to its ``through_seq``; a
   ``context(wait_for_summary=True)`` shows the summary and raw episodes with
   no gap and no overlap; ``recall`` finds every live episode and no deleted
   one; re-adding an episode returns its stored seq, and a new one gets a seq
   above every seq ever used;
4. after the restarted engine exits: the union of the killed run's side file
   and the recording sink delivers every live episode, in order per session,
   at least once; after de-duplicating by batch key nothing is delivered
   twice (a key may only be re-sent while its delivery was never recorded:
   the last batch of a session the killed run's sink stored); the same key
   always names the same range; nothing is delivered by a sink call that
   started after its deletion was acknowledged; the outbox is empty.

``MEMENGINE_SOAK`` (an integer, default 1) multiplies the number of seeds:
``MEMENGINE_SOAK=10 pytest tests/test_crash_injection.py`` runs 100 seeds,
each on both backends. A failing case is named by its seed (and backend); its
message carries the seed, the kill point and the tail of the child's log, and
``python -m tests.crash_workload DB SEED STEPS`` replays the workload (timing,
and so the interleaving, varies from run to run).

This test found two retain bugs (STALE_OUTBOX_SNAPSHOT and OUTBOX_ROWID_REUSE
below), now fixed; their reproducers at the end of this file guard against a
return. ``TOLERATE_KNOWN_BUGS`` (false) would report a soak case showing only
their symptoms as xfailed instead of failing.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .crash_workload import RESTARTED_OWNER, SESSIONS, config_for, token
from .fakes import RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
SOAK = int(os.environ.get("MEMENGINE_SOAK", "1"))
SEEDS = range(10 * SOAK)
STEPS = 40  # rounds of the workload; a round prints about four lines
CHILD_TIMEOUT = 60.0  # a child still running then is hung
RESTART_TIMEOUT = 30.0  # the restarted engine must finish its checks by then


# -- the child run -----------------------------------------------------------


@dataclass
class ChildRun:
    seed: int
    backend: str
    kill_plan: str
    lines: list[dict]
    returncode: int
    stderr_tail: str

    def describe(self, tail: int = 20) -> str:
        header = (
            f"\n[seed={self.seed} parent backend={self.backend} {self.kill_plan}; "
            f"{len(self.lines)} lines; replay: python -m tests.crash_workload DB {self.seed} {STEPS}]"
        )
        if not tail:
            return header
        shown = "\n".join(json.dumps(line, ensure_ascii=False) for line in self.lines[-tail:])
        return f"{header}\nlast lines of the child:\n{shown}\nchild stderr (tail):\n{self.stderr_tail}"


def run_child_until_killed(db_path: Path, seed: int, backend: str, *, after_done: bool = False) -> ChildRun:
    """Run the workload, SIGKILL it at a random point, and return every complete line it printed."""
    rng = random.Random(f"kill-{seed}-{backend}")
    if rng.random() < 0.85 and not after_done:
        kill_after: int | None = rng.randint(1, STEPS * 4)
        delay = rng.choice([0, 0, 0.0005, 0.002, 0.01, 0.03])
        plan = f"kill after line {kill_after} + {delay}s"
    else:
        kill_after, delay = None, rng.uniform(0, 0.25)
        plan = f"kill {delay:.3f}s after done"
    raw: list[str] = []
    hung = threading.Event()
    stderr_path = db_path.with_name(db_path.name + ".stderr")
    with (
        open(stderr_path, "w", encoding="utf-8") as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "tests.crash_workload", str(db_path), str(seed), str(STEPS)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
        ) as child,
    ):
        assert child.stdout is not None

        def watchdog() -> None:
            hung.set()
            child.kill()

        timer = threading.Timer(CHILD_TIMEOUT, watchdog)
        timer.start()
        try:
            for line in child.stdout:
                raw.append(line)
                if (kill_after is not None and len(raw) >= kill_after) or '"op": "done"' in line:
                    time.sleep(delay)
                    break
        finally:
            timer.cancel()
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            raw.extend(child.stdout.readlines())  # everything it printed before it died
            child.wait(timeout=30)
    stderr_tail = stderr_path.read_text(encoding="utf-8", errors="replace")[-3000:]
    # A line cut short by the kill was never acknowledged (its operation is in flight).
    lines = [json.loads(line) for line in raw if line.endswith("\n")]
    run = ChildRun(seed, backend, plan, lines, child.returncode, stderr_tail)
    assert not hung.is_set(), "the child hung" + run.describe()
    assert child.returncode == -signal.SIGKILL, f"the child exited by itself ({child.returncode})" + run.describe()
    for index, line in enumerate(lines):
        assert line["i"] == index, f"line {index} is numbered {line['i']}" + run.describe()
    return run


# -- the model of what was acknowledged ----------------------------------------


@dataclass
class SessionModel:
    live: dict[int, tuple[str, str]] = field(default_factory=dict)  # seq -> (id, content)
    max_seq: int = 0  # the highest seq any acknowledgement showed
    dead: dict[int, float] = field(default_factory=dict)  # seq -> index of the line that acknowledged its removal
    pending: dict[int, dict] = field(default_factory=dict)  # op number -> its "begin" line, until acknowledged
    contents: dict[str, str] = field(default_factory=dict)  # every id ever begun -> its content

    def live_ids(self) -> dict[str, int]:
        return {episode_id: seq for seq, (episode_id, _) in self.live.items()}

    def expected_context(self, through: int) -> tuple[list[str], list[tuple[int, str, str]]]:
        """What a summary through ``through`` covers, and the raw episodes after it."""
        ordered = sorted(self.live.items())
        summarized = [content for seq, (_, content) in ordered if seq <= through]
        raw = [(seq, episode_id, content) for seq, (episode_id, content) in ordered if seq > through]
        return summarized, raw


def evicted_count(contents: list[str], config: SessionConfig) -> int:
    """How many of the oldest raw episodes have left the window (the newest that fit stay)."""
    count = chars = 0
    index = len(contents)
    while index > 0 and count < config.max_episodes:
        if chars + len(contents[index - 1]) > config.max_chars:
            break
        count += 1
        chars += len(contents[index - 1])
        index -= 1
    return index


def check_context(
    model: SessionModel, config: SessionConfig, summary, through: int, evicted_through: int, raw, where: str
) -> None:
    """No gap, no overlap: the summary covers exactly the live episodes up to ``through``, raw the rest."""
    summarized, expected_raw = model.expected_context(through)
    assert covered(summary) == summarized, f"{where}: the summary through {through} covers the wrong episodes"
    assert [tuple(episode) for episode in raw] == expected_raw, f"{where}: raw episodes are not the live ones after it"
    assert evicted_through >= through, f"{where}: evicted_through {evicted_through} < summarized_through {through}"
    pending = sum(1 for episode in raw if episode[0] <= evicted_through)
    # The window fits its bounds; it may hold fewer than would fit, as evicted stays evicted
    # (after a delete, the window does not refill from below the stored boundary).
    window = [episode[2] for episode in raw if episode[0] > evicted_through]
    assert len(window) <= config.max_episodes and sum(map(len, window)) <= config.max_chars, f"{where}: over budget"
    assert pending >= evicted_count([episode[2] for episode in raw], config), f"{where}: the window is wrong"


def replay(run: ChildRun, config: SessionConfig) -> dict[str, SessionModel]:
    """Check every acknowledgement against the ones before it; return the acknowledged state."""
    models = {session: SessionModel() for session in SESSIONS}
    for line in run.lines:
        op, index = line["op"], line["i"]
        where = f"line {index} ({op})" + run.describe()
        model = models.get(line.get("session", ""))
        if op == "begin":
            assert model is not None
            model.pending[line["n"]] = line
            model.contents.update(zip(line.get("ids", ()), line.get("contents", ()), strict=True))
        elif op == "add":
            assert model is not None
            begin = model.pending.pop(line["n"], None) or {}
            assert line["ids"] == begin.get("ids", line["ids"]), f"add returned other ids: {where}"
            assert line["contents"] == begin.get("contents", line["contents"]), f"add returned other contents: {where}"
            for episode_id, content, seq in zip(line["ids"], line["contents"], line["seqs"], strict=True):
                stored = model.live_ids().get(episode_id)
                if stored is not None:
                    assert seq == stored, f"re-adding {episode_id} gave seq {seq}, not its stored {stored}: {where}"
                else:
                    assert seq > model.max_seq, f"new seq {seq} not above every earlier seq {model.max_seq}: {where}"
                    model.live[seq] = (episode_id, content)
                    model.max_seq = seq
        elif op == "delete":
            assert model is not None
            model.pending.pop(line["n"], None)
            existed = {seq for seq in line["seqs"] if seq in model.live}
            assert line["count"] == len(existed), f"delete counted {line['count']}, {len(existed)} were live: {where}"
            for seq in existed:
                del model.live[seq]
                model.dead[seq] = index
        elif op == "clear":
            assert model is not None
            model.pending.pop(line["n"], None)
            for seq in model.live:
                model.dead[seq] = index
            model.live.clear()
        elif op == "read":
            assert model is not None
            assert not model.pending, f"a read overlapped a mutation of its session: {where}"
            check_context(
                model,
                config,
                line["summary"],
                line["summarized_through"],
                line["evicted_through"],
                line["episodes"],
                f"read at {where}",
            )
            if line["wait"]:
                assert line["evicted_through"] == line["summarized_through"], f"waited, still pending: {where}"
        else:
            assert op in ("add_cancelled", "close", "read_timeout", "read_summary_failed", "done"), (
                f"unknown line: {where}"
            )
    return models


def stored_rows(db_path: Path, sql: str, *params: object) -> list[tuple]:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def resolve_in_flight(run: ChildRun, models: dict[str, SessionModel], db_path: Path) -> None:
    """Compare the killed process's database with the model; fold in-flight operations that happened."""
    stored: dict[str, dict[int, tuple[str, str]]] = defaultdict(dict)
    for session, seq, episode_id, content in stored_rows(db_path, "SELECT session_id, seq, id, content FROM episodes"):
        assert session in models, f"an episode of unknown session {session!r}" + run.describe()
        stored[session][seq] = (episode_id, content)
    for session, model in models.items():
        where = f"session {session!r} after the kill" + run.describe()
        found = stored[session]
        kinds = {begin["kind"] for begin in model.pending.values()}
        assert len(kinds) <= 1, f"test bug: several kinds of operations in flight: {model.pending}"
        begin = next(iter(model.pending.values()), {"kind": None})
        if begin["kind"] == "delete":
            wanted = {seq for seq in begin["seqs"] if seq in model.live}
            if wanted and wanted.isdisjoint(found):  # it happened: all of it
                for seq in wanted:
                    del model.live[seq]
                    model.dead[seq] = math.inf
        elif begin["kind"] == "clear" and not found:  # it happened
            for seq in model.live:
                model.dead[seq] = math.inf
            model.live.clear()
        lost = {seq: model.live[seq] for seq in model.live if found.get(seq) != model.live[seq]}
        assert not lost, f"acknowledged episodes lost or changed (or part of a delete in flight): {lost}; {where}"
        extra = {seq: found[seq] for seq in found if seq not in model.live}
        if extra and begin["kind"] == "add":
            # The add in flight happened: all of its new episodes, in order, above every earlier seq.
            assert all(b["ids"] == begin["ids"] for b in model.pending.values()), "test bug: different adds in flight"
            live_ids = model.live_ids()
            new_ids = list(dict.fromkeys(i for i in begin["ids"] if i not in live_ids))
            got = [found[seq] for seq in sorted(extra)]
            assert got == [(i, model.contents[i]) for i in new_ids], f"not what the add in flight holds: {where}"
            assert min(extra) > model.max_seq, f"the add in flight reused a seq: {extra}; {where}"
            model.live.update(extra)
            model.max_seq = max(extra)
        else:
            assert not extra, f"episodes no add explains (deleted ones back?): {extra}; {where}"


def dead_contents(model: SessionModel) -> set[str]:
    live = {content for _, content in model.live.values()}
    return {content for content in model.contents.values() if content not in live}


# -- the restart ------------------------------------------------------------------


async def wait_for_pending_summaries(db_path: Path, config: SessionConfig) -> None:
    """Poll the file until no session has evicted episodes without a summary (no client asks)."""

    def pending() -> list[str]:
        sessions = []
        for (session,) in stored_rows(db_path, "SELECT session_id FROM sessions"):
            rows = stored_rows(
                db_path,
                "SELECT content FROM episodes WHERE session_id = ? AND seq > "
                "coalesce((SELECT max(through_seq) FROM summaries WHERE session_id = ?), 0) ORDER BY seq",
                session,
                session,
            )
            if evicted_count([content for (content,) in rows], config):
                sessions.append(session)
        return sessions

    while True:
        if not await anyio.to_thread.run_sync(pending):
            return
        await anyio.sleep(0.01)


def check_stored_summaries(run: ChildRun, models: dict[str, SessionModel], db_path: Path) -> None:
    for session, through, summary in stored_rows(db_path, "SELECT session_id, through_seq, summary FROM summaries"):
        model = models[session]
        where = f"stored summary of {session!r} through {through}" + run.describe()
        leaked = set(covered(summary)) & dead_contents(model)
        assert not leaked, f"deleted content in a {where}: {sorted(leaked)}"
        assert covered(summary) == model.expected_context(through)[0], f"a {where} covers the wrong episodes"


async def check_recall(run: ChildRun, engine, models: dict[str, SessionModel]) -> None:
    live = {
        content.split()[0]: (session, seq, content)
        for session, model in models.items()
        for seq, (_, content) in model.live.items()
    }
    words = sorted(live)
    for start in range(0, len(words), 40):
        chunk = words[start : start + 40]
        hits = await engine.recall(" ".join(chunk), all_sessions=True, limit=1000)
        assert {(hit.session_id, hit.episode.seq, hit.episode.content) for hit in hits} == {
            live[word] for word in chunk
        }, "recall does not find exactly the live episodes" + run.describe()
    dead = sorted({content.split()[0] for model in models.values() for content in dead_contents(model)})
    for start in range(0, len(dead), 40):
        hits = await engine.recall(" ".join(dead[start : start + 40]), all_sessions=True, limit=1000)
        found = [(hit.session_id, hit.episode.seq, hit.episode.content) for hit in hits]
        assert not found, f"recall finds deleted episodes: {found}" + run.describe()


async def restart_and_check(run: ChildRun, models: dict[str, SessionModel], db_path: Path, config: SessionConfig):
    """Reopen the database; check summaries, contexts and recall; add after the crash. Return the sink."""
    sink = RecordingSink()
    fresh: dict[str, tuple[int, str, str]] = {}
    async with open_engine(
        db_path,
        summarizer=RecordingSummarizer(),
        retain_sink=sink,
        config=config,
        retain_grace=RESTART_TIMEOUT,
        owner=RESTARTED_OWNER,
    ) as engine:
        await wait_for_pending_summaries(db_path, config)
        check_stored_summaries(run, models, db_path)
        for session, model in models.items():
            context = await engine.session(session).context(wait_for_summary=True)
            where = f"context of {session!r} after restart" + run.describe()
            raw = [(e.seq, e.id, e.content) for e in context.episodes]
            check_context(
                model, config, context.summary, context.summarized_through, context.evicted_through, raw, where
            )
            assert context.evicted_through == context.summarized_through, f"summary still pending: {where}"
            (latest,) = stored_rows(
                db_path, "SELECT coalesce(max(through_seq), 0) FROM summaries WHERE session_id = ?", session
            )
            assert context.summarized_through == latest[0], f"the context is not the stored summary: {where}"
        await check_recall(run, engine, models)
        index = 10**6
        for session, model in models.items():
            handle = engine.session(session)
            where = f"adding to {session!r} after restart" + run.describe()
            if model.live:
                seq, (episode_id, content) = max(model.live.items())
                (again,) = await handle.add([Episode("user", content, id=episode_id)])
                assert (again.seq, again.content) == (seq, content), f"a re-add stored {episode_id} again: {where}"
            used = max([model.max_seq, *model.dead, *model.live], default=0)
            index += 1
            (new,) = await handle.add([Episode("user", f"{token(run.seed, SESSIONS.index(session), index)} after")])
            assert new.seq is not None and new.seq > used, f"seq {new.seq} reused (seqs up to {used} used): {where}"
            fresh[session] = (new.seq, new.id, new.content)
            model.contents[new.id] = new.content
    return sink, fresh


# -- retain ----------------------------------------------------------------------------


@dataclass
class Delivery:
    run: int  # 1: the killed process (side file), 2: the restarted engine
    key: str
    session: str
    first_seq: int
    last_seq: int
    mode: str
    episodes: list[tuple[int, str, str]]
    lines_before: float  # stdout lines printed when the sink was called (run 2: after all of them)


def deliveries(db_path: Path, sink: RecordingSink) -> list[Delivery]:
    found = []
    side_file = Path(str(db_path) + ".sink")
    if side_file.exists():
        for line in side_file.read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.endswith("\n"):
                continue  # cut short by the kill: never stored
            r = json.loads(line)
            episodes = [tuple(e) for e in r["episodes"]]
            found.append(
                Delivery(
                    1, r["key"], r["session"], r["first_seq"], r["last_seq"], r["mode"], episodes, r["lines_before"]
                )
            )
    for b in sink.batches:
        episodes = [(e.seq, e.id, e.content) for e in b.episodes]
        found.append(Delivery(2, b.key, b.session_id, b.first_seq, b.last_seq, b.mode, episodes, math.inf))
    return found


@dataclass
class KnownBugs:
    """Symptoms of the two retain bugs this test found (see the xfail tests at the end)."""

    handed_on_after_deletion: list[str] = field(default_factory=list)  # STALE_OUTBOX_SNAPSHOT
    never_delivered: list[str] = field(default_factory=list)  # OUTBOX_ROWID_REUSE

    def __bool__(self) -> bool:
        return bool(self.handed_on_after_deletion or self.never_delivered)

    def __str__(self) -> str:
        return "\n".join(self.handed_on_after_deletion + self.never_delivered)


def check_retain(
    run: ChildRun, models: dict[str, SessionModel], fresh: dict[str, tuple[int, str, str]], batches: list[Delivery]
) -> KnownBugs:
    """Check every delivery; return the symptoms of the known bugs (every other violation fails at once)."""
    known = KnownBugs()
    ranges: dict[str, tuple[str, int, int]] = {}
    first_version: dict[str, set[tuple[int, str, str]]] = {}
    per_session: dict[str, list[Delivery]] = defaultdict(list)
    for b in batches:
        where = f"run {b.run} delivery {b.key} of {b.session!r} {b.first_seq}..{b.last_seq}" + run.describe()
        assert b.mode == "append", where
        seqs = [episode[0] for episode in b.episodes]
        assert seqs, f"an empty batch: {where}"
        assert seqs == sorted(set(seqs)) and b.first_seq <= seqs[0] and seqs[-1] <= b.last_seq, f"bad batch: {where}"
        # The same key always names the same range, and a re-sent batch only ever loses deleted episodes.
        named = ranges.setdefault(b.key, (b.session, b.first_seq, b.last_seq))
        assert named == (b.session, b.first_seq, b.last_seq), f"the key named {named} before: {where}"
        earlier = first_version.setdefault(b.key, set(b.episodes))
        assert set(b.episodes) <= earlier, f"a re-sent batch has episodes the first sending lacked: {where}"
        per_session[b.session].append(b)
        model = models[b.session]
        for seq, episode_id, content in b.episodes:
            assert model.contents.get(episode_id) == content, f"delivered an unknown episode {episode_id}: {where}"
            removed = model.dead.get(seq)
            if removed is not None and removed < b.lines_before:
                known.handed_on_after_deletion.append(
                    f"{b.session!r} seq {seq} handed on by a sink call that started at line {b.lines_before}, "
                    f"after line {removed} acknowledged its deletion (run {b.run} batch {b.first_seq}..{b.last_seq})"
                )
            if b.run == 2:
                assert seq in model.live or fresh[b.session][0] == seq, f"delivered a removed seq {seq}: {where}"

    delivered: dict[str, dict[int, tuple[str, str]]] = defaultdict(dict)
    for session, sent in per_session.items():
        where = f"deliveries of {session!r}: {[(b.run, b.first_seq, b.last_seq) for b in sent]}" + run.describe()
        keys: list[str] = []
        for b in sent:
            if keys and keys[-1] == b.key:
                continue  # sent again, never recorded as delivered
            assert b.key not in keys, f"{b.key} re-sent after a later batch went out: {where}"
            keys.append(b.key)
        run_1 = [b.key for b in sent if b.run == 1]
        run_2 = [b.key for b in sent if b.run == 2]
        assert len(run_2) == len(set(run_2)), f"the restarted run sent a batch twice: {where}"
        # Only the killed run's last stored batch of a session can lack its delivery record.
        resent = [key for key in run_2 if key in run_1]
        last_of_run_1 = run_1[-1:]
        assert resent in ([], last_of_run_1), f"the restart re-sent batches whose delivery was recorded: {where}"
        assert not resent or run_2[0] == resent[0], f"the re-sent batch did not go first: {where}"
        # In order, and each seq under one key only.
        spans = [ranges[key][1:] for key in keys]
        assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), f"out of order or overlap: {where}"
        for b in sent:
            for seq, episode_id, content in b.episodes:
                delivered[session][seq] = (episode_id, content)

    for session, model in models.items():
        expected = dict(model.live)
        expected[fresh[session][0]] = fresh[session][1:]
        wrong = {seq: e for seq, e in expected.items() if delivered[session].get(seq) not in (None, e)}
        assert not wrong, f"live episodes of {session!r} delivered with other ids or contents: {wrong}" + run.describe()
        missing = sorted(seq for seq in expected if seq not in delivered[session])
        if missing:
            known.never_delivered.append(f"live episodes of {session!r} never delivered: seqs {missing}")
    if known.never_delivered:
        # OUTBOX_ROWID_REUSE needs a delivery whose outbox row clear/delete dropped: a batch the
        # killed run handed on although every episode in it was removed. Without one, a loss is new.
        dropped = [
            f"{b.session!r} {b.first_seq}..{b.last_seq}"
            for b in batches
            if b.run == 1 and all(episode[0] in models[b.session].dead for episode in b.episodes)
        ]
        assert dropped, f"{known} (no delivery lost its outbox row: not the known bug)" + run.describe()
        known.never_delivered.append(f"(deliveries whose outbox row clear/delete dropped: {', '.join(dropped)})")
    return known


# -- the tests ------------------------------------------------------------------------------


async def crash_and_restart(
    db_path: Path, seed: int, backend: str, after_done: bool = False
) -> tuple[ChildRun, KnownBugs]:
    """One crash cycle: run the child, kill it, check what it left, restart, check; return the known-bug symptoms."""
    config = config_for(seed)
    run = await anyio.to_thread.run_sync(
        functools.partial(run_child_until_killed, db_path, seed, backend, after_done=after_done)
    )
    models = replay(run, config)
    resolve_in_flight(run, models, db_path)
    try:
        with anyio.fail_after(RESTART_TIMEOUT):
            sink, fresh = await restart_and_check(run, models, db_path, config)
    except TimeoutError:
        pytest.fail("the restarted engine hung" + run.describe())
    assert stored_rows(db_path, "SELECT count(*) FROM retain_outbox") == [(0,)], "undelivered" + run.describe()
    return run, check_retain(run, models, fresh, deliveries(db_path, sink))


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed{seed}" for seed in SEEDS])
async def test_sigkill_at_a_random_point_loses_nothing_acknowledged(seed: int, anyio_backend: str, db_path) -> None:
    run, known = await crash_and_restart(db_path, seed, anyio_backend)
    if known and TOLERATE_KNOWN_BUGS:
        # Every other invariant held: report the known bugs as such rather than fail the soak.
        pytest.xfail(f"known retain bug (see the strict xfail tests below):\n{known}" + run.describe(tail=0))
    assert not known, str(known) + run.describe()


# -- the bugs crash injection found ----------------------------------------------------------
#
# Both were in the retain outbox's delivery (memengine/retain/delivery.py with
# the outbox, now store/outbox.py), and are fixed: delivery re-reads (claims) a
# batch before every sink call, and rows are addressed by id and key. Each keeps a deterministic
# in-process reproducer and the crash-injection seeds that used to show it.

STALE_OUTBOX_SNAPSHOT = (
    "RetainDelivery._deliver_pass reads up to 500 outbox rows once and then hands each to the sink from that "
    "in-memory copy (and tenacity retries the same copy), so a delete_episodes()/clear() acknowledged in between "
    "(which rewrote or dropped the rows) does not stop the deleted episodes from being handed on after the deletion"
)
OUTBOX_ROWID_REUSE = (
    "retain_outbox.id is an INTEGER PRIMARY KEY without AUTOINCREMENT and mark_retained() deletes by that id alone: "
    "when clear()/delete_episodes() drops the newest row while its delivery is in flight, the next batch enqueued "
    "(any session) reuses the id, and the in-flight delivery's mark_retained() deletes that never-delivered batch; "
    "its episodes are never handed on (the watermark has passed them)"
)
TOLERATE_KNOWN_BUGS = False  # both bugs are fixed: any such symptom fails
# Seeds that showed each bug in most of their runs before the fix (timing decides the
# interleaving): each must now run clean.
SEEDS_SHOWING_STALE_SNAPSHOT = (19, 32, 38, 1, 2, 37, 22, 11)
SEEDS_SHOWING_ROWID_REUSE = (21, 1, 2, 35, 30, 20, 3, 7)


class StaleOutboxSnapshot(AssertionError):
    pass


class OutboxRowidReuse(AssertionError):
    pass


class RefusingSink:
    mode = "append"

    async def retain(self, batch) -> None:
        raise ConnectionError("sink unavailable")


class GatedSink:
    """Holds its first call until :attr:`gate` is set; records each batch with whether a deletion preceded the call."""

    mode = "append"

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.gate = anyio.Event()
        self.deleted = False  # set by the test once its deletion was acknowledged
        self.batches: list[tuple[bool, tuple[int, ...], str]] = []

    async def retain(self, batch) -> None:
        after_deletion = self.deleted
        if not self.entered.is_set():
            self.entered.set()
            await self.gate.wait()
        self.batches.append((after_deletion, tuple(e.seq for e in batch.episodes), batch.session_id))


async def leave_undelivered_batches(db_path: Path, session: str, count: int) -> None:
    """A run whose sink refuses everything: ``count`` one-episode batches of ``session`` stay in the outbox."""
    config = SessionConfig(retain_every=100, retain_attempts=1, retain_retry_later=3600, passivate_after=None)
    async with open_engine(db_path, retain_sink=RefusingSink(), config=config, retain_grace=0) as engine:
        for number in range(1, count + 1):
            handle = engine.session(session)
            await handle.add([Episode("user", f"{session} turn {number}")])
            await handle.close()  # a boundary: the partial batch goes to the outbox now
    assert stored_rows(db_path, "SELECT id, first_seq, last_seq FROM retain_outbox ORDER BY id") == [
        (number, number, number) for number in range(1, count + 1)
    ]


async def test_no_deleted_episode_is_handed_on_after_the_deletion_returned(db_path) -> None:
    await leave_undelivered_batches(db_path, "a", 2)  # batches (a 1..1) and (a 2..2)
    sink = GatedSink()
    config = SessionConfig(retain_every=100, passivate_after=None)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await sink.entered.wait()  # the delivery pass has read both rows and holds the first in the sink
        assert await engine.session("a").delete_episodes([2]) == 1  # drops the batch (a 2..2) from the outbox
        sink.deleted = True
        sink.gate.set()
    handed_on = [seqs for after_deletion, seqs, _ in sink.batches if after_deletion]
    assert all(2 not in seqs for seqs in handed_on), f"seq 2 handed on after its deletion returned: {sink.batches}"


async def test_a_batch_dropped_mid_delivery_does_not_take_another_session_batch_with_it(db_path) -> None:
    await leave_undelivered_batches(db_path, "a", 1)  # the batch (a 1..1) is row 1
    sink = GatedSink()
    config = SessionConfig(retain_every=100, passivate_after=None)
    async with open_engine(db_path, retain_sink=sink, config=config) as engine:
        await sink.entered.wait()  # (a 1..1) is in the sink
        await engine.session("a").clear()  # drops row 1: the outbox is empty
        b = engine.session("b")
        await b.add([Episode("user", "b turn 1")])
        await b.close()  # (b 1..1) goes to the outbox, as row 1 again
        sink.gate.set()  # the sink returns for (a 1..1): memengine marks row 1 delivered
    delivered = [(session, seqs) for _, seqs, session in sink.batches]
    assert ("b", (1,)) in delivered, f"b's episode 1 was never handed on: {delivered}"
    assert stored_rows(db_path, "SELECT count(*) FROM retain_outbox") == [(0,)]


def crash_cycle_showing(seed: int, tmp_path: Path, symptom: str, error: type[AssertionError]) -> None:
    """A crash cycle (killed after ``done``) of ``seed``; raise ``error`` if it shows ``symptom``."""
    db_path = tmp_path / f"seed{seed}.db"
    run, known = anyio.run(crash_and_restart, db_path, seed, "asyncio", True)
    shown = getattr(known, symptom)
    if shown:
        raise error(f"seed {seed}: " + "\n".join(shown) + run.describe())


# One test per seed, so that parallel workers share them out.
@pytest.mark.parametrize("seed", SEEDS_SHOWING_STALE_SNAPSHOT, ids=[f"seed{s}" for s in SEEDS_SHOWING_STALE_SNAPSHOT])
def test_seeds_that_showed_the_stale_outbox_snapshot_now_run_clean(tmp_path: Path, seed: int) -> None:
    crash_cycle_showing(seed, tmp_path, "handed_on_after_deletion", StaleOutboxSnapshot)


@pytest.mark.parametrize("seed", SEEDS_SHOWING_ROWID_REUSE, ids=[f"seed{s}" for s in SEEDS_SHOWING_ROWID_REUSE])
def test_seeds_that_showed_the_outbox_rowid_reuse_now_run_clean(tmp_path: Path, seed: int) -> None:
    crash_cycle_showing(seed, tmp_path, "never_delivered", OutboxRowidReuse)
