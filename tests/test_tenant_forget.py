"""One user's data in one call: ``engine.forget`` and ``engine.export`` over a tenant's sessions.

On both stores and both async libraries, checked on the rows each table
holds and on what the engine answers: nothing of the forgotten tenant is
left anywhere (journal, summaries, recall index, outbox, session and lease
rows, the engine's memory), nothing of the other tenants changes, and an
export holds exactly the tenant's episodes and summaries.
"""

from __future__ import annotations

import io
import json

import anyio
import pytest

from memengine import Episode, ForgetIncompleteError, SessionConfig, open_engine
from memengine.privacy.export import write_json_lines
from memengine.privacy.forget import ForgetReport

from .conftest import StoreRows
from .fakes import ForgettingSink, GatedSummarizer, RecordingSummarizer, StuckSink

pytestmark = pytest.mark.anyio

SMALL = SessionConfig(evict_to=0.5, max_episodes=4, retain_every=3, passivate_after=None)
#: Every table that holds a session id.
SESSION_TABLES = ("episodes", "summaries", "sessions", "session_leases", "retain_outbox", "unfinished_appends")


def traces(rows: StoreRows, prefix: str) -> dict[str, int]:
    """How many rows of each table belong to sessions whose ids start with ``prefix`` (only the non-zero ones)."""
    found = {}
    for table in SESSION_TABLES:
        ((count,),) = rows.query(
            f"SELECT count(*) FROM {table} WHERE substr(session_id, 1, length(?)) = ?", prefix, prefix
        )
        if count:
            found[table] = count
    return found


def others(rows: StoreRows, prefix: str) -> dict[str, list[tuple]]:
    """Every row of the sessions not under ``prefix``, table by table (lease owners and expiries move: left out)."""
    columns = {
        "session_leases": "session_id, token",
        "retain_outbox": "id, session_id, first_seq, last_seq, episodes",
    }
    return {
        table: rows.query(
            f"SELECT {columns.get(table, '*')} FROM {table} WHERE substr(session_id, 1, length(?)) <> ? ORDER BY 1, 2",
            prefix,
            prefix,
        )
        for table in SESSION_TABLES
    }


async def filled(engine, tenants: dict[str, int], turns: int = 7) -> None:
    for tenant, sessions in tenants.items():
        for chat in range(sessions):
            session = engine.session(f"{tenant}/chat-{chat}")
            await session.add([Episode("user", f"{tenant} zebra secret {chat} turn {n}") for n in range(turns)])
            await session.context(wait_for_summary=True)


async def test_forgetting_a_tenant_erases_everything_of_it_and_nothing_else(store_url, rows) -> None:
    sink = ForgettingSink()
    sink.gate = anyio.Event()  # batches stay in the outbox; the first of each session is in the sink's hands
    async with open_engine(
        store_url, summarizer=RecordingSummarizer(), config=SMALL, retain_sink=sink, retain_grace=0
    ) as engine:
        await filled(engine, {"alice": 3, "alicex": 1, "bob": 2})
        # One of alice's sessions only activated (a lease row, nothing stored), one with an unfinished add marker.
        await engine.session("alice/empty").context()
        assert traces(rows, "alice/").keys() >= {"episodes", "summaries", "sessions", "session_leases", "retain_outbox"}
        with anyio.fail_after(60):
            while sink.entered < 6:  # noqa: ASYNC110 (each session's first batch reached the sink, which holds it)
                await anyio.sleep(0.01)
        before = others(rows, "alice/")
        planned = await engine.forget(tenant="alice", dry_run=True)
        assert planned == ForgetReport("tenant 'alice'", 4, 21, planned.summaries, planned.outbox_batches, dry_run=True)
        assert planned.summaries >= 3 and planned.outbox_batches >= 3
        assert traces(rows, "alice/")  # a dry run erases nothing

        report = await engine.forget(tenant="alice")

        # The sink holds each chat's first batch in flight: those three stay in the outbox, emptied, their
        # sessions' rows with them, until the sink's call ends and its forget follows.
        assert report == ForgetReport(
            "tenant 'alice'", 4, 21, planned.summaries, planned.outbox_batches - 3, waiting_for_sink=3
        )
        left = traces(rows, "alice/")
        assert left.keys() <= {"sessions", "session_leases", "retain_outbox"} and left["sessions"] == 3, left
        assert rows.query("SELECT DISTINCT episodes FROM retain_outbox WHERE substr(session_id, 1, 6) = 'alice/'") == [
            ("[]",)
        ]
        assert others(rows, "alice/") == before
        for chat in range(3):
            assert not engine.is_active(f"alice/chat-{chat}")
        assert await engine.recall("zebra secret", tenant="alice", limit=100) == []
        assert {hit.session_id for hit in await engine.recall("zebra", all_sessions=True, limit=1000)} == {
            "alicex/chat-0",
            "bob/chat-0",
            "bob/chat-1",
        }
        if not store_url.startswith("postgresql://"):
            # The full-text index itself holds no entry of the erased rows.
            ((indexed,),) = rows.query("SELECT count(*) FROM episodes_fts WHERE episodes_fts MATCH 'zebra'")
            assert indexed == 7 * 3

        # The sink finishes its calls and is told to forget each chat; then forgetting again leaves nothing.
        sink.gate.set()
        with anyio.fail_after(60):
            while rows.query("SELECT count(*) FROM retain_outbox WHERE substr(session_id, 1, 6) = 'alice/'") != [(0,)]:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert sorted(
            (request.session_id, request.seqs) for request in sink.forgets if request.session_id.startswith("alice/")
        ) == [(f"alice/chat-{chat}", None) for chat in range(3)]
        assert all(not sink.held.get(f"alice/chat-{chat}") for chat in range(3))
        again = await engine.forget(tenant="alice")
        assert (again.episodes, again.summaries, again.outbox_batches, again.waiting_for_sink) == (0, 0, 0, 0)
        assert traces(rows, "alice/") == {}
        # Forgetting again finds nothing; a later call starts a new, empty session.
        assert await engine.forget(tenant="alice") == ForgetReport("tenant 'alice'", 0, 0, 0, 0)
        context = await engine.session("alice/chat-0").context()
        assert (context.summary, context.episodes) == (None, ())
        (again_added,) = await engine.session("alice/chat-0").add([Episode("user", "a new start")])
        assert again_added.seq == 1


