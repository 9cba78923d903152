"""Owner liveness on PostgreSQL, where a live process can lose its lock (store/owners.py, store/liveness.py).

An advisory lock held by an open transaction ends with its connection: when a process dies,
but also when only its connection was dropped (a killed backend, a server
restart). So what another process finds dead on PostgreSQL is released only
after a grace, unless it is a process of the same machine whose pid is gone;
and a live process takes its lock back within a heartbeat, so it is never
released at all. Killed processes are covered in test_restart_after_kill.py.
"""

from __future__ import annotations

import contextlib

import anyio
import psycopg
import pytest

from memengine import Episode, LeaseLostError, SessionBusyError, SessionConfig, open_engine

from .conftest import postgres_schema, postgres_unreachable
from .fakes import GatedSummarizer

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(postgres_unreachable() is not None, reason=str(postgres_unreachable())),
]

CONFIG = SessionConfig(passivate_after=None, lease_wait=3.0)


@pytest.fixture
def pg_url():
    with postgres_schema() as url:
        yield url


def terminate_liveness_backend(url: str, lock_key: int) -> int:
    """Kill the server session that holds ``lock_key``: the lock ends with it, the process lives on."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s AND objsubid = 1",
            (lock_key,),
        ).fetchall()
    return len(rows)


async def test_a_live_engine_whose_lock_connection_dropped_keeps_its_sessions(pg_url) -> None:
    # a's session has a summary in flight, so it is not handed over to b (store/handover.py) either.
    summarizer = GatedSummarizer()
    busy = SessionConfig(passivate_after=None, lease_wait=3.0, max_episodes=1, evict_to=1.0)
    with anyio.fail_after(60):
        async with (
            open_engine(pg_url, config=busy, owner="a", summarizer=summarizer) as a,
            open_engine(pg_url, config=CONFIG, owner="b") as b,
        ):
            await a.session("s").add([Episode("user", "from a"), Episode("user", "evicted")])
            await summarizer.wait_until_called()
            assert terminate_liveness_backend(pg_url, a.store._liveness.lock_key) == 1  # type: ignore[attr-defined]
            # b finds a's lock gone, but a takes it back within a heartbeat, long before the grace ends.
            with pytest.raises(SessionBusyError) as busy:
                await b.session("s").add([Episode("user", "from b")])
            assert busy.value.owner == "a"
            (episode,) = await a.session("s").add([Episode("user", "a again")])
            assert episode.seq == 3
            assert (await a.session("s").context()).episodes[-1].content == "a again"
            summarizer.release()
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT content FROM episodes ORDER BY seq").fetchall() == [
            ("from a",),
            ("evicted",),
            ("a again",),
        ]
        assert conn.execute("SELECT count(*) FROM engine_owners").fetchone() == (0,)  # both left cleanly


async def test_a_dead_owner_of_another_machine_is_released_only_after_the_grace(pg_url) -> None:
    with anyio.fail_after(60):
        config = SessionConfig(passivate_after=None, lease_wait=0.3)  # a call gives up before the grace ends
        async with open_engine(pg_url, config=config, owner="survivor") as engine:
            store = engine.store
            store._liveness.grace = 1.0  # type: ignore[attr-defined]  # 5 s in production: a shorter test
            with psycopg.connect(pg_url, autocommit=True) as conn:
                # An engine of another machine that died holding a session and a retain claim.
                conn.execute(
                    "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at) "
                    "VALUES ('gone', 'remote', 12345, 'elsewhere/boot', 1, 0)"
                )
                conn.execute(
                    "INSERT INTO session_leases (session_id, owner, token, expires_at) "
                    "VALUES ('s', 'remote', 7, extract(epoch from clock_timestamp()) + 600)"
                )
                conn.execute(
                    "INSERT INTO retain_outbox (session_id, first_seq, last_seq, mode, key, episodes, created_at, "
                    "claimed_by, claim_until) VALUES ('s', 1, 1, 'append', 'k', '[]', 0, 'remote', "
                    "extract(epoch from clock_timestamp()) + 600)"
                )
            first = await store.reap_dead_owners()
            assert first.owners == () and first.waiting  # seen dead: the grace starts
            with pytest.raises(SessionBusyError):
                await engine.session("s").context()
            await anyio.sleep(1.2)
            assert (await store.reap_dead_owners(["remote"])).owners in (("remote",), ())  # or the watcher did
            with psycopg.connect(pg_url) as conn:
                lease_left, claim_left, owners = conn.execute(
                    "SELECT (SELECT expires_at FROM session_leases WHERE session_id = 's'), "
                    "(SELECT claim_until FROM retain_outbox), "
                    "(SELECT count(*) FROM engine_owners WHERE owner = 'remote')"
                ).fetchone()
                now = conn.execute("SELECT extract(epoch from clock_timestamp())::float8").fetchone()[0]
            assert lease_left <= now and claim_left <= now and owners == 0
            context = await engine.session("s").context()  # taken over now
            assert context.episodes == ()


async def test_a_reap_leaves_an_incarnation_registered_under_the_same_name_meanwhile(pg_url) -> None:
    """A restart under the dead owner's name registers while a reap of its former incarnation runs."""
    from memengine.store.dialect import Db, postgres_dialect
    from memengine.store.liveness import AdvisoryLiveness
    from memengine.store.owners import reap

    async with open_engine(pg_url, config=CONFIG, owner="survivor"):
        pass  # the schema
    restart_key = 4242
    with (
        psycopg.connect(pg_url, autocommit=True) as setup,
        psycopg.connect(pg_url, autocommit=True) as restart,
        psycopg.connect(pg_url) as reaping,
    ):
        setup.execute(
            "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at, dead_since) "
            "VALUES ('former', 'x', 4141, 'elsewhere/boot', 1, 0, 0)"  # dead long past any grace
        )
        restart.execute("SELECT pg_advisory_lock(%s)", (restart_key,))  # the restart's liveness lock

        class RestartMeanwhile(AdvisoryLiveness):
            """Finds what it is asked about, while the restart registers and takes a session by name."""

            def alive(self, db, incarnations):
                found = super().alive(db, incarnations)
                if not found:
                    restart.execute(
                        "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at) "
                        "VALUES ('restarted', 'x', %s, 'elsewhere/boot', 2, 0)",
                        (restart_key,),
                    )
                    restart.execute(
                        "INSERT INTO session_leases (session_id, owner, token, expires_at) "
                        "VALUES ('s', 'x', 1, extract(epoch from clock_timestamp()) + 600)"
                    )
                return found

        reap(Db(reaping, postgres_dialect()), RestartMeanwhile(lambda: None), "survivor", ["x"])
        reaping.commit()
        registered = setup.execute("SELECT incarnation FROM engine_owners ORDER BY incarnation").fetchall()
        (lease_left,) = setup.execute(
            "SELECT expires_at - extract(epoch from clock_timestamp()) FROM session_leases WHERE session_id = 's'"
        ).fetchone()
    assert registered == [("restarted",)]  # the former incarnation, proved dead, is gone; the restart is not
    assert lease_left > 500  # the restart keeps the session it took


