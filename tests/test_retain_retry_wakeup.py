"""A refused batch is sent again once its retry time comes, however the store's clock ticks during a read.

The delivery actor pauses a refused session on its own clock, and learns when
the batch falls due in the store from the outbox read (``next_due_in``), judged
on the database's clock, which may run behind (SQLite reads it to the
millisecond; a PostgreSQL server keeps its own). Here the database's retry time
is a little later than the actor's pause, and every read of the due batches is
held until the retry time has passed before the rest of the read runs: the
batch must still be found due now or due later, and go out at its retry time,
not at the next periodic look (``retain_retry_later``, 60 s).
"""

from __future__ import annotations

import time

import anyio
import pytest

from memengine import SessionConfig, open_engine
from memengine.store import outbox
from memengine.store.dialect import Db

from .fakes import ForgettingSink, turns

pytestmark = pytest.mark.anyio

GUARD = 10  # seconds; the retry is due 0.01 s after each refusal, the periodic look 60 s later


def _retry_time_passes_during_due_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second read of the due batches after each refusal (the first comes at once, while the
    session is paused), the retry time passes between the read of what is due and the rest of the read."""
    execute = Db.execute
    seen: set[float] = set()

    def execute_then_let_retry_time_pass(self: Db, template: str, params=()):
        cursor = execute(self, template, params)
        if "retry_at" in template and "ORDER BY o.id LIMIT" in template:  # outbox.due's read of the due batches
            (retry_at,) = self.conn.execute("SELECT max(retry_at) FROM retain_outbox").fetchone()
            if retry_at is not None and retry_at in seen:
                while time.time() < float(retry_at) + 0.005:
                    time.sleep(0.001)
            elif retry_at is not None:
                seen.add(retry_at)
        return cursor

    monkeypatch.setattr(Db, "execute", execute_then_let_retry_time_pass)


def _database_clock_behind(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    mark_failed = outbox.mark_failed

    def retry_later_by_the_database_clock(db, entry_id, key, owner, error, retry_in, set_aside=False):
        mark_failed(db, entry_id, key, owner, error, retry_in + seconds, set_aside)

    monkeypatch.setattr(outbox, "mark_failed", retry_later_by_the_database_clock)


async def test_a_refused_forget_is_sent_again_when_its_retry_time_passes_during_the_outbox_read(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = ForgettingSink()
    config = SessionConfig(retain_every=2, max_episodes=100, passivate_after=None, retain_backoff=0.01)
    async with open_engine(store_url, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(1)
        _database_clock_behind(monkeypatch, 0.05)
        _retry_time_passes_during_due_reads(monkeypatch)
        sink.failures = sink.calls + 2  # the next two calls fail
        await session.delete_episodes([1])
        with anyio.fail_after(GUARD):
            await sink.wait_for_calls(2)
        await session.close()
    assert sink.calls_made == [("retain", (1, 2)), ("forget", (1,))]
