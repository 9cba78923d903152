"""Retain delivery keeps sessions independent: a failing, hung or crowded session delays only itself.

Each test runs on both stores (``store_url``) where the store is involved and
on both async libraries, and asserts on what users observe: the batches the
sink received (exactly once, in order per session), the outbox rows, the log,
and what leaving the engine raises. Every wait that could hang runs under a
``fail_after`` guard inside the engine's block, so the engine leaves normally
and the test fails rather than hangs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store.base import OutboxEntry
from memengine.store.open import open_store

from .test_store_conformance import append, two_processes

pytestmark = pytest.mark.anyio

GUARD = 30  # seconds: no test waits this long unless delivery is stuck
QUICK = {"retain_backoff": 0.001, "retain_backoff_max": 0.001, "passivate_after": None}


def turns(count: int, prefix: str) -> list[Episode]:
    return [Episode("user", f"{prefix} {n}") for n in range(1, count + 1)]


class ScriptedSink:
    """Accepts every batch, except that ``refuse`` sessions are always refused with their error
    and the first call for each ``hang`` session blocks until it is cancelled."""

    mode = "append"

    def __init__(self, refuse: dict[str, Exception] | None = None, hang: set[str] | None = None) -> None:
        self.refuse = refuse or {}
        self.hang = set(hang or ())
        self.calls: list[tuple[str, int, int]] = []  # every call, in order
        self.accepted: dict[str, list[tuple[int, int]]] = {}  # session -> (first_seq, last_seq) it stored
        self.hanging = 0  # calls blocked right now
        self.cut = 0  # blocked calls that were cancelled
        self._changed = anyio.Event()

    async def retain(self, batch) -> None:
        self.calls.append((batch.session_id, batch.first_seq, batch.last_seq))
        try:
            if batch.session_id in self.hang:
                self.hang.discard(batch.session_id)
                self.hanging += 1
                self._tell()
                try:
                    await anyio.sleep_forever()
                finally:
                    self.hanging -= 1
                    self.cut += 1
            error = self.refuse.get(batch.session_id)
            if error is not None:
                raise error
            self.accepted.setdefault(batch.session_id, []).append((batch.first_seq, batch.last_seq))
        finally:
            self._tell()

    def _tell(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    def calls_of(self, session_id: str) -> list[tuple[int, int]]:
        return [(first, last) for session, first, last in self.calls if session == session_id]


# -- a failing session does not stop the others --------------------------------------------------


async def test_500_rejected_batches_of_one_session_do_not_stop_the_others(store_url, rows) -> None:
    sink = ScriptedSink(refuse={"bad": PermissionError("403 from sink")})
    # Never set aside here: "bad" keeps failing all along (test_set_aside_retain.py covers setting aside).
    config = SessionConfig(
        retain_every=1, retain_attempts=2, retain_retry_later=0.05, retain_set_aside_after=None, **QUICK
    )
    healthy = [f"healthy-{n}" for n in range(5)]
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        bad = engine.session("bad")
        await bad.add(turns(520, "bad"))
        await bad.close()  # returns once all 520 one-episode batches are in the outbox, the oldest there
        for name in healthy:
            await engine.session(name).add(turns(3, name))
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: all(len(sink.accepted.get(name, ())) == 3 for name in healthy))
            refused_so_far = len(sink.calls_of("bad"))
            await sink.wait_until(lambda: len(sink.calls_of("bad")) > refused_so_far)  # it keeps failing
    for name in healthy:
        assert sink.accepted[name] == [(1, 1), (2, 2), (3, 3)], name
    assert set(sink.calls_of("bad")) == {(1, 1)}  # only ever its oldest batch: in order
    assert "bad" not in sink.accepted
    assert rows.query("SELECT session_id, count(*) FROM retain_outbox GROUP BY session_id") == [("bad", 520)]


async def test_a_hung_sink_call_does_not_stop_other_sessions(store_url) -> None:
    sink = ScriptedSink(hang={"slow"})
    config = SessionConfig(retain_every=1, **QUICK)  # the default retain_timeout outlasts the test
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        await engine.session("slow").add(turns(2, "slow"))
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: sink.hanging == 1)
        await engine.session("fast").add(turns(3, "fast"))  # recorded while slow's call hangs
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.accepted.get("fast", ())) == 3)
        assert sink.hanging == 1  # slow's call still hangs: fast did not wait for it
    assert sink.accepted["fast"] == [(1, 1), (2, 2), (3, 3)]
    assert "slow" not in sink.accepted


async def test_a_hung_sink_call_is_cut_after_retain_timeout_and_retried(store_url, rows, caplog) -> None:
    sink = ScriptedSink(hang={"slow"})
    config = SessionConfig(retain_every=1, retain_timeout=0.5, **QUICK)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        await engine.session("slow").add(turns(3, "slow"))
        await engine.session("fast").add(turns(2, "fast"))
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.accepted.get("slow", ())) == 3)
        metrics = await engine.retain_metrics()
    assert sink.cut == 1
    assert sink.calls_of("slow") == [(1, 1), (1, 1), (2, 2), (3, 3)]  # cut, retried, then the rest in order
    assert sink.accepted == {"slow": [(1, 1), (2, 2), (3, 3)], "fast": [(1, 1), (2, 2)]}  # each exactly once
    assert metrics.delivery_failures == 1
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]
    assert any("retain_timeout" in r.getMessage() for r in caplog.records if r.name == "memengine.retain")


@pytest.mark.parametrize("sessions", [500, pytest.param(2000, marks=pytest.mark.soak)])
async def test_thousands_of_sessions_are_served_while_the_oldest_keeps_failing(
    store_url, monkeypatch, sessions: int
) -> None:
    sink = ScriptedSink(refuse={"bad": ConnectionError("sink unavailable")})
    # Leases that outlast the test: renewing 2,001 of them every third of the default 10 s fell behind on a
    # loaded machine (LeaseLostError at a load of 7), and leases are not what this test is about.
    config = SessionConfig(
        retain_every=1, retain_attempts=3, retain_retry_later=3600, lease_ttl=3600, lease_wait=3600, **QUICK
    )
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        await engine.session("bad").add([Episode("user", "the oldest batch")])
        async with anyio.create_task_group() as adds:
            for n in range(sessions):
                adds.start_soon(engine.session(f"s{n:04}").add, [Episode("user", f"turn of {n}")])
        reads = 0
        read_due = getattr(engine.store, "due_retains", None)

        async def counted(*args, **kwargs):
            nonlocal reads
            reads += 1
            return await read_due(*args, **kwargs)  # type: ignore[misc]

        monkeypatch.setattr(engine.store, "due_retains", counted, raising=False)
        with anyio.fail_after(GUARD * 10):  # a deadline on delivering 2,000 batches: generous, as the load may be
            await sink.wait_until(lambda: len(sink.accepted) == sessions and len(sink.calls_of("bad")) == 3)
    assert all(batches == [(1, 1)] for batches in sink.accepted.values())  # every one, exactly once
    # The failing session had its attempts (then waits retain_retry_later), not one per pass.
    assert sink.calls_of("bad") == [(1, 1)] * 3
    # Outbox reads are shared by many sessions: far fewer than one per delivery.
    assert reads <= sessions // 20, reads


# -- what is recorded and logged about a failure ---------------------------------------------


async def test_the_outbox_carries_the_sink_own_error_and_the_log_its_type(store_url, rows, caplog) -> None:
    """The error's text may quote the batch: kept with it in the store (where erasure reaches), not logged."""
    caplog.set_level(logging.DEBUG, logger="memengine.retain")
    caplog.set_level(logging.DEBUG, logger="memengine.content")  # the opt-in logger of what may quote content
    sink = ScriptedSink(refuse={"s": PermissionError("403 from sink")})
    config = SessionConfig(retain_every=1, retain_attempts=2, retain_retry_later=3600, **QUICK)
    async with open_engine(store_url, retain_sink=sink, config=config, retain_grace=0) as engine:
        await engine.session("s").add(turns(1, "s"))
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.calls) == 2)
            while not rows.query("SELECT 1 FROM retain_outbox WHERE last_error IS NOT NULL"):  # noqa: ASYNC110
                await anyio.sleep(0.01)  # a row to wait for, not an event
    assert rows.query("SELECT last_error FROM retain_outbox") == [("PermissionError('403 from sink')",)]
    logged = [r for r in caplog.records if r.name == "memengine.retain" and r.levelno >= logging.WARNING]
    assert len(logged) == 2  # one line per failed call
    for record in logged:
        assert "PermissionError" in record.getMessage() and "403 from sink" not in record.getMessage()
        assert "ExceptionGroup" not in record.getMessage()
        assert record.exc_info is None
    assert not [r for r in caplog.records if r.name == "memengine.retain" and r.exc_info]
    tracebacks = [r for r in caplog.records if r.name == "memengine.content" and r.exc_info]
    assert tracebacks and all(r.levelno == logging.DEBUG for r in tracebacks)
    assert isinstance(tracebacks[0].exc_info[1], PermissionError)
    assert "403 from sink" in tracebacks[0].getMessage()


