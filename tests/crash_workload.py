"""The child program of tests/test_crash_injection.py: a seeded random workload, to be killed with SIGKILL.

Usage: python -m tests.crash_workload DB SEED STEPS

Runs STEPS rounds of random operations against ``open_engine(DB, ...)`` over a
few sessions, with small windows and retain batches (see :func:`config_for`),
a fold summarizer and a side-file retain sink that both sleep at random (and
sometimes fail), so that a kill lands mid-summary, mid-delivery and mid-commit.
A round runs one operation per chosen session concurrently (adds, idempotent
re-adds, adds cancelled by a timeout then retried, reads with and without
``wait_for_summary``, deletes, clears, closes), plus concurrent reads. Odd
seeds run on trio, even seeds on asyncio. After the last round it prints
``done`` and waits to be killed.

Protocol: one JSON object per line on stdout, flushed at once. Every line
carries ``i``, its 0-based index among all lines printed.

- ``{"op": "begin", "n": N, "kind": "add"|"delete"|"clear", "session": S, ...}``
  is printed *before* mutation ``N`` is sent (adds list ``ids`` and
  ``contents``; deletes list ``seqs``). A mutation without a ``begin`` line
  never happened.
- ``{"op": "add", "n": N, "session": S, "ids": [...], "contents": [...], "seqs": [...]}``
  (the episodes ``add`` returned, in order), ``{"op": "delete", "n": N,
  "session": S, "seqs": [...], "count": k}`` and ``{"op": "clear", "n": N,
  "session": S}`` are printed right after the call returned: acknowledged.
- ``add_cancelled`` (an add whose wait timed out; it is retried with the same
  episodes under the same ``n``), ``close``, ``read`` (the context returned:
  ``summary``, ``summarized_through``, ``evicted_through``, ``episodes`` as
  ``[seq, id, content]``; ``wait`` tells if it waited for the summary),
  ``read_timeout``, ``read_summary_failed`` (a waiting read told that the
  summarizer failed every attempt) and ``done`` report other events.

Per session, mutations are sequential (one at a time, or two identical adds
at once), and reads never overlap a mutation of their session, so the state a
read saw is the one made by the acknowledgements printed before it. Each
session draws its operations from its own seeded generator, so a seed asks
each session for the same operations every run (only timing, and so the
interleaving across sessions, timeouts and engine-made ids, vary).

The retain sink appends each batch it stores to ``DB + ".sink"`` as one JSON
line ``{"key", "session", "first_seq", "last_seq", "mode", "episodes":
[[seq, id, content], ...], "lines_before": L}`` with one ``write`` and an
``fsync``; ``lines_before`` is how many stdout lines had been printed when the
sink was called, so the test can tell a delivery that started after a
deletion was acknowledged.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
from collections.abc import Sequence

import anyio

from memengine import Episode, SessionClosedError, SessionConfig, SummaryError, open_engine

from .fakes import fold

SESSIONS = ("alpha", "beta/δ", "gamma")
WORDS = ("dog", "cat", "lisbon", "order", "tea", "blue", "river", "piano", "moon", "code")


#: The killed run and its restart are one service restarting under its own name:
#: the restart takes its sessions back at once rather than after their leases expire.
RESTARTED_OWNER = "crash-workload"


def config_for(seed: int) -> SessionConfig:
    """The engine settings of a seed's run (the test reopens the database with the same)."""
    rng = random.Random(f"config-{seed}")
    return SessionConfig(
        evict_to=1.0,
        max_episodes=rng.choice([2, 3, 4, 6]),
        max_chars=rng.choice([100_000, 110]),
        retain_every=rng.choice([2, 3, 5]),
        passivate_after=rng.choice([0.03, 0.08, 0.2]),
        summarize_batch_max=rng.choice([2, 200]),
        summarize_attempts=2,
        summarize_backoff=0.002,
        summarize_backoff_max=0.01,
        summarize_retry_later=0.04,
        retain_attempts=2,
        retain_backoff=0.002,
        retain_backoff_max=0.01,
        retain_retry_later=0.04,
    )


def backend_for(seed: int) -> str:
    return "trio" if seed % 2 else "asyncio"


def token(seed: int, session_index: int, number: int) -> str:
    """A word found in exactly one episode's content (for recall)."""
    return f"w{seed}x{session_index}x{number}"


class Output:
    """Numbered JSON lines on stdout."""

    def __init__(self) -> None:
        self.lines = 0

    def emit(self, **fields: object) -> None:
        fields["i"] = self.lines
        sys.stdout.write(json.dumps(fields) + "\n")  # ASCII: whatever the pipe's encoding
        sys.stdout.flush()
        self.lines += 1


