"""One set of tests every store backend must pass: SQLite and PostgreSQL.

Each test runs on both backends (``store_url``) and both async libraries, and
checks what the store really holds (``rows`` reads the tables behind its back).
Two stores opened on one database stand for two processes: each has its own
connection and its own owner name. PostgreSQL tests are skipped, with the
reason shown, only when no server is reachable.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from memengine import Episode, LeaseLostError, SessionBusyError, StoreError
from memengine.scope import EVERY_SESSION, Scope
from memengine.store.base import Completion, OutboxEntry
from memengine.store.open import open_store

pytestmark = pytest.mark.anyio

TTL = 60.0


@asynccontextmanager
async def two_processes(url: str) -> AsyncIterator[tuple]:
    async with open_store(url, owner="process-a") as a, open_store(url, owner="process-b") as b:
        yield a, b


async def append(store, session_id: str, token: int, first_seq: int, *episodes: Episode):
    """Append through the group committer and wait for the completion; return (results, error)."""
    outcome: dict[str, object] = {}
    done = anyio.Event()

    def complete(result, error) -> None:
        outcome["result"], outcome["error"] = result, error
        done.set()

    store.submit_append(session_id, token, first_seq, list(episodes), complete)
    await done.wait()
    return outcome["result"], outcome["error"]


def says(*contents: str) -> list[Episode]:
    return [Episode("user", content) for content in contents]


def collected(count: int) -> tuple[dict[str, object], anyio.Event, Callable[[str], Completion[Any]]]:
    """Completions by name: each records its result (or error) in ``outcomes``; ``done`` once ``count`` did."""
    outcomes: dict[str, object] = {}
    done = anyio.Event()

    def completion(name: str) -> Completion[Any]:
        def complete(result: object, error: BaseException | None) -> None:
            outcomes[name] = error if error is not None else result
            if len(outcomes) == count:
                done.set()

        return complete

    return outcomes, done, completion


async def test_appends_get_dense_seqs_and_re_sent_ids_are_skipped(store_url, rows) -> None:
    async with open_store(store_url) as store:
        token, snapshot = await store.activate("s", TTL)
        assert snapshot.last_seq == 0 and snapshot.episodes == ()
        first = Episode("user", "one", id="e1")
        results, error = await append(store, "s", token, 1, first, *says("two"))
        assert error is None and [(e.seq, new) for e, new in results] == [(1, True), (2, True)]
        results, error = await append(store, "s", token, 3, Episode("user", "one again", id="e1"), *says("three"))
        assert error is None
        assert [(e.seq, e.content, new) for e, new in results] == [(1, "one", False), (3, "three", True)]
        snapshot = await store.load_session("s")
        assert [(e.seq, e.content) for e in snapshot.episodes] == [(1, "one"), (2, "two"), (3, "three")]
    assert rows.query("SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", "s") == [
        (1, "one"),
        (2, "two"),
        (3, "three"),
    ]


async def test_appends_of_many_sessions_submitted_together_and_a_stale_one_fails_alone(store_url, rows) -> None:
    async with open_store(store_url) as store:
        tokens = {name: (await store.activate(name, TTL))[0] for name in "abc"}
        await append(store, "a", tokens["a"], 1, *says("a1"))
        outcomes = []
        async with anyio.create_task_group() as group:
            for name, first_seq in (("b", 1), ("a", 1), ("c", 1)):  # "a" reuses seq 1: stale

                async def one(name: str = name, first_seq: int = first_seq) -> None:
                    outcomes.append((name, await append(store, name, tokens[name], first_seq, *says(f"{name} new"))))

                group.start_soon(one)
    errors = {name: error for name, (_, error) in outcomes}
    assert isinstance(errors["a"], StoreError) and errors["b"] is None and errors["c"] is None
    assert rows.query("SELECT session_id, seq, content FROM episodes ORDER BY session_id, seq") == [
        ("a", 1, "a1"),
        ("b", 1, "b new"),
        ("c", 1, "c new"),
    ]


async def test_summaries_are_upserted_and_fenced_by_generation(store_url, rows) -> None:
    async with open_store(store_url) as store:
        token, _ = await store.activate("s", TTL)
        await append(store, "s", token, 1, *says("one", "two", "three"))
        generation = (await store.load_session("s")).generation
        assert await store.store_summary("s", token, generation, 2, "first try")
        assert await store.store_summary("s", token, generation, 2, "second try")  # same key: no integrity error
        assert rows.query("SELECT through_seq, summary FROM summaries WHERE session_id = ?", "s") == [(2, "second try")]
        snapshot = await store.load_session("s")
        assert (snapshot.summary, snapshot.summarized_through) == ("second try", 2)
        assert [e.seq for e in snapshot.episodes] == [3]
        await store.delete_episodes("s", token, [3])  # a new generation
        assert not await store.store_summary("s", token, generation, 3, "stale")
    assert rows.query("SELECT through_seq, summary FROM summaries WHERE session_id = ?", "s") == [(2, "second try")]


async def test_delete_and_clear_remove_episodes_and_every_summary_of_them(store_url, rows) -> None:
    async with open_store(store_url) as store:
        token, _ = await store.activate("s", TTL)
        await append(store, "s", token, 1, *says("one", "two", "three", "four"))
        generation = (await store.load_session("s")).generation
        await store.store_summary("s", token, generation, 1, "of one")
        await store.store_summary("s", token, generation, 3, "of one to three")
        deleted, snapshot = await store.delete_episodes("s", token, [2, 99])
        assert deleted == 1 and snapshot.generation > generation
        assert (snapshot.summary, snapshot.summarized_through) == ("of one", 1)
        assert [e.seq for e in snapshot.episodes] == [3, 4]
        snapshot = await store.clear_session("s", token)
        assert snapshot.episodes == () and snapshot.summary is None and snapshot.last_seq == 4
        results, _ = await append(store, "s", token, snapshot.last_seq + 1, *says("after clear"))
        assert [e.seq for e, _ in results] == [5]  # seqs are never reused
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]
    assert rows.query("SELECT seq, content FROM episodes") == [(5, "after clear")]


async def test_a_session_leased_by_one_process_is_busy_for_another(store_url) -> None:
    async with two_processes(store_url) as (a, b):
        token, _ = await a.activate("s", TTL)
        with pytest.raises(SessionBusyError) as busy:
            await b.activate("s", TTL)
        assert busy.value.owner == "process-a" and busy.value.session_id == "s"
        assert "process-a" in str(busy.value) and 0 < busy.value.expires_in <= TTL
        await a.release_lease("s", token)
        taken, _ = await b.activate("s", TTL)
        assert taken == token + 1  # tokens only grow


async def test_writes_under_a_stale_token_are_refused_and_store_nothing(store_url, rows) -> None:
    async with two_processes(store_url) as (a, b):
        old, _ = await a.activate("s", 1.0)
        _, error = await append(a, "s", old, 1, *says("one"))
        assert error is None
        await anyio.sleep(1.2)  # a's lease expires (a "paused" owner)
        new, snapshot = await b.activate("s", TTL)
        assert new > old and [e.content for e in snapshot.episodes] == ["one"]
        generation = snapshot.generation
        _, error = await append(a, "s", old, 2, *says("from the paused owner"))
        assert isinstance(error, LeaseLostError)
        for write in (
            a.store_summary("s", old, generation, 1, "stale summary"),
            a.delete_episodes("s", old, [1]),
            a.clear_session("s", old),
            a.enqueue_retain("s", old, "append"),
        ):
            with pytest.raises(LeaseLostError):
                await write
        assert await a.renew_leases([("s", old)], TTL) == set()
        assert await b.renew_leases([("s", new)], TTL) == {"s"}
        _, error = await append(b, "s", new, 2, *says("from the new owner"))
        assert error is None
    assert rows.query("SELECT seq, content FROM episodes ORDER BY seq") == [(1, "one"), (2, "from the new owner")]
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_an_expired_but_untaken_lease_refuses_writes(store_url, rows) -> None:
    async with open_store(store_url) as store:
        token, _ = await store.activate("s", 0.5)
        await anyio.sleep(0.7)
        _, error = await append(store, "s", token, 1, *says("late"))
        assert isinstance(error, LeaseLostError)
        assert await store.renew_leases([("s", token)], TTL) == set()  # an expired lease is not revived
        again, _ = await store.activate("s", TTL)
        assert again == token + 1
    assert rows.query("SELECT count(*) FROM episodes") == [(0,)]


async def test_the_outbox_sends_each_session_in_order_under_one_claim(store_url, rows) -> None:
    async with two_processes(store_url) as (a, b):
        token, _ = await a.activate("s", TTL)
        await append(a, "s", token, 1, *says("one", "two", "three"))
        await a.enqueue_retain("s", token, "append")
        await append(a, "s", token, 4, *says("four"))
        assert await a.enqueue_retain("s", token, "append") == 4
        first, second = await b.pending_retains(10)
        assert (first.first_seq, first.last_seq, second.first_seq, second.last_seq) == (1, 3, 4, 4)
        assert await b.claim_retain(second.id, second.key, TTL) == "busy"  # not the oldest of its session
        claimed = await b.claim_retain(first.id, first.key, TTL)
        assert [e.content for e in claimed.episodes] == ["one", "two", "three"]
        assert await a.claim_retain(first.id, first.key, TTL) == "busy"  # b holds it
        await b.mark_retained(first.id, first.key)
        assert await a.claim_retain(first.id, first.key, TTL) == "gone"
        claimed = await a.claim_retain(second.id, second.key, TTL)
        assert [e.content for e in claimed.episodes] == ["four"]
        await a.mark_retain_failed(second.id, second.key, "sink down")
        retried = await b.claim_retain(second.id, second.key, TTL)  # a failure lets the claim go
        assert isinstance(retried, OutboxEntry) and retried.attempts == 1
        state = await a.outbox_state()
        assert state.depth == 1


async def test_delete_revises_and_clear_drops_undelivered_batches(store_url, rows) -> None:
    async with open_store(store_url) as store:
        token, _ = await store.activate("s", TTL)
        await append(store, "s", token, 1, *says("keep", "secret", "keep too"))
        await store.enqueue_retain("s", token, "append")
        await store.delete_episodes("s", token, [2])
        (entry,) = await store.pending_retains(10)
        assert [e.content for e in entry.episodes] == ["keep", "keep too"]
        await store.clear_session("s", token)
        assert await store.pending_retains(10) == []
    assert rows.query("SELECT count(*) FROM retain_outbox") == [(0,)]


async def test_retain_tails_and_pending_summaries_skip_sessions_owned_elsewhere(store_url) -> None:
    async with two_processes(store_url) as (a, b):
        for name in ("mine", "theirs"):
            token, _ = await a.activate(name, TTL)
            await append(a, name, token, 1, *says("one", "two", "three"))
            if name == "mine":
                await a.release_lease(name, token)
        assert await b.enqueue_all_retains("append") == ["mine"]
        assert await b.sessions_needing_summary(2, 10_000) == ["mine"]
        assert await a.sessions_needing_summary(2, 10_000) == ["mine", "theirs"]
        assert await b.enqueue_all_retains("append", orphaned_only=True) == []  # "theirs" is alive


async def test_recall_finds_stored_words_and_never_deleted_ones(store_url) -> None:
    async with open_store(store_url) as store:
        token, _ = await store.activate("s", TTL)
        other, _ = await store.activate("t", TTL)
        await append(store, "s", token, 1, *says("the cat sat on the mat", "a dog barked", "secret cat plans"))
        await append(store, "t", other, 1, *says("another cat"))
        found = await store.recall("cat", EVERY_SESSION, 10)
        assert {(hit.session_id, hit.episode.seq) for hit in found} == {("s", 1), ("s", 3), ("t", 1)}
        assert all(hit.score > 0 for hit in found)
        assert [hit.episode.content for hit in await store.recall("dog OR", Scope(session_id="s"), 10)] == [
            "a dog barked"
        ]
        await store.delete_episodes("s", token, [3])
        assert {hit.episode.content for hit in await store.recall("secret cat", Scope(session_id="s"), 10)} == {
            "the cat sat on the mat"
        }
        assert await store.recall("'\")(*", EVERY_SESSION, 10) == []  # no query syntax reaches the engine


async def test_two_processes_opening_a_fresh_database_at_once_both_start(store_url) -> None:
    opened = []

    async def open_one(name: str) -> None:
        async with open_store(store_url, owner=name) as store:
            token, _ = await store.activate(name, TTL)
            await append(store, name, token, 1, *says(f"hello from {name}"))
            opened.append(name)

    async with anyio.create_task_group() as group:
        for name in ("first", "second", "third"):
            group.start_soon(open_one, name)
    assert sorted(opened) == ["first", "second", "third"]


async def test_a_newer_schema_is_refused_with_a_clear_error(store_url, rows) -> None:
    async with open_store(store_url):
        pass
    if store_url.startswith("postgresql://"):
        rows.query("UPDATE memengine_schema SET version = 99 RETURNING version")
    else:
        rows.query("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match="newer than this memengine understands"):
        async with open_store(store_url):
            pass


async def test_a_busy_session_does_not_fail_the_operations_sharing_its_transaction(store_url, rows) -> None:
    async with two_processes(store_url) as (a, b):
        await a.activate("held", TTL)
        token, _ = await b.activate("mine", TTL)
        outcomes: dict[str, object] = {}

        async def activate_held() -> None:
            try:
                await b.activate("held", TTL)
            except SessionBusyError as busy:
                outcomes["held"] = busy

        async def add_mine() -> None:
            outcomes["mine"] = await append(b, "mine", token, 1, *says("mine"))

        async with anyio.create_task_group() as group:
            group.start_soon(activate_held)
            group.start_soon(add_mine)
    assert isinstance(outcomes["held"], SessionBusyError) and outcomes["mine"][1] is None
    assert rows.query("SELECT content FROM episodes") == [("mine",)]


async def test_evictions_and_appends_sharing_a_transaction_are_each_checked_against_their_own_lease(
    store_url, rows
) -> None:
    """A transaction runs its appends together and its eviction boundaries together; a stale lease fails its own."""
    async with two_processes(store_url) as (a, b):
        tokens = {name: (await a.activate(name, TTL))[0] for name in ("s1", "s2", "s3")}
        for name in tokens:
            _, error = await append(a, name, tokens[name], 1, *says("one", "two", "three"))
            assert error is None
        stale = tokens["s2"]
        await a.release_lease("s2", stale)
        tokens["s2"], _ = await b.activate("s2", TTL)  # another process has s2 now
        outcomes, done, completion = collected(6)

        # All six in one batch (nothing awaits in between): evictions and appends interleaved, one of each stale.
        a.submit_eviction("s1", tokens["s1"], 2, completion("evict s1"))
        a.submit_append("s1", tokens["s1"], 4, says("four"), completion("add s1"))
        a.submit_eviction("s2", stale, 2, completion("evict s2"))
        a.submit_append("s2", stale, 4, says("stale four"), completion("add s2"))
        a.submit_eviction("s3", tokens["s3"], 3, completion("evict s3"))
        a.submit_append("s3", tokens["s3"], 4, says("four"), completion("add s3"))
        with anyio.fail_after(30):
            await done.wait()
    assert isinstance(outcomes["evict s2"], LeaseLostError) and isinstance(outcomes["add s2"], LeaseLostError)
    assert outcomes["evict s1"] is None and outcomes["evict s3"] is None
    assert [e.seq for e, _ in outcomes["add s1"]] == [4] and [e.seq for e, _ in outcomes["add s3"]] == [4]  # type: ignore[union-attr]
    assert rows.query("SELECT session_id, evicted_through FROM sessions ORDER BY session_id") == [
        ("s1", 2),
        ("s2", 0),
        ("s3", 3),
    ]
    assert rows.query("SELECT session_id, max(seq) FROM episodes GROUP BY session_id ORDER BY session_id") == [
        ("s1", 4),
        ("s2", 3),
        ("s3", 4),
    ]


async def test_a_stale_boundary_beside_appends_whose_leases_hold_fails_alone(store_url, rows) -> None:
    """The appends' lease query covers the boundaries' sessions too; a stale boundary's lease fails it alone."""
    async with two_processes(store_url) as (a, b):
        tokens = {name: (await a.activate(name, TTL))[0] for name in ("s1", "s2")}
        for name in tokens:
            _, error = await append(a, name, tokens[name], 1, *says("one", "two"))
            assert error is None
        stale = tokens["s2"]
        await a.release_lease("s2", stale)
        await b.activate("s2", TTL)  # another process has s2 now
        outcomes, done, completion = collected(3)

        # One batch: s1's boundary and append, and a boundary of s2 under the lease it lost (no append of s2).
        # The boundaries wait to ride along; the append starts the transaction that takes them.
        a.submit_eviction("s1", tokens["s1"], 2, completion("evict s1"))
        a.submit_eviction("s2", stale, 2, completion("evict s2"))
        a.submit_append("s1", tokens["s1"], 3, says("three"), completion("add s1"))
        with anyio.fail_after(30):
            await done.wait()
    assert [e.seq for e, _ in outcomes["add s1"]] == [3]  # type: ignore[union-attr]
    assert outcomes["evict s1"] is None and isinstance(outcomes["evict s2"], LeaseLostError)
    assert rows.query("SELECT session_id, evicted_through FROM sessions ORDER BY session_id") == [("s1", 2), ("s2", 0)]
    assert rows.query("SELECT session_id, max(seq) FROM episodes GROUP BY session_id ORDER BY session_id") == [
        ("s1", 3),
        ("s2", 2),
    ]