# -- claims across processes -------------------------------------------------------------------


async def test_a_lapsed_claim_cannot_release_another_process_live_claim(store_url, rows) -> None:
    async with two_processes(store_url) as (a, b):
        token, _ = await a.activate("s", 60.0)
        await append(a, "s", token, 1, Episode("user", "one"))
        await a.enqueue_retain("s", token, "append")
        (entry,) = await a.pending_retains(10)
        assert isinstance(await a.claim_retain(entry.id, entry.key, 0.2), OutboxEntry)
        await anyio.sleep(0.4)  # a is paused past its claim
        assert isinstance(await b.claim_retain(entry.id, entry.key, 60.0), OutboxEntry)  # b sends it now
        await a.mark_retain_failed(entry.id, entry.key, "a's call failed late")
        assert rows.query("SELECT claimed_by, attempts, last_error FROM retain_outbox") == [("process-b", 0, None)]
        assert await a.claim_retain(entry.id, entry.key, 60.0) == "busy"  # b's claim still stands
        # A delivered batch is removed whoever holds it: the sink has it.
        await a.mark_retained(entry.id, entry.key)
        assert await b.claim_retain(entry.id, entry.key, 60.0) == "gone"
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


# -- leaving the engine ------------------------------------------------------------------------


class ErrorOnCancelSink:
    """Blocks; when cancelled, its cleanup fails and raises in place of the cancellation
    (as a client whose connection breaks while it is being closed)."""

    mode = "append"

    def __init__(self) -> None:
        self.entered = anyio.Event()

    async def retain(self, batch) -> None:
        self.entered.set()
        try:
            await anyio.sleep_forever()
        finally:
            raise ConnectionError("connection reset while closing")  # replaces the cancellation