class SlowFoldSummarizer:
    """:func:`tests.fakes.fold`, after a random delay; fails now and then (the engine retries)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        roll = self.rng.random()
        await anyio.sleep(self.rng.choice([0, 0.001, 0.005, 0.02]))
        if roll < 0.1:
            raise RuntimeError("flaky model")
        return fold(previous, episodes)


class SideFileSink:
    """Appends each batch to a side file (write + fsync), after random delays; fails now and then."""

    mode = "append"

    def __init__(self, path: str, rng: random.Random, output: Output) -> None:
        self.path = path
        self.rng = rng
        self.output = output

    async def retain(self, batch) -> None:
        lines_before = self.output.lines
        roll = self.rng.random()
        await anyio.sleep(self.rng.choice([0, 0.001, 0.004, 0.015]))
        if roll < 0.08:
            raise ConnectionError("sink unavailable")
        record = {
            "key": batch.key,
            "session": batch.session_id,
            "first_seq": batch.first_seq,
            "last_seq": batch.last_seq,
            "mode": batch.mode,
            "episodes": [[e.seq, e.id, e.content] for e in batch.episodes],
            "lines_before": lines_before,
        }
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if roll > 0.95:
            # Stored, but the acknowledgement is lost: the batch comes again with the same key.
            raise ConnectionError("sink stored the batch but the answer was lost")
        await anyio.sleep(self.rng.choice([0, 0, 0.002]))


class Workload:
    def __init__(self, engine, seed: int, output: Output) -> None:
        self.engine = engine
        self.seed = seed
        self.rng = random.Random(f"workload-{seed}")  # rounds
        # Each session draws from its own generator (its operations are sequential), so what
        # a session is asked to do does not depend on how the concurrent tasks interleave.
        self.rngs = {name: random.Random(f"workload-{seed}-{name}") for name in SESSIONS}
        self.counters = dict.fromkeys(SESSIONS, 0)
        self.out = output
        self.handles = {name: engine.session(name) for name in SESSIONS}
        self.op_number = 0
        # What this process knows per session: every episode it created, and the live seqs.
        self.created: dict[str, list[Episode]] = {name: [] for name in SESSIONS}
        self.live: dict[str, dict[int, str]] = {name: {} for name in SESSIONS}  # seq -> id
        self.dead: dict[str, set[int]] = {name: set() for name in SESSIONS}

    # -- episodes ------------------------------------------------------------

    def new_episode(self, session: str) -> Episode:
        rng = self.rngs[session]
        self.counters[session] += 1
        number = self.counters[session]
        index = SESSIONS.index(session)
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        content = f"{token(self.seed, index, number)} {words}"
        role = rng.choice(["user", "assistant"])
        if rng.random() < 0.5:
            episode = Episode(role, content, id=f"id-{index}-{number}")
        else:
            episode = Episode(role, content)  # an engine-made id
        self.created[session].append(episode)
        return episode

    def next_op(self) -> int:
        self.op_number += 1
        return self.op_number

    # -- operations ------------------------------------------------------------

    async def add(self, session: str, episodes: list[Episode], patience: float | None = None, n: int | None = None):
        if n is None:
            n = self.next_op()
            self.out.emit(
                op="begin",
                n=n,
                kind="add",
                session=session,
                ids=[e.id for e in episodes],
                contents=[e.content for e in episodes],
            )
        stored = None
        if patience is None:
            stored = await self.handles[session].add(episodes)
        else:
            with anyio.move_on_after(patience):
                stored = await self.handles[session].add(episodes)
            if stored is None:
                self.out.emit(op="add_cancelled", n=n, session=session)
                stored = await self.handles[session].add(episodes)  # idempotent by id
        for episode in stored:
            self.live[session][episode.seq] = episode.id
        self.out.emit(
            op="add",
            n=n,
            session=session,
            ids=[e.id for e in stored],
            contents=[e.content for e in stored],
            seqs=[e.seq for e in stored],
        )
        return n

    async def delete(self, session: str) -> None:
        rng = self.rngs[session]
        live = sorted(self.live[session])
        if not live:
            return await self.add(session, [self.new_episode(session)])
        seqs = rng.sample(live, min(len(live), rng.randint(1, 3)))
        if self.dead[session] and rng.random() < 0.3:
            seqs.append(rng.choice(sorted(self.dead[session])))  # already gone: not counted
        n = self.next_op()
        self.out.emit(op="begin", n=n, kind="delete", session=session, seqs=seqs)
        count = await self.handles[session].delete_episodes(seqs)
        for seq in seqs:
            if self.live[session].pop(seq, None) is not None:
                self.dead[session].add(seq)
        self.out.emit(op="delete", n=n, session=session, seqs=seqs, count=count)

    async def clear(self, session: str) -> None:
        n = self.next_op()
        self.out.emit(op="begin", n=n, kind="clear", session=session)
        await self.handles[session].clear()
        self.dead[session].update(self.live[session])
        self.live[session].clear()
        self.out.emit(op="clear", n=n, session=session)

    async def close(self, session: str) -> None:
        handle = self.handles[session]
        if self.rngs[session].random() < 0.3:
            with anyio.move_on_after(0.0005):
                await handle.close()  # even a cancelled close closes the handle
        else:
            await handle.close()
        try:
            await handle.add([self.new_episode(session)])
        except SessionClosedError:
            pass
        else:
            raise AssertionError(f"a closed handle of {session!r} accepted an add")
        self.created[session].pop()  # never stored
        self.handles[session] = self.engine.session(session)
        self.out.emit(op="close", session=session)

    async def read(self, session: str, wait: bool) -> None:
        handle = self.engine.session(session)
        if wait:
            context = None
            with anyio.move_on_after(self.rngs[session].choice([0.002, 0.02, 0.2])):
                try:
                    context = await handle.context(wait_for_summary=True)
                except SummaryError as failed:  # the summarizer failed every attempt meanwhile
                    self.out.emit(op="read_summary_failed", session=session, error=str(failed))
                    return
            if context is None:
                self.out.emit(op="read_timeout", session=session)
                return
        else:
            context = await handle.context()
        self.out.emit(
            op="read",
            session=session,
            wait=wait,
            summary=context.summary,
            summarized_through=context.summarized_through,
            evicted_through=context.evicted_through,
            episodes=[[e.seq, e.id, e.content] for e in context.episodes],
        )

    async def mutate(self, session: str) -> None:
        """One random operation on ``session`` (the only one touching it in this round)."""
        rng = self.rngs[session]
        kind = rng.choices(
            ["add1", "addn", "readd", "dup", "timeout", "twice", "read", "wait", "delete", "clear", "close"],
            weights=[4, 2, 1.5, 0.3, 1, 0.5, 1.5, 1, 1.2, 0.3, 0.5],
        )[0]
        if kind == "add1":
            await self.add(session, [self.new_episode(session)])
        elif kind == "addn":
            await self.add(session, [self.new_episode(session) for _ in range(rng.randint(2, 4))])
        elif kind == "readd" and self.created[session]:
            # Episodes added before (live: returned as stored; deleted: stored again), maybe with a new one.
            old = rng.sample(self.created[session], min(len(self.created[session]), rng.randint(1, 2)))
            if rng.random() < 0.5:
                old.append(self.new_episode(session))
            rng.shuffle(old)
            await self.add(session, old)
        elif kind == "dup":
            episode = self.new_episode(session)
            await self.add(session, [episode, self.new_episode(session), episode])
        elif kind == "timeout":
            episodes = [self.new_episode(session) for _ in range(rng.randint(1, 3))]
            await self.add(session, episodes, patience=rng.choice([0.0002, 0.001, 0.003]))
        elif kind == "twice":
            # The same new episodes from two tasks at once: stored once, both told the same seqs.
            episodes = [self.new_episode(session) for _ in range(rng.randint(1, 2))]
            n = self.next_op()
            begin = {"kind": "add", "session": session, "ids": [e.id for e in episodes]}
            self.out.emit(op="begin", n=n, contents=[e.content for e in episodes], **begin)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self.add, session, episodes, None, n)
                tasks.start_soon(self.add, session, episodes, None, n)
        elif kind == "read":
            await self.read(session, wait=False)
        elif kind == "wait":
            await self.read(session, wait=True)
        elif kind == "delete":
            await self.delete(session)
        elif kind == "clear":
            await self.clear(session)
        elif kind == "close":
            await self.close(session)
        else:
            await self.add(session, [self.new_episode(session)])

    async def round(self) -> None:
        rng = self.rng
        chosen = rng.sample(SESSIONS, rng.randint(1, len(SESSIONS)))
        async with anyio.create_task_group() as tasks:
            for session in chosen:
                tasks.start_soon(self.mutate, session)
            for session in SESSIONS:
                if session not in chosen and rng.random() < 0.3:
                    tasks.start_soon(self.read, session, rng.random() < 0.5)
        roll = rng.random()
        if roll < 0.05:
            await anyio.sleep(rng.uniform(0.05, 0.25))  # long enough to passivate idle sessions
        elif roll < 0.6:
            await anyio.sleep(rng.choice([0, 0.001, 0.003]))

    async def run(self, steps: int) -> None:
        for _ in range(steps):
            await self.round()
        if self.rng.random() < 0.5:
            for session in SESSIONS:
                await self.handles[session].close()
        self.out.emit(op="done")
        await anyio.sleep_forever()


async def main(path: str, seed: int, steps: int) -> None:
    # The failures this workload injects are expected: keep stderr for the unexpected.
    logging.getLogger("memengine.summarizer").setLevel(logging.CRITICAL)
    logging.getLogger("memengine.retain").setLevel(logging.CRITICAL)
    output = Output()
    delays = random.Random(f"delays-{seed}")
    summarizer = SlowFoldSummarizer(delays)
    sink = SideFileSink(path + ".sink", delays, output)
    async with open_engine(
        path, summarizer=summarizer, retain_sink=sink, config=config_for(seed), owner=RESTARTED_OWNER
    ) as engine:
        await Workload(engine, seed, output).run(steps)


if __name__ == "__main__":
    db, seed_text, steps_text = sys.argv[1:4]
    anyio.run(main, db, int(seed_text), int(steps_text), backend=backend_for(int(seed_text)))