async def test_a_re_sent_id_among_appends_of_one_transaction_is_skipped_and_the_rest_stored(store_url, rows) -> None:
    """Appends run as one statement; one that carries a stored id sends the transaction down the one-by-one path."""
    async with open_store(store_url) as store:
        tokens = {name: (await store.activate(name, TTL))[0] for name in ("s1", "s2", "s3")}
        for name in tokens:
            _, error = await append(store, name, tokens[name], 1, Episode("user", "one", id=f"{name}-e1"))
            assert error is None
        outcomes, done, completion = collected(5)

        # All in one transaction: two evictions and three appends, the second of which sends s2's
        # first episode again before a new one, and (on SQLite; PostgreSQL renews on a connection
        # of its own) a lease renewal, which runs first and must survive the transaction being run again.
        renewed: dict[str, object] = {}
        (expires_before,) = rows.query("SELECT expires_at FROM session_leases WHERE session_id = ?", "s1")[0]

        async def renew() -> None:
            renewed["sessions"] = await store.renew_leases([("s1", tokens["s1"])], TTL)

        release = threading.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(store._submit, lambda db: release.wait(10))  # the committer's thread waits meanwhile
            with anyio.fail_after(10):
                while not store._thread_busy:  # noqa: ASYNC110 - polls the committer's state (no event to wait on)
                    await anyio.sleep(0.01)
                tasks.start_soon(renew)
                while not (store._urgent or renewed):  # noqa: ASYNC110 - likewise
                    await anyio.sleep(0.01)
            store.submit_eviction("s1", tokens["s1"], 1, completion("evict s1"))
            store.submit_append("s1", tokens["s1"], 2, says("s1 two"), completion("add s1"))
            again = Episode("user", "one, sent again", id="s2-e1")
            store.submit_append("s2", tokens["s2"], 2, [again, *says("s2 two")], completion("add s2"))
            store.submit_append("s3", tokens["s3"], 2, says("s3 two", "s3 three"), completion("add s3"))
            store.submit_eviction("s3", tokens["s3"], 1, completion("evict s3"))
            release.set()
            with anyio.fail_after(30):
                await done.wait()
    assert renewed["sessions"] == {"s1"}
    (expires_after,) = rows.query("SELECT expires_at FROM session_leases WHERE session_id = ?", "s1")[0]
    assert expires_after > expires_before
    assert outcomes["evict s1"] is None and outcomes["evict s3"] is None
    added = {name: [(e.seq, e.content, new) for e, new in outcomes[f"add {name}"]] for name in tokens}  # type: ignore[union-attr]
    assert added == {
        "s1": [(2, "s1 two", True)],
        "s2": [(1, "one", False), (2, "s2 two", True)],
        "s3": [(2, "s3 two", True), (3, "s3 three", True)],
    }
    assert rows.query("SELECT session_id, seq, content FROM episodes ORDER BY session_id, seq") == [
        ("s1", 1, "one"),
        ("s1", 2, "s1 two"),
        ("s2", 1, "one"),
        ("s2", 2, "s2 two"),
        ("s3", 1, "one"),
        ("s3", 2, "s3 two"),
        ("s3", 3, "s3 three"),
    ]
    assert rows.query("SELECT session_id, evicted_through FROM sessions ORDER BY session_id") == [
        ("s1", 1),
        ("s2", 0),
        ("s3", 1),
    ]


async def test_connections_dropped_while_idle_are_replaced_and_nothing_fails(store_url) -> None:
    """A server restart or failover drops idle connections; psycopg only notices when one is used."""
    if not store_url.startswith("postgresql://"):
        pytest.skip("about PostgreSQL connections")
    import psycopg

    def drop(*connections: object) -> None:
        pids = [conn.info.backend_pid for conn in connections]  # type: ignore[attr-defined]
        with psycopg.connect(store_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))

    async with open_store(store_url) as store:
        token, _ = await store.activate("s", TTL)
        await append(store, "s", token, 1, *says("before"))
        assert await store.renew_leases([("s", token)], TTL) == {"s"}
        drop(store._conn, store._reader, store._renewals._conn)  # type: ignore[attr-defined]
        _, error = await append(store, "s", token, 2, *says("after"))  # the next batch meets the dead connection
        assert error is None
        assert [e.content for e in (await store.load_session("s")).episodes] == ["before", "after"]
        assert await store.renew_leases([("s", token)], TTL) == {"s"}
        drop(store._conn)  # type: ignore[attr-defined]
        other, snapshot = await store.activate("t", TTL)  # an activation (it fails every queued call if it fails)
        assert other >= 1 and snapshot.episodes == ()