class RefusingSink:
    mode = "append"

    async def retain(self, batch) -> None:
        raise ConnectionError("sink unavailable")


@pytest.mark.parametrize("grace", [0, 0.2])
async def test_a_sink_error_at_cancellation_never_escapes_engine_exit(store_url, rows, grace: float) -> None:
    for _ in range(3):
        sink = ErrorOnCancelSink()
        async with open_engine(
            store_url, retain_sink=sink, config=SessionConfig(retain_every=1, **QUICK), retain_grace=grace
        ) as engine:
            await engine.session("s").add(turns(1, "s"))
            with anyio.fail_after(GUARD):
                await sink.entered.wait()  # the call is in flight when the engine leaves
    # Each start's batch is kept for the next start.
    assert rows.query("SELECT first_seq, last_seq FROM retain_outbox ORDER BY id") == [(1, 1), (2, 2), (3, 3)]


async def test_a_refusing_sink_never_escapes_engine_exit_however_the_timing_falls(db_path) -> None:
    config = SessionConfig(retain_every=1, retain_attempts=1, retain_retry_later=3600, passivate_after=None)
    for round_ in range(40):
        async with open_engine(db_path, retain_sink=RefusingSink(), config=config, retain_grace=0) as engine:
            for n in range(4):
                await engine.session(f"s{n}").add([Episode("user", f"round {round_}")])
            await anyio.sleep(0.0005 * (round_ % 5))  # vary where exit meets the refusals


# -- waking up without a notification ------------------------------------------------------------


async def test_a_batch_due_for_retry_is_delivered_without_any_new_add(store_url) -> None:
    sink = ScriptedSink(refuse={"s": ConnectionError("sink unavailable")})
    config = SessionConfig(retain_every=1, retain_attempts=1, retain_retry_later=0.3, **QUICK)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        await engine.session("s").add(turns(1, "s"))
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: len(sink.calls_of("s")) == 1)
            del sink.refuse["s"]  # the sink recovers; nothing else happens
            await sink.wait_until(lambda: "s" in sink.accepted)
    assert sink.accepted == {"s": [(1, 1)]}


async def test_a_batch_a_killed_process_left_claimed_is_delivered_once_the_claim_lapses(store_url) -> None:
    sink = ScriptedSink()
    config = SessionConfig(retain_every=1, retain_retry_later=0.3, **QUICK)
    async with open_engine(store_url, retain_sink=sink, config=config, owner="survivor") as engine:
        async with open_store(store_url, owner="killed") as killed:
            token, _ = await killed.activate("k", 3600.0)
            await append(killed, "k", token, 1, Episode("user", "left behind"))
            await killed.enqueue_retain("k", token, "append")
            (entry,) = await killed.pending_retains(10)
            await killed.claim_retain(entry.id, entry.key, 0.5)
        # "killed" is gone without a word; its claim lapses in half a second.
        with anyio.fail_after(GUARD):
            await sink.wait_until(lambda: "k" in sink.accepted)
            while await engine.store.pending_retains(10):  # noqa: ASYNC110 - recorded right after the sink returned
                await anyio.sleep(0.01)
    assert sink.accepted == {"k": [(1, 1)]}


# -- the setting ---------------------------------------------------------------------------------


def test_retain_timeout_is_validated_like_every_other_duration() -> None:
    assert SessionConfig().retain_timeout > 0
    assert SessionConfig(retain_timeout=2).retain_timeout == 2
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="retain_timeout"):
            SessionConfig(retain_timeout=bad)
    for wrong in ("5", None, True):
        with pytest.raises(TypeError, match="retain_timeout"):
            SessionConfig(retain_timeout=wrong)
