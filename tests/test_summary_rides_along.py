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

import functools

import anyio
import attrs
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store import committer

from .fakes import GatedSummarizer, RecordingSummarizer, covered
from .test_eviction_boundary_rides_along import BOUNDARY, GUARD, Transactions, writes

pytestmark = pytest.mark.anyio

# Long leases: no renewal (a transaction to ride with) comes during a test, however slow the machine.
CONFIG = SessionConfig(max_episodes=2, evict_to=1, passivate_after=None, lease_ttl=600.0)
SUMMARY = "INSERT INTO summaries"
# A window that evicts many batches' worth at once: a backlog.
BACKLOG_CONFIG = SessionConfig(
    max_episodes=10, evict_to=0.5, summarize_batch_max=5, passivate_after=None, lease_ttl=600.0
)


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
        # No read waits for it (one would have it committed at once, see below): it commits alone,
        # SUMMARY_RIDER_SECONDS (a twentieth of a second) after it was made.
        with anyio.fail_after(GUARD):
            while not stored.summaries("s"):  # noqa: ASYNC110 - the store's rows, as another process sees them
                await anyio.sleep(0.01)
        assert [through for through, _ in stored.summaries("s")] == [1]  # stored, with the engine still open
        # The row is visible to other connections from the commit on; the session takes the summary
        # up once the commit's answer reaches the event loop, a moment later: wait for that, not a time.
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1"]


# -- a read waiting for the summary does not wait for a ride ----------------------------


async def test_a_read_waiting_for_the_summary_has_it_committed_at_once(db_path, monkeypatch) -> None:
    """The read waits first, then the summary is computed: it is stored at once, not when a write comes along."""
    monkeypatch.setattr(committer, "SUMMARY_RIDER_SECONDS", 3600.0)  # riding would hang the read
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    summarizer = GatedSummarizer()
    read: list[object] = []
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=summarizer, config=CONFIG) as engine:
            session = engine.session("s")
            for turn in range(1, 4):
                await session.add([Episode("user", f"turn {turn}")])
            await summarizer.wait_until_called()

            async def waiting_read() -> None:
                read.append(await session.context(wait_for_summary=True))

            async with anyio.create_task_group() as group:
                group.start_soon(waiting_read)
                await anyio.wait_all_tasks_blocked()  # the read waits in the session for the summary
                summarizer.release()
    (context,) = read
    assert covered(context.summary) == ["turn 1"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("ceiling", [False, True], ids=["wait_for_summary", "ceiling"])
async def test_a_read_waiting_for_a_summary_already_riding_has_it_committed_at_once(
    db_path, monkeypatch, ceiling: bool
) -> None:
    """The summary is stored, waiting for a ride, when a read comes that must wait for it: it goes at once."""
    monkeypatch.setattr(committer, "SUMMARY_RIDER_SECONDS", 3600.0)
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    # With a ceiling the raw episodes exceed, a plain read waits (up to max_context_wait) for the summary.
    config = attrs.evolve(CONFIG, max_context_tokens=40, max_context_wait=3600.0) if ceiling else CONFIG
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=RecordingSummarizer(), config=config) as engine:
            session = engine.session("s")
            for turn in range(1, 4):
                await session.add([Episode("user", f"turn {turn} " + "word " * 20)])
            await anyio.wait_all_tasks_blocked()  # the summary was made and waits for a ride
            context = await session.context(wait_for_summary=not ceiling)
    assert covered(context.summary) == [f"turn 1 {'word ' * 20}"]  # waited for, and committed without a ride


# -- a backlog drains at the summarizer's pace --------------------------------------------