async def test_a_restart_just_found_dead_gets_its_grace_though_a_former_incarnation_died_long_ago(pg_url) -> None:
    """An owner restarted under its name keeps its former incarnation's row while it lives (a reap of the former
    one stops at the living one). When the restart's own lock is lost for a moment (its connection killed), the
    grace counts from when *it* was found dead, not from the former incarnation's death: it is not reaped at once.
    (Seen in the chaos soak: a live replica reaped within a second of a connection kill, after restarts.)"""
    from memengine.store.dialect import Db, postgres_dialect
    from memengine.store.liveness import AdvisoryLiveness
    from memengine.store.owners import reap

    async with open_engine(pg_url, config=CONFIG, owner="survivor"):
        pass  # the schema
    with psycopg.connect(pg_url, autocommit=True) as setup, psycopg.connect(pg_url) as reaping:
        setup.execute(
            "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at, dead_since) VALUES "
            "('former', 'x', 4141, 'elsewhere/boot', 1, 0, 0), "  # found dead long ago
            "('restarted', 'x', 4343, 'elsewhere/boot', 2, 0, NULL)"  # alive until its lock was lost just now
        )
        setup.execute(
            "INSERT INTO session_leases (session_id, owner, token, expires_at) "
            "VALUES ('s', 'x', 1, extract(epoch from clock_timestamp()) + 600)"
        )
        liveness = AdvisoryLiveness(lambda: None)
        reaped = reap(Db(reaping, postgres_dialect()), liveness, "survivor", ["x"])
        reaping.commit()
        (lease_left,) = setup.execute(
            "SELECT expires_at - extract(epoch from clock_timestamp()) FROM session_leases WHERE session_id = 's'"
        ).fetchone()
        registered = setup.execute("SELECT count(*) FROM engine_owners WHERE owner = 'x'").fetchone()
    assert liveness.grace > 0
    assert reaped.owners == () and reaped.waiting  # found dead now: its grace starts now
    assert lease_left > 500 and registered == (2,)


