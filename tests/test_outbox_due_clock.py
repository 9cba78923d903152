"""outbox.due judges "due now" and "due later" at one reading of the database's clock.

A batch whose retry time falls between two readings must not be left out of both
(it would then wait for the actor's next look, ``retain_retry_later`` away).
"""

from __future__ import annotations

import sqlite3
import time

from memengine.store import outbox
from memengine.store.dialect import Db, sqlite_dialect


class _ClockPassesRetryTime:
    """A connection whose first statement (the due batches' read) is followed by the retry time passing."""

    def __init__(self, conn: sqlite3.Connection, retry_at: float) -> None:
        self._conn = conn
        self._retry_at = retry_at
        self.statements = 0

    def execute(self, sql: str, params=()):
        cursor = self._conn.execute(sql, params)
        self.statements += 1
        if "ORDER BY o.id" in sql:  # the due batches are read: now the retry time passes
            while time.time() < self._retry_at + 0.005:
                time.sleep(0.001)
        return cursor


def _outbox_with_one_retry(retry_in: float) -> tuple[sqlite3.Connection, float]:
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE retain_outbox (id INTEGER PRIMARY KEY, session_id TEXT, key TEXT, mode TEXT DEFAULT 'append', "
        "retry_at REAL, claimed_by TEXT, claim_until REAL, set_aside_at REAL)"
    )
    retry_at = time.time() + retry_in
    conn.execute("INSERT INTO retain_outbox (session_id, key, retry_at) VALUES ('s', 'k', ?)", (retry_at,))
    return conn, retry_at


def test_a_retry_time_passing_during_the_read_leaves_the_batch_due_now_or_later() -> None:
    conn, retry_at = _outbox_with_one_retry(0.05)
    found = outbox.due(Db(_ClockPassesRetryTime(conn, retry_at), sqlite_dialect()), "me", 10, ignore_backoff=False)
    assert [batch.key for batch in found.batches] == [] and found.next_due_in is not None
    assert found.next_due_in > 0


def test_a_batch_whose_retry_time_came_is_due_and_nothing_is_due_later() -> None:
    conn, _ = _outbox_with_one_retry(-1.0)
    found = outbox.due(Db(conn, sqlite_dialect()), "me", 10, ignore_backoff=False)
    assert [batch.key for batch in found.batches] == ["k"] and found.next_due_in is None


def test_a_batch_waiting_for_its_retry_time_is_due_later() -> None:
    conn, _ = _outbox_with_one_retry(30.0)
    found = outbox.due(Db(conn, sqlite_dialect()), "me", 10, ignore_backoff=False)
    assert (
        found.batches == () and found.next_due_in is not None and 25 < found.next_due_in <= 31
    )  # the clock is read to the millisecond
    assert [b.key for b in outbox.due(Db(conn, sqlite_dialect()), "me", 10, ignore_backoff=True).batches] == ["k"]