async def test_a_forgotten_session_is_not_brought_back_by_its_activation_nor_its_summarizer(store_url, rows) -> None:
    summarizer = GatedSummarizer()  # the summary of the evicted turns is in flight during the forget
    async with open_engine(store_url, summarizer=summarizer, config=SMALL) as engine:
        session = engine.session("carol/chat")
        await session.add([Episode("user", f"carol turn {n}") for n in range(6)])
        await summarizer.wait_until_called()
        await engine.forget(session_id="carol/chat")
        summarizer.release()
        context = await session.context()
        assert (context.summary, context.episodes) == (None, ())
        assert traces(rows, "carol/") == {"session_leases": 1}  # the new activation's lease, nothing else
    assert traces(rows, "carol/") == {"session_leases": 1}


async def test_a_session_larger_than_one_transaction_is_erased_in_steps(store_url, rows, monkeypatch) -> None:
    from memengine.store import committer

    monkeypatch.setattr(committer, "TRANSACTION_ROWS", 50)
    async with open_engine(store_url, config=SessionConfig(max_episodes=1000, passivate_after=None)) as engine:
        await engine.session("dave/big").add([Episode("user", f"line {n}") for n in range(230)])
        await engine.session("erin/small").add([Episode("user", "kept")])
        report = await engine.forget(prefix="dave/")
        assert (report.sessions, report.episodes) == (1, 230)
    assert traces(rows, "dave/") == {}
    assert rows.query("SELECT content FROM episodes") == [("kept",)]


async def test_an_erased_lease_never_hands_out_a_token_again(store_url, rows) -> None:
    for _ in range(3):  # three activations, each releasing the lease at exit: the token grows
        async with open_engine(store_url) as engine:
            await engine.session("frank/chat").add([Episode("user", "hello")])
    ((held,),) = rows.query("SELECT token FROM session_leases WHERE session_id = 'frank/chat'")
    assert held == 3
    async with open_engine(store_url) as engine:
        await engine.forget(tenant="frank")
        assert traces(rows, "frank/") == {}
        await engine.session("frank/chat").add([Episode("user", "again")])
        await engine.session("gina/new").add([Episode("user", "a new session")])
    # The erasure ran under token held + 1, the floor now: every new lease row starts above it.
    assert rows.query("SELECT session_id, token FROM session_leases ORDER BY session_id") == [
        ("frank/chat", held + 2),
        ("gina/new", held + 2),
    ]