@pytest.mark.parametrize("backlog", ["add", "delete"])
async def test_a_backlog_of_batches_is_not_paced_by_the_ride(db_path, stored, monkeypatch, backlog: str) -> None:
    """Batches that leave more behind them ride only briefly: with no write to ride with, each would wait its ride out.

    The child takes the next batch only once the one before is stored, so a
    ride per batch would pace a backlog (a large add, a re-summary after a
    delete, a restart's pending summaries) at one batch per ride. Such a batch
    waits BACKLOG_RIDER_SECONDS; only the batch that empties the backlog waits
    SUMMARY_RIDER_SECONDS (here, for ever).
    """
    monkeypatch.setattr(committer, "SUMMARY_RIDER_SECONDS", 3600.0)  # a batch that rides never commits in the test
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    summarizer = RecordingSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=BACKLOG_CONFIG) as engine:
        session = engine.session("s")
        await session.add([Episode("user", f"turn {turn}") for turn in range(1, 61)])
        evicted = (await session.context()).evicted_through
        assert evicted is not None and evicted >= 50
        if backlog == "delete":
            await session.context(wait_for_summary=True)  # (the read has every batch committed at once)
            calls = len(summarizer.calls)
            assert await session.delete_episodes([2]) == 1  # every summary is dropped: all of it again
        else:
            calls = 0
        with anyio.fail_after(GUARD):
            while not summarizer.calls[calls:] or summarizer.calls[-1][-1] < evicted:  # noqa: ASYNC110
                await anyio.sleep(0.01)  # the summarizer is called for the last batch once the others are stored
        assert len(summarizer.calls) - calls >= 10
    # The last batch rode, and committed as the engine closed: the summary covers every evicted episode.
    (through, text), *_ = sorted(stored.summaries("s"), reverse=True)
    assert through == evicted
    assert covered(text) == [f"turn {n}" for n in range(1, evicted + 1) if not (backlog == "delete" and n == 2)]


async def test_a_read_waiting_for_a_summary_still_being_made_commits_no_boundary_alone(db_path, monkeypatch) -> None:
    """Hurrying riders for a read helps only if its summary rides: boundaries alone would be a commit for nothing."""
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    summarizer = GatedSummarizer()
    transactions = Transactions()
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=summarizer, config=CONFIG) as engine:
            session = engine.session("s")
            await session.context()
            engine.store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            for turn in range(1, 4):
                await session.add([Episode("user", f"turn {turn}")])  # an eviction boundary rides
            await summarizer.wait_until_called()
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(session.context, wait_for_summary=True))
                await anyio.wait_all_tasks_blocked()
                summarizer.release()
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    alone = [t for t in transactions.committed if writes(t) and all(s.startswith(BOUNDARY) for s in writes(t))]
    assert alone == []
    summary_commits = [t for t in transactions.committed if any(s.startswith(SUMMARY) for s in t)]
    assert len(summary_commits) == 1 and any(s.startswith(BOUNDARY) for s in summary_commits[0])


async def test_a_backlogs_summaries_ride_along_with_adds_that_come(db_path, monkeypatch) -> None:
    """While adds come, each batch of a backlog rides with one: no summary costs a commit of its own."""
    monkeypatch.setattr(committer, "BACKLOG_RIDER_SECONDS", 3600.0)  # never alone: only with an add
    monkeypatch.setattr(committer, "SUMMARY_RIDER_SECONDS", 3600.0)
    monkeypatch.setattr(committer, "RIDER_SECONDS", 3600.0)
    summarizer = RecordingSummarizer()
    transactions = Transactions()
    with anyio.fail_after(GUARD):
        async with open_engine(db_path, summarizer=summarizer, config=BACKLOG_CONFIG) as engine:
            session = engine.session("s")
            await session.context()
            engine.store._conn.set_trace_callback(transactions)  # type: ignore[attr-defined]
            await session.add([Episode("user", f"turn {turn}") for turn in range(1, 31)])  # a backlog of batches
            for turn in range(31, 41):
                await anyio.wait_all_tasks_blocked()  # the batch's summary is made, and rides
                await session.add([Episode("user", f"turn {turn}")])
            await anyio.wait_all_tasks_blocked()
            engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    with_summaries = [t for t in transactions.committed if any(s.startswith(SUMMARY) for s in t)]
    assert len(with_summaries) >= 5  # the backlog's batches, one per add
    for statements in with_summaries:
        assert any(s.startswith("INSERT INTO episodes") for s in statements), statements