async def test_a_reap_passes_over_claims_another_transaction_holds_and_comes_back_for_them(pg_url) -> None:
    claim = (
        "INSERT INTO retain_outbox (session_id, first_seq, last_seq, mode, key, episodes, created_at, claimed_by, "
        "claim_until) VALUES (%s, 1, 1, 'append', %s, '[]', 0, 'remote', extract(epoch from clock_timestamp()) + 600) "
        "RETURNING id"
    )
    with anyio.fail_after(60):
        async with open_engine(pg_url, config=CONFIG, owner="survivor") as engine:
            with psycopg.connect(pg_url, autocommit=True) as setup, psycopg.connect(pg_url) as locking:
                setup.execute(
                    "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at, dead_since) "
                    "VALUES ('gone', 'remote', 12345, 'elsewhere/boot', 1, 0, 0)"  # dead long past the grace
                )
                (locked,) = setup.execute(claim, ("s", "k1")).fetchone()
                (free,) = setup.execute(claim, ("t", "k2")).fetchone()
                locking.execute("SELECT 1 FROM retain_outbox WHERE id = %s FOR UPDATE", (locked,))  # held, not ended

                def claims() -> dict[int, bool]:
                    rows = setup.execute(
                        "SELECT id, claim_until > extract(epoch from clock_timestamp()) FROM retain_outbox"
                    ).fetchall()
                    return dict(rows)

                first = await engine.store.reap_dead_owners(["remote"])  # never waits for the locked row
                assert first.owners == ("remote",) and first.waiting
                assert claims() == {locked: True, free: False}
                assert setup.execute("SELECT count(*) FROM engine_owners WHERE owner = 'remote'").fetchone() == (1,)
                locking.rollback()
                await engine.store.reap_dead_owners(["remote"])  # (or the watcher did, committed before it)
                assert claims() == {locked: False, free: False}
                assert setup.execute("SELECT count(*) FROM engine_owners WHERE owner = 'remote'").fetchone() == (0,)


async def test_an_engine_reaped_while_its_lock_was_lost_does_not_answer_from_memory_after_taking_it_back(
    pg_url,
) -> None:
    """Lost lock, reaped meanwhile, lock taken back: its sessions may be another's now; memory is not the store."""
    long_lease = SessionConfig(passivate_after=None, lease_wait=0.5, lease_ttl=60.0)  # no renewal round meanwhile
    with anyio.fail_after(60):
        async with (
            open_engine(pg_url, config=long_lease, owner="a") as a,
            open_engine(pg_url, config=long_lease, owner="b") as b,
        ):
            await a.session("s").add([Episode("user", "from a")])
            b.store._liveness.grace = 0.0  # type: ignore[attr-defined]  # b reaps what it finds dead at once
            key = a.store._liveness.lock_key  # type: ignore[attr-defined]
            await reaped_after_losing_its_lock(b, pg_url, key, "a")
            await b.session("s").add([Episode("user", "from b")])  # a's session is b's now
            await a.store.keep_alive()  # a takes its lock back (or its heartbeat did)
            assert held_by_server(pg_url, key)
            try:
                context = await a.session("s").context()
            except (LeaseLostError, SessionBusyError):
                return  # refused: b has it
            assert [episode.content for episode in context.episodes] == ["from a", "from b"]  # or read afresh


async def reaped_after_losing_its_lock(reaper, url: str, lock_key: int, owner: str) -> None:
    """Drop ``owner``'s liveness connection until ``reaper`` reaps it (it takes its lock back within a heartbeat)."""
    while True:
        terminate_liveness_backend(url, lock_key)
        if (await reaper.store.reap_dead_owners([owner])).owners == (owner,):
            return
        await anyio.sleep(0.01)


def held_by_server(url: str, lock_key: int) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return bool(
            conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = %s AND objsubid = 1",
                (lock_key,),
            ).fetchone()[0]
        )


async def test_a_failed_registration_after_taking_the_lock_back_is_made_again(pg_url, monkeypatch) -> None:
    """Lock taken back, but its re-registration failed: a later heartbeat registers (and learns of the reap)."""
    from memengine.errors import StoreError
    from memengine.store import owners

    long_lease = SessionConfig(passivate_after=None, lease_wait=0.5, lease_ttl=60.0)
    register = owners.register
    refused: list[str] = []  # while this holds "a", a's registrations fail (its writes cannot reach the server)

    def refusing(db, owner, liveness):  # type: ignore[no-untyped-def]
        if owner in refused:
            raise StoreError("the connection dropped (injected)")
        return register(db, owner, liveness)

    monkeypatch.setattr(owners, "register", refusing)
    with anyio.fail_after(60):
        async with (
            open_engine(pg_url, config=long_lease, owner="a") as a,
            open_engine(pg_url, config=long_lease, owner="b") as b,
        ):
            await a.session("s").add([Episode("user", "from a")])
            b.store._liveness.grace = 0.0  # type: ignore[attr-defined]  # b reaps what it finds dead at once
            key = a.store._liveness.lock_key  # type: ignore[attr-defined]
            refused.append("a")
            await reaped_after_losing_its_lock(b, pg_url, key, "a")
            await b.session("s").add([Episode("user", "from b")])  # a's session is b's now
            while not held_by_server(pg_url, key):  # a takes its lock back; registering it fails
                with contextlib.suppress(StoreError):
                    await a.store.keep_alive()
            refused.clear()  # the server is reachable again: the heartbeats after this register
            for _ in range(3):
                await a.store.keep_alive()
            try:
                context = await a.session("s").context()
            except (LeaseLostError, SessionBusyError):
                return  # refused: b has it
            assert [episode.content for episode in context.episodes] == ["from a", "from b"]  # or read afresh