async def test_export_writes_exactly_the_tenants_episodes_and_summaries(store_url) -> None:
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=SMALL) as engine:
        await filled(engine, {"alice": 2, "alicex": 1, "bob": 1}, turns=6)
        await engine.session("alice/chat-1").delete_episodes([2])
        out = io.StringIO()
        assert await write_json_lines(engine.export(tenant="alice"), out) == (2, 11)
        records = [json.loads(line) for line in out.getvalue().splitlines()]
        assert [(r["type"], r["session_id"], r.get("seq")) for r in records] == [
            ("session", "alice/chat-0", None),
            *(("episode", "alice/chat-0", seq) for seq in range(1, 7)),
            ("session", "alice/chat-1", None),
            *(("episode", "alice/chat-1", seq) for seq in (1, 3, 4, 5, 6)),
        ]
        first = records[0]
        context = await engine.session("alice/chat-0").context(wait_for_summary=True)
        assert (first["summary"], first["summarized_through"], first["episodes"]) == (
            context.summary,
            context.summarized_through,
            6,
        )
        episode = records[1]
        assert episode["content"] == "alice zebra secret 0 turn 0" and episode["role"] == "user"
        assert set(episode) == {"type", "session_id", "seq", "id", "role", "content", "metadata", "created_at"}
        assert [r["session_id"] async for r in engine.export(session_id="bob/chat-0") if r["type"] == "session"] == [
            "bob/chat-0"
        ]
        assert [r async for r in engine.export(tenant="nobody")] == []
        with pytest.raises(TypeError):  # an export across every user is not offered
            engine.export(all_sessions=True)  # type: ignore[call-arg]


async def test_export_reads_a_large_tenant_a_page_at_a_time(store_url, monkeypatch) -> None:
    from memengine.privacy import export

    monkeypatch.setattr(export, "EPISODES_PER_PAGE", 7)
    monkeypatch.setattr(export, "SESSIONS_PER_PAGE", 3)
    async with open_engine(store_url, config=SessionConfig(max_episodes=100, passivate_after=None)) as engine:
        for chat in range(8):
            await engine.session(f"hal/{chat}").add([Episode("user", f"{chat}.{n}") for n in range(20)])
        stream = engine.export(tenant="hal")
        seen = [(r["session_id"], r.get("seq")) async for r in stream]
        assert seen == [(f"hal/{chat}", seq) for chat in range(8) for seq in (None, *range(1, 21))]


async def test_forget_and_export_need_exactly_one_scope() -> None:
    async with open_engine(":memory:") as engine:
        with pytest.raises(ValueError, match="forget takes exactly one scope"):
            await engine.forget()
        with pytest.raises(ValueError, match="forget takes exactly one scope"):
            await engine.forget(tenant="a", prefix="a/")
        with pytest.raises(ValueError, match="must not contain '/'"):
            await engine.forget(tenant="a/b")
        with pytest.raises(TypeError, match="dry_run must be a bool"):
            await engine.forget(tenant="a", dry_run="yes")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="export takes exactly one scope"):
            engine.export()


def test_forget_incomplete_names_what_is_left() -> None:
    from memengine import SessionBusyError

    error = ForgetIncompleteError(
        ForgetReport("tenant 'a'", 3, 10, 1, 0), {"a/x": SessionBusyError("a/x", "other-host:1:ab", 4.0, 12.0)}
    )
    assert "3 sessions erased, 1 not (session 'a/x'" in str(error) and "call forget again" in str(error)


def test_on_sqlite_the_erased_bytes_leave_the_file_and_reindex_purges_the_index(tmp_path, capsys) -> None:
    from memengine.cli import main

    db = tmp_path / "memory.db"

    async def scenario() -> None:
        async with open_engine(str(db)) as engine:
            for chat in range(30):
                await engine.session(f"alice/{chat}").add([Episode("user", f"zanzibar secret {chat} " * 20)])
                await engine.session(f"bob/{chat}").add([Episode("user", f"bob keeps {chat} " * 20)])
            await engine.recall("index everything", all_sessions=True)
            await engine.forget(tenant="alice")

    def occurrences(word: bytes) -> int:
        return sum(path.read_bytes().count(word) for path in tmp_path.iterdir() if path.is_file())

    anyio.run(scenario)
    # Overwritten in the journal's pages. The full-text index's segments may still hold the word (no query
    # returns it; FTS5 drops it when it merges them), and nothing else in the file does.
    rows = StoreRows(str(db))
    assert rows.query("SELECT count(*) FROM episodes_fts WHERE episodes_fts MATCH 'zanzibar'") == [(0,)]
    index_pages = sum(
        block.count(b"zanzibar")
        for (block,) in rows.query("SELECT block FROM episodes_fts_data WHERE block IS NOT NULL")
    )
    assert occurrences(b"zanzibar") == index_pages
    assert main(["reindex", str(db)]) == 0
    assert occurrences(b"zanzibar") == 0
    assert occurrences(b"bob keeps") > 0


