"""Forgetting a tenant whose sessions another process holds: handed over, erased, never brought back.

Real engine processes (tests/replica_worker.py) on one PostgreSQL schema and
one SQLite file: a *holder* keeps the tenant's sessions in memory (idle, or
paused with a summary in flight past its lease), an *eraser* forgets the
tenant. Checked on the rows of every table and on what the holder answers
afterwards: nothing of the tenant is left, the holder shows none of it, and
nothing the holder computed before lands later.
"""

from __future__ import annotations

import signal
import time

from .conftest import StoreRows
from .test_replicas import Worker, stored_summaries_by
from .test_tenant_forget import traces


def test_an_idle_session_another_process_holds_is_handed_over_and_erased(store_url: str) -> None:
    holder = Worker(store_url, "trio", "holder", "serve", MEMENGINE_TEST_PASSIVATE_AFTER="60")
    eraser = None
    try:
        for chat in range(3):
            contents = [f"alice chat {chat} turn {n}" for n in range(6)]
            assert holder.ask(op="add", session=f"alice/chat-{chat}", contents=contents)["op"] == "ack"
        assert holder.ask(op="add", session="bob/chat", contents=["bob stays"])["seqs"] == [1]
        assert holder.ask(op="context", session="alice/chat-0", wait=True)["summary"] is not None
        assert holder.ask(op="active", session="alice/chat-0")["active"] is True
        eraser = Worker(store_url, "asyncio", "eraser", "serve")
        forgot = eraser.ask(op="forget", tenant="alice")
        assert forgot["op"] == "erased" and (forgot["sessions"], forgot["episodes"]) == (3, 18), forgot
        assert traces(StoreRows(store_url), "alice/") == {}
        # The holder let them go (nothing of them is in its memory), and serves bob as before.
        for chat in range(3):
            assert holder.ask(op="active", session=f"alice/chat-{chat}")["active"] is False
        assert [[seq, content] for seq, _, content in holder.ask(op="context", session="bob/chat")["episodes"]] == [
            [1, "bob stays"]
        ]
        context = holder.ask(op="context", session="alice/chat-0")
        assert (context["summary"], context["episodes"]) == (None, [])
        assert holder.ask(op="add", session="alice/chat-0", contents=["a new start"])["seqs"] == [1]
        for worker in (holder, eraser):
            worker.ask(op="exit")
            worker.finish()
    finally:
        holder.stop()
        if eraser is not None:
            eraser.stop()
    rows = StoreRows(store_url)
    assert rows.query("SELECT session_id, seq, content FROM episodes ORDER BY session_id") == [
        ("alice/chat-0", 1, "a new start"),
        ("bob/chat", 1, "bob stays"),
    ]


def test_a_paused_holder_cannot_write_a_forgotten_session_back(store_url: str) -> None:
    ttl = "1.0"
    holder = Worker(
        store_url,
        "trio",
        "holder",
        "serve",
        MEMENGINE_TEST_LEASE_TTL=ttl,
        MEMENGINE_TEST_SUMMARY_DELAY="1.5",
        MEMENGINE_TEST_LEASE_WAIT="0",
        MEMENGINE_TEST_PASSIVATE_AFTER="60",
    )
    eraser = None
    try:
        for n in range(1, 6):
            assert holder.ask(op="add", session="alice/chat", contents=[f"turn {n}"])["seqs"] == [n]
        holder.pause_outside_a_write(store_url)  # mid-summary, holding the lease and the window in memory
        time.sleep(2.0)  # past its lease
        eraser = Worker(store_url, "asyncio", "eraser", "serve", MEMENGINE_TEST_LEASE_TTL=ttl)
        forgot = eraser.ask(op="forget", tenant="alice")
        assert forgot["op"] == "erased" and (forgot["sessions"], forgot["episodes"]) == (1, 5), forgot
        assert traces(StoreRows(store_url), "alice/") == {}
        holder.kill(signal.SIGCONT)
        time.sleep(2.0)  # its summary call ends and tries to store; its renewal runs and fails
        answer = holder.ask(op="add", session="alice/chat", contents=["after the forget"])
        # Either refused (its lease is gone) or stored in a new, empty session: never on top of the old one.
        assert answer["op"] == "error" or answer["seqs"] == [1], answer
        context = holder.ask(op="context", session="alice/chat", wait=True)
        assert context["summary"] is None or "turn" not in context["summary"], context
        assert all(not content.startswith("turn") for _, _, content in context["episodes"]), context
        for worker in (holder, eraser):
            worker.ask(op="exit")
            worker.finish()
    finally:
        holder.kill(signal.SIGCONT) if holder.process.poll() is None else None
        holder.stop()
        if eraser is not None:
            eraser.stop()
    rows = StoreRows(store_url)
    assert [c for (c,) in rows.query("SELECT content FROM episodes") if c.startswith("turn")] == []
    # The holder's summary of turns 1-4, in flight across the erasure, never landed (nor any other of them).
    assert stored_summaries_by(rows) == set()
