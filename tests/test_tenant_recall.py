"""Recall is scoped: one session, one tenant ("tenant/..."), a prefix, or every session only when asked.

On both stores and both async libraries: a recall without a scope fails, and
a scoped recall never returns another tenant's episode, whatever characters
the ids hold (``%`` and ``_`` are not wildcards, case counts).
"""

from __future__ import annotations

import pytest

from memengine import Episode, open_engine
from memengine.scope import Scope, tenant_of, tenant_prefix

pytestmark = pytest.mark.anyio

# Ids that a LIKE pattern without escaping, or a case-insensitive LIKE, would mix up.
SESSIONS = {
    "alice/chat-1": "alice likes the blue kayak",
    "alice/chat-2": "alice booked the kayak trip",
    "alicex/chat": "alicex kayak",
    "Alice/chat": "capital Alice kayak",
    "al%e/one": "percent kayak",
    "alXe/one": "wildcard victim kayak",
    "a_c/one": "underscore kayak",
    "abc/one": "underscore victim kayak",
    "bob/chat-1": "bob kayak",
    "alice": "no tenant kayak",
}


async def stored_everywhere(engine) -> None:
    for session_id, content in SESSIONS.items():
        await engine.session(session_id).add([Episode("user", content)])


def sessions_of(hits) -> set[str]:
    return {hit.session_id for hit in hits}


async def test_a_recall_without_a_scope_is_refused_and_names_the_options(store_url) -> None:
    async with open_engine(store_url) as engine:
        await stored_everywhere(engine)
        with pytest.raises(ValueError, match=r"exactly one scope: session_id=.*tenant=.*prefix=.*all_sessions=True"):
            await engine.recall("kayak")
        with pytest.raises(ValueError, match="got tenant and all_sessions"):
            await engine.recall("kayak", tenant="alice", all_sessions=True)
        with pytest.raises(ValueError, match="got session_id and prefix"):
            await engine.recall("kayak", session_id="alice/chat-1", prefix="alice/")
        with pytest.raises(ValueError, match="got none"):
            await engine.recall("kayak", all_sessions=False)
        with pytest.raises(TypeError, match="all_sessions must be a bool"):
            await engine.recall("kayak", all_sessions="yes")  # type: ignore[arg-type]
        assert sessions_of(await engine.recall("kayak", all_sessions=True, limit=100)) == set(SESSIONS)


async def test_a_tenant_recall_finds_exactly_that_tenants_sessions(store_url) -> None:
    async with open_engine(store_url) as engine:
        await stored_everywhere(engine)
        assert sessions_of(await engine.recall("kayak", tenant="alice", limit=100)) == {"alice/chat-1", "alice/chat-2"}
        assert sessions_of(await engine.recall("kayak", tenant="Alice", limit=100)) == {"Alice/chat"}
        assert sessions_of(await engine.recall("kayak", tenant="bob", limit=100)) == {"bob/chat-1"}
        assert sessions_of(await engine.recall("kayak", tenant="al%e", limit=100)) == {"al%e/one"}
        assert sessions_of(await engine.recall("kayak", tenant="a_c", limit=100)) == {"a_c/one"}
        assert await engine.recall("kayak", tenant="nobody", limit=100) == []
        # Only as many as asked, still all of the tenant's.
        (best,) = await engine.recall("kayak", tenant="alice", limit=1)
        assert best.session_id.startswith("alice/")


async def test_a_prefix_is_matched_literally_on_both_stores(store_url) -> None:
    async with open_engine(store_url) as engine:
        await stored_everywhere(engine)
        assert sessions_of(await engine.recall("kayak", prefix="al%", limit=100)) == {"al%e/one"}
        assert sessions_of(await engine.recall("kayak", prefix="a_", limit=100)) == {"a_c/one"}
        assert sessions_of(await engine.recall("kayak", prefix="alice", limit=100)) == {
            "alice/chat-1",
            "alice/chat-2",
            "alicex/chat",
            "alice",
        }
        assert sessions_of(await engine.recall("kayak", prefix="alice/chat-1", limit=100)) == {"alice/chat-1"}
        assert sessions_of(await engine.recall("kayak", prefix="A", limit=100)) == {"Alice/chat"}
        assert sessions_of(await engine.recall("kayak", session_id="alice", limit=100)) == {"alice"}


async def test_scoped_recall_never_returns_another_tenants_episode(store_url) -> None:
    tenants = [f"t{n}" for n in range(6)] + ["t1_", "t%", "T1"]
    async with open_engine(store_url) as engine:
        for tenant in tenants:
            for chat in range(3):
                await engine.session(f"{tenant}/c{chat}").add(
                    [Episode("user", f"shared words owned by {tenant} number {turn}") for turn in range(4)]
                )
        for tenant in tenants:
            hits = await engine.recall("shared words owned number", tenant=tenant, limit=10_000)
            assert len(hits) == 12
            assert {hit.session_id.split("/")[0] for hit in hits} == {tenant}
            assert all(hit.episode.content.startswith(f"shared words owned by {tenant} ") for hit in hits)


@pytest.mark.parametrize(
    ("tenant", "error"),
    [
        ("", ValueError),
        ("  ", ValueError),
        ("a/b", ValueError),
        ("a\x00", ValueError),
        (7, TypeError),
        ("x" * 1023, ValueError),
    ],
)
async def test_a_bad_tenant_is_refused_before_anything_is_read(tenant, error) -> None:
    async with open_engine(":memory:") as engine:
        with pytest.raises(error):
            await engine.recall("kayak", tenant=tenant)


async def test_a_bad_prefix_is_refused() -> None:
    async with open_engine(":memory:") as engine:
        with pytest.raises(ValueError, match="prefix must be a non-empty string"):
            await engine.recall("kayak", prefix="")
        with pytest.raises(TypeError):
            await engine.recall("kayak", prefix=b"alice/")  # type: ignore[arg-type]


def test_the_tenant_convention() -> None:
    assert tenant_prefix("alice") == "alice/"
    assert tenant_of("alice/chat-1") == "alice"
    assert tenant_of("alice/team/chat") == "alice"
    assert tenant_of("alice") is None
    assert tenant_of("/x") is None
    assert str(Scope.of("export", tenant="alice")) == "tenant 'alice'"
    assert str(Scope.of("export", prefix="al")) == "sessions under 'al'"
    assert Scope.of("x", tenant="a%").includes("a%/1") and not Scope.of("x", tenant="a%").includes("ab/1")
    with pytest.raises(ValueError, match="does not take all_sessions"):
        Scope.of("forget", all_sessions=True, allow_all=False)