async def test_a_recorded_forget_replays(tmp_path) -> None:
    from memengine.replay import replay

    log = tmp_path / "messages.jsonl"
    async with open_engine(str(tmp_path / "first.db"), record_to=log) as engine:
        await engine.session("ivy/chat").add([Episode("user", "to be forgotten")])
        await engine.forget(tenant="ivy")
        await engine.session("ivy/chat").add([Episode("user", "after")])
    assert [json.loads(line).get("type") for line in log.read_text().splitlines()][1:] == ["add", "forget", "add"]
    async with open_engine(str(tmp_path / "second.db")) as engine:
        report = await replay(log, engine)
        assert report.mismatches == ()
        assert [record["content"] async for record in engine.export(tenant="ivy") if record["type"] == "episode"] == [
            "after"
        ]


async def test_what_a_clear_leaves_for_the_sink_keeps_the_sessions_row_until_delivered(
    store_url, rows, monkeypatch
) -> None:
    from memengine.store import outbox

    # As when clear() records something for the sink to deliver: here its undelivered batch stays.
    monkeypatch.setattr(outbox, "drop_session", lambda db, session_id: None)
    config = SessionConfig(retain_every=2, passivate_after=None)
    async with open_engine(store_url, config=config, retain_sink=StuckSink(), retain_grace=0) as engine:
        await engine.session("jo/chat").add([Episode("user", f"jo {n}") for n in range(2)])
        report = await engine.forget(tenant="jo")
        assert (report.sessions, report.episodes, report.waiting_for_sink) == (1, 2, 1)
        assert traces(rows, "jo/").keys() == {"sessions", "session_leases", "retain_outbox"}
        assert not engine.is_active("jo/chat") or (await engine.session("jo/chat").context()).episodes == ()
        rows.query("DELETE FROM retain_outbox WHERE session_id = 'jo/chat'")  # delivered
        again = await engine.forget(tenant="jo")
        assert (again.sessions, again.episodes, again.waiting_for_sink) == (1, 0, 0)
        assert traces(rows, "jo/") == {}


@pytest.mark.parametrize("last", ["\ud7ff", "\U0010ffff", "/", "%", "_"])
async def test_a_prefix_reaches_exactly_its_ids_whatever_its_last_character(store_url, last) -> None:
    inside = [f"x{last}", f"x{last}a", f"x{last}{last}"]
    outside = ["x", "y", f"X{last}", "x\ue000", "xa", "x0"]
    async with open_engine(store_url) as engine:
        for session_id in inside + outside:
            await engine.session(session_id).add([Episode("user", f"in {session_id}")])
        exported = [r["session_id"] async for r in engine.export(prefix=f"x{last}") if r["type"] == "session"]
        assert sorted(exported) == sorted(inside)
        assert (await engine.forget(prefix=f"x{last}", dry_run=True)).sessions == len(inside)
        assert (await engine.forget(prefix=f"x{last}")).sessions == len(inside)
        left = [r["session_id"] async for r in engine.export(prefix="x") if r["type"] == "session"]
        assert sorted(left) == sorted(i for i in outside if i.startswith("x"))


async def test_a_session_id_used_again_after_its_forget_gets_keys_its_sink_never_saw(store_url, rows) -> None:
    """A sink that drops keys it has seen must not drop a second life's batches (seqs start at 1 again)."""
    sink = ForgettingSink()
    config = SessionConfig(retain_every=2, passivate_after=None)
    async with open_engine(store_url, config=config, retain_sink=sink, retain_grace=0) as engine:
        session = engine.session("kim/chat")
        for life, calls in (("first", 3), ("second", 6)):
            added = await session.add([Episode("user", f"{life} life {n}") for n in range(2)])
            assert [episode.seq for episode in added] == [1, 2]
            await sink.wait_for(calls // 3)
            await session.delete_episodes([1])  # a forget of seq 1
            await engine.forget(tenant="kim")  # a forget of the whole session
            with anyio.fail_after(60):
                await sink.wait_for_calls(calls)
            await engine.forget(tenant="kim")  # what waited for the sink goes too
            assert traces(rows, "kim/") == {}
    assert sink.calls_made == [("retain", (1, 2)), ("forget", (1,)), ("forget", None)] * 2
    keys = [batch.key for batch in sink.batches] + [request.key for request in sink.forgets]
    assert len(set(keys)) == 6, keys
