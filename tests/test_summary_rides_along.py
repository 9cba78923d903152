"""A summary costs no commit of its own while writes come: it rides along with the next one, or commits alone soon.

The summarizer child stores each summary before it acknowledges it. The
store used to commit it in a transaction of its own, right after the add
that evicted its episodes: the next add of a one-at-a-time writer then
waited behind it (and at ``synchronous="FULL"`` for a second fsync). Now it
goes into the next transaction, whatever that holds; when none comes within
``SUMMARY_RIDER_SECONDS`` (store/committer.py), it commits alone. Until it is
stored its episodes stay shown raw, as for any summary being computed.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store import committer

from .fakes import RecordingSummarizer, covered
from .test_eviction_boundary_rides_along import GUARD, Transactions, writes

pytestmark = pytest.mark.anyio

# Long leases: no renewal (a transaction to ride with) comes during a test, however slow the machine.
CONFIG = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None, lease_ttl=600.0)
SUMMARY = "INSERT INTO summaries"


async def test_under_adds_every_summary_goes_into_an_adds_commit(db_path, stored, monkeypatch) -> None:
    monkeypatch.setattr(committer, "SUMMARY_RIDER_SECONDS", 3600.0)  # never alone: only with other work
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    transactions = Transactions()
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=CONFIG) as engine:
            session = engine.session("s")
            await session.context()
            engine.store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            for turn in range(1, 31):
                await session.add([Episode("user", f"turn {turn}")])
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    with_summaries = [t for t in transactions.committed if any(s.startswith(SUMMARY) for s in t)]
    assert with_summaries, "no summary was stored while adds came"
    for statements in with_summaries:
        assert any(s.startswith("INSERT INTO episodes") for s in writes(statements)), statements
    # Summaries kept coming (the one in flight at the end was committed as the engine closed), each
    # covering the episodes before it, in order.
    (through, text), *_ = sorted(stored.summaries("s"), reverse=True)
    assert covered(text) == [f"turn {n}" for n in range(1, through + 1)]
    assert through >= 20


async def test_with_no_other_write_a_summary_commits_alone_soon(db_path, stored) -> None:
    async with open_engine(db_path, summarizer=RecordingSummarizer(), config=CONFIG) as engine:
        session = engine.session("s")
        for turn in range(1, 4):
            await session.add([Episode("user", f"turn {turn}")])
        with anyio.fail_after(GUARD):  # (it takes SUMMARY_RIDER_SECONDS, a twentieth of a second)
            context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1"]
        assert [through for through, _ in stored.summaries("s")] == [1]  # stored, with the engine still open
