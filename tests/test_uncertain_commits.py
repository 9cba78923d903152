"""A commit in doubt makes the session reload from the store before its next operation, for every write.

When the connection goes while committing, the store cannot know whether the
transaction landed: it raises :class:`UncertainCommitError`. The session's
memory may then disagree with the store, so the activation gives the session
up, and the next call loads it again. These tests make a COMMIT land and then
fail (as a connection lost right after the server committed) below the store,
on SQLite and PostgreSQL, and check what users see afterwards: no deleted text readable, no spurious
"seq already taken", waiting reads answered, the session passivating.
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, UncertainCommitError, open_engine

from .conftest import StoreRows
from .fakes import CommitThenLoseConnection, GatedSummarizer, RecordingSummarizer, covered, turns

pytestmark = pytest.mark.anyio

GUARD = 10


def episodes(rows: StoreRows, session_id: str) -> list[tuple]:
    return rows.query("SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", session_id)


def summaries(rows: StoreRows, session_id: str) -> list[tuple]:
    return rows.query(
        "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq", session_id
    )


async def wait_until_passivated(engine, session_id: str) -> None:
    with anyio.fail_after(GUARD):
        while engine.is_active(session_id):  # noqa: ASYNC110 - polling the engine's registry
            await anyio.sleep(0.01)


async def test_a_clear_in_doubt_never_leaves_the_cleared_text_readable(store_url, rows: StoreRows) -> None:
    # Idle for 2 s before it passivates: the commit that passivating makes must not come between arming
    # and the clear and be the one "lost" (with 0.05 s it did under load: DID NOT RAISE).
    config = SessionConfig(evict_to=1.0, max_episodes=2, passivate_after=2.0)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "my password is hunter2"), *turns(3)])
        await session.context(wait_for_summary=True)
        commits = CommitThenLoseConnection(engine.store)
        commits.arm()
        with pytest.raises(UncertainCommitError):
            await session.clear()
        assert commits.lost == 1 and episodes(rows, "s") == []
        context = await session.context()  # reloaded from the store
        assert context.summary is None and context.episodes == ()
        with anyio.fail_after(GUARD):
            assert (await session.context(wait_for_summary=True)).episodes == ()
        await session.add([Episode("user", "after the clear")])
        assert [e.content for e in (await session.context()).episodes] == ["after the clear"]
        await wait_until_passivated(engine, "s")
    assert [content for _, content in episodes(rows, "s")] == ["after the clear"]
    assert summaries(rows, "s") == []


async def test_a_delete_in_doubt_shows_what_the_store_holds(store_url, rows: StoreRows) -> None:
    config = SessionConfig(evict_to=1.0, max_episodes=2, passivate_after=None)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "my password is hunter2"), *turns(4)])
        await session.context(wait_for_summary=True)
        CommitThenLoseConnection(engine.store).arm()
        with pytest.raises(UncertainCommitError):
            await session.delete_episodes([1])
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
        assert "my password is hunter2" not in covered(context.summary) + [e.content for e in context.episodes]
        assert covered(context.summary) + [e.content for e in context.episodes] == [f"turn {i}" for i in range(1, 5)]
    assert all("hunter2" not in summary for _, summary in summaries(rows, "s"))


async def test_an_add_waiting_behind_an_add_in_doubt_gets_the_next_seq(store_url, rows: StoreRows) -> None:
    config = SessionConfig(passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        commits = CommitThenLoseConnection(engine.store)
        commits.arm(hold=True)
        outcomes: dict[str, object] = {}

        async def add(name: str) -> None:
            try:
                outcomes[name] = [e.seq for e in await session.add([Episode("user", name, id=name)])]
            except Exception as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(add, "first")  # its commit is held, then lands, then is reported in doubt
            await anyio.wait_all_tasks_blocked()
            tasks.start_soon(add, "second")  # handled while the first is in flight: waits for it
            await anyio.wait_all_tasks_blocked()
            commits.release()
        assert isinstance(outcomes["first"], UncertainCommitError)
        assert outcomes["second"] == [4]  # after the first, which did land: no "seq 3 is already taken"
        (retried,) = await session.add([Episode("user", "first", id="first")])  # the retry finds it stored
        assert retried.seq == 3
    assert [content for _, content in episodes(rows, "s")] == ["turn 1", "turn 2", "first", "second"]


async def test_an_add_cancelled_behind_an_add_in_doubt_is_still_stored(store_url, rows: StoreRows) -> None:
    """Its caller gave up waiting, but it was sent: the activation giving the session up hands it on.

    (It was dropped: a cancelled add then waited for ever to be seen, in the property test.)
    """
    config = SessionConfig(passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        commits = CommitThenLoseConnection(engine.store)
        commits.arm(hold=True)

        async def add_in_doubt() -> None:
            with pytest.raises(UncertainCommitError):
                await session.add([Episode("user", "first")])

        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(add_in_doubt)  # its commit is held, then lands, then is reported in doubt
                await anyio.wait_all_tasks_blocked()
                async with anyio.create_task_group() as given_up:
                    given_up.start_soon(session.add, [Episode("user", "second")])  # waits behind the first
                    await anyio.wait_all_tasks_blocked()
                    given_up.cancel_scope.cancel()  # its caller stops waiting; the add was sent
                commits.release()
            (third,) = await session.add([Episode("user", "third")])  # handled after the second
        assert third.seq == 5
    assert [content for _, content in episodes(rows, "s")] == ["turn 1", "turn 2", "first", "second", "third"]


async def test_an_add_cancelled_while_its_lease_lapsed_is_stored_by_the_next_activation(
    store_url, rows: StoreRows
) -> None:
    """Its own append is refused (the lease lapsed) and nobody waits for the answer: it is handed on, not dropped."""
    config = SessionConfig(passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(2))
        rows.query("UPDATE session_leases SET expires_at = 0 WHERE session_id = ?", "s")  # this process was paused
        commits = CommitThenLoseConnection(engine.store)
        commits.arm(hold=True)  # the refused append's transaction ends in a commit held until its caller left
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as given_up:
                given_up.start_soon(session.add, [Episode("user", "given up")])
                await anyio.wait_all_tasks_blocked()
                given_up.cancel_scope.cancel()
            commits.release()
            (after,) = await session.add([Episode("user", "after")])
        assert after.seq == 4
    assert [content for _, content in episodes(rows, "s")] == ["turn 1", "turn 2", "given up", "after"]


async def test_a_clear_cancelled_while_its_lease_lapsed_is_carried_out_by_the_next_activation(
    store_url, rows: StoreRows
) -> None:
    """A clear nobody waits for any more is refused (the lease lapsed): the next activation still clears."""
    config = SessionConfig(passivate_after=None)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "my password is hunter2")])
        rows.query("UPDATE session_leases SET expires_at = 0 WHERE session_id = ?", "s")  # this process was paused
        commits = CommitThenLoseConnection(engine.store)
        commits.arm(hold=True)  # the refused clear's transaction ends in a commit held until its caller left
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as given_up:
                given_up.start_soon(session.clear)
                await anyio.wait_all_tasks_blocked()
                given_up.cancel_scope.cancel()
            commits.release()
            await session.add([Episode("user", "after")])
        assert [e.content for e in (await session.context()).episodes] == ["after"]
    assert [content for _, content in episodes(rows, "s")] == ["after"]


async def test_a_summary_in_doubt_is_not_redone_on_stale_memory(store_url, rows: StoreRows) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(evict_to=1.0, max_episodes=2, passivate_after=None)
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add(turns(3))
        await summarizer.wait_until_called()
        CommitThenLoseConnection(engine.store).arm()
        summarizer.release()
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
        assert covered(context.summary) + [e.content for e in context.episodes] == [f"turn {i}" for i in (1, 2, 3)]
        await session.add(turns(1, start=4))
        with anyio.fail_after(GUARD):
            context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == ["turn 1", "turn 2"]
    assert summaries(rows, "s")[-1] == (2, "turn 1|turn 2")


async def test_an_activation_in_doubt_is_simply_taken_again(store_url, rows: StoreRows) -> None:
    async with open_engine(store_url, config=SessionConfig(passivate_after=None)) as engine:
        commits = CommitThenLoseConnection(engine.store)
        commits.arm()  # the first commit is the activation's (lease and load)
        (first,) = await engine.session("s").add([Episode("user", "first")])
        assert commits.lost == 1 and first.seq == 1
    assert episodes(rows, "s") == [(1, "first")]
