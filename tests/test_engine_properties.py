"""A stateful property test: the real engine against a small reference model.

Hypothesis drives random sequences of operations (adds, re-sent ids, reads,
waiting reads, deletes, clears, closes, cancelled calls, summarizer and sink
failures, engine restarts) and checks every invariant after every step, on
asyncio and on trio (under a MockClock). A failing case shrinks to a short
sequence of steps. Set MEMENGINE_SOAK=N to run N times more examples.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from trio.testing import MockClock

from memengine import Episode, SessionClosedError, SessionConfig, open_engine

from .fakes import RecordingSink, context_once_summarized, covered, fold

SOAK = int(os.environ.get("MEMENGINE_SOAK", "1"))
SESSIONS = ("alice", "bob")
CONFIG = SessionConfig(
    max_episodes=3,
    max_chars=60,
    retain_every=2,
    summarize_attempts=2,
    summarize_backoff=0.001,
    summarize_backoff_max=0.002,
    summarize_retry_later=0.01,
    retain_attempts=2,
    retain_backoff=0.001,
    retain_backoff_max=0.002,
    retain_retry_later=0.01,
    passivate_after=0.05,
)


class FlakySummarizer:
    """Folds (so coverage can be checked exactly); fails while ``failures`` > 0."""

    def __init__(self) -> None:
        self.failures = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        await anyio.lowlevel.checkpoint()
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("model unavailable")
        return fold(previous, episodes)


class FlakySink(RecordingSink):
    async def retain(self, batch) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("sink unavailable")
        self.batches.append(batch)


class EngineMachine(RuleBasedStateMachine):
    backend: object = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory(prefix="memengine-props-")
        self.db = Path(self.directory.name) / "memory.db"
        self.summarizer = FlakySummarizer()
        self.sink = FlakySink()
        self.portal_cm = start_blocking_portal(*_backend(self.backend))
        self.portal = self.portal_cm.__enter__()
        self.engine_cm = None
        self.engine = None
        # The model: per session, the live episodes (seq, content) in order.
        self.live: dict[str, list[tuple[int, str]]] = {s: [] for s in SESSIONS}
        self.last_seq = dict.fromkeys(SESSIONS, 0)
        self.sent_ids: dict[str, list[Episode]] = {s: [] for s in SESSIONS}
        self.closed_handles: list = []
        self.counter = 0

    # -- engine lifecycle --------------------------------------------------

    @initialize()
    def start(self) -> None:
        self._open()

    def _open(self) -> None:
        self.engine_cm = self.portal.wrap_async_context_manager(
            open_engine(self.db, summarizer=self.summarizer, retain_sink=self.sink, config=CONFIG, retain_grace=5)
        )
        self.engine = self.engine_cm.__enter__()

    def _close_engine(self) -> None:
        self.engine_cm.__exit__(None, None, None)
        self.engine = None

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                self.summarizer.failures = 0
                self.sink.failures = 0
                self._close_engine()
                self._check_deliveries(final=True)
        finally:
            self.portal_cm.__exit__(None, None, None)
            self.directory.cleanup()

    @rule()
    def restart(self) -> None:
        self._close_engine()
        self._check_deliveries(final=False)
        self._open()

    # -- operations ----------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS), count=st.integers(1, 3), length=st.integers(1, 30))
    def add(self, session: str, count: int, length: int) -> None:
        episodes = [self._episode(length) for _ in range(count)]
        stored = self.portal.call(self.engine.session(session).add, episodes)
        assert [e.seq for e in stored] == list(range(self.last_seq[session] + 1, self.last_seq[session] + 1 + count))
        self._model_add(session, episodes)

    @precondition(lambda self: any(self.sent_ids.values()))
    @rule(data=st.data())
    def add_again(self, data) -> None:
        session = data.draw(st.sampled_from([s for s in SESSIONS if self.sent_ids[s]]))
        episode = data.draw(st.sampled_from(self.sent_ids[session]))
        (stored,) = self.portal.call(self.engine.session(session).add, [episode])
        assert stored.id == episode.id
        if any(content == episode.content for _, content in self.live[session]):
            assert stored.seq in [seq for seq, _ in self.live[session]]  # nothing new
        else:
            self._model_add(session, [episode])  # deleted or cleared since: stored again

    @rule(session=st.sampled_from(SESSIONS), length=st.integers(1, 30))
    def add_cancelled_before_sending(self, session: str, length: int) -> None:
        handle = self.engine.session(session)

        async def cancelled_add() -> None:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await handle.add([self._episode(length)])

        self.portal.call(cancelled_add)  # nothing was sent: the model does not change

    @rule(session=st.sampled_from(SESSIONS), length=st.integers(1, 30))
    def add_cancelled_while_waiting(self, session: str, length: int) -> None:
        handle = self.engine.session(session)
        episode = self._episode(length)

        async def add_then_give_up() -> None:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(handle.add, [episode])
                await anyio.wait_all_tasks_blocked()  # the add is sent, waiting for its reply
                tasks.cancel_scope.cancel()
            # It was sent, so the session still stores it: wait until a reader sees it.
            with anyio.fail_after(30):
                while episode.id not in [e.id for e in (await handle.context()).episodes]:  # noqa: ASYNC110
                    await anyio.sleep(0.001)

        self.portal.call(add_then_give_up)
        self._model_add(session, [episode])

    @rule(session=st.sampled_from(SESSIONS))
    def read(self, session: str) -> None:
        self._check_context(session, self.portal.call(self.engine.session(session).context))

    @rule(session=st.sampled_from(SESSIONS))
    def read_and_wait(self, session: str) -> None:
        handle = self.engine.session(session)

        async def wait() -> object:
            with anyio.fail_after(30):
                return await context_once_summarized(handle)  # told of failed rounds; asks again

        context = self.portal.call(wait)
        self._check_context(session, context)
        assert context.evicted_through == context.summarized_through

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def delete(self, session: str, data) -> None:
        seqs = [seq for seq, _ in self.live[session]] + [self.last_seq[session] + 5]
        chosen = data.draw(st.lists(st.sampled_from(seqs), max_size=3, unique=True))
        deleted = self.portal.call(self.engine.session(session).delete_episodes, chosen)
        before = len(self.live[session])
        self.live[session] = [(seq, c) for seq, c in self.live[session] if seq not in chosen]
        assert deleted == before - len(self.live[session])

    @rule(session=st.sampled_from(SESSIONS))
    def clear(self, session: str) -> None:
        self.portal.call(self.engine.session(session).clear)
        self.live[session] = []

    @rule(session=st.sampled_from(SESSIONS), cancelled=st.booleans())
    def close(self, session: str, cancelled: bool) -> None:
        handle = self.engine.session(session)

        async def close() -> None:
            with anyio.CancelScope() as scope:
                if cancelled:
                    scope.cancel()
                await handle.close()

        self.portal.call(close)
        self.closed_handles.append(handle)

    @precondition(lambda self: bool(self.closed_handles))
    @rule(data=st.data())
    def closed_is_closed(self, data) -> None:
        handle = data.draw(st.sampled_from(self.closed_handles))

        async def try_add() -> None:
            with pytest.raises(SessionClosedError):
                await handle.add([Episode("user", "never")])

        self.portal.call(try_add)

    @rule(failures=st.integers(1, 3))
    def summarizer_fails(self, failures: int) -> None:
        self.summarizer.failures = failures

    @rule(failures=st.integers(1, 3))
    def sink_fails(self, failures: int) -> None:
        self.sink.failures = failures

    # -- invariants ------------------------------------------------------------

    @invariant()
    def store_holds_exactly_the_live_episodes(self) -> None:
        if self.engine is None:
            return
        conn = sqlite3.connect(self.db)
        try:
            for session in SESSIONS:
                rows = conn.execute(
                    "SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", (session,)
                ).fetchall()
                assert rows == self.live[session]
                gone = self._removed_contents(session)
                for (summary,) in conn.execute("SELECT summary FROM summaries WHERE session_id = ?", (session,)):
                    assert gone.isdisjoint(covered(summary)), "a summary of removed episodes is readable"
        finally:
            conn.close()

    # -- helpers -----------------------------------------------------------------

    def _episode(self, length: int) -> Episode:
        self.counter += 1
        return Episode("user", f"e{self.counter}-" + "x" * length)

    def _model_add(self, session: str, episodes: list[Episode]) -> None:
        for episode in episodes:
            self.last_seq[session] += 1
            self.live[session].append((self.last_seq[session], episode.content))
            self.sent_ids[session].append(episode)

    def _removed_contents(self, session: str) -> set[str]:
        live = {content for _, content in self.live[session]}
        return {e.content for e in self.sent_ids[session]} - live

    def _check_context(self, session: str, context) -> None:
        # No gap, no overlap: the summary covers exactly the live episodes up to
        # summarized_through, and the raw episodes are exactly the rest, in order.
        expected = [content for _, content in self.live[session]]
        assert covered(context.summary) + [e.content for e in context.episodes] == expected
        assert all(e.seq > context.summarized_through for e in context.episodes)
        assert [e.seq for e in context.episodes] == sorted(e.seq for e in context.episodes)
        assert context.summarized_through <= context.evicted_through

    def _check_deliveries(self, *, final: bool) -> None:
        """Exactly once, in order, per session (checked after clean exits)."""
        keys = [b.key for b in self.sink.batches]
        assert len(keys) == len(set(keys)), "a batch was delivered twice"
        for session in SESSIONS:
            seqs = [e.seq for b in self.sink.batches if b.session_id == session for e in b.episodes]
            assert seqs == sorted(set(seqs)), f"{session}: deliveries out of order or repeated: {seqs}"
            if final:
                delivered = set(seqs)
                assert {seq for seq, _ in self.live[session]} <= delivered, "a live episode was never delivered"


def _backend(backend: object) -> tuple[str, dict]:
    if backend == "trio":
        return "trio", {"clock": MockClock(autojump_threshold=0.1)}
    return "asyncio", {}


PROPERTY_SETTINGS = settings(
    max_examples=12 * SOAK,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestEngineOnAsyncio(EngineMachine.TestCase):
    settings = PROPERTY_SETTINGS


class TrioEngineMachine(EngineMachine):
    backend = "trio"


class TestEngineOnTrio(TrioEngineMachine.TestCase):
    settings = PROPERTY_SETTINGS
