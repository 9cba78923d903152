"""Runs the OpenAI Agents SDK's own session tests against MemEngineSession.

Each test gets its own engine (a SQLite file in its tmp_path), opened twice
over (see the fixture); the SDK's tests reach it through
tests.agents_sdk.vendored.shim.SQLiteSession.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from memengine import SessionConfig, open_engine

from .shim import current

# The SDK's tests in test_sdk_session.py and test_sdk_session_limit.py that read or
# write SQLiteSession's internals, each naming them (quoted in the skip marker).
_CONNECTIONS = "reads SQLiteSession._connections (its per-thread sqlite3 connections)"
_CORRUPT_ROW = (
    "writes a row into SQLiteSession's own table (session.messages_table, through session._locked_connection())"
)
_WRITE_LOCK = "reads SQLiteSession._connections and the sqlite3 write lock on its own database file, db_path"
_FAILING_CONNECTION = "puts a sqlite3 connection of its own into SQLiteSession._connections and _get_connection"
NOT_APPLICABLE = {
    "test_await_mutation_cancellation_hides_later_failure_without_loop_error": (
        "calls agents.memory.sqlite_session._await_mutation, a private helper of SQLiteSession's module"
    ),
    "test_sqlite_session_close_closes_worker_thread_connections": _CONNECTIONS,
    "test_sqlite_session_reaps_connections_from_exited_worker_threads": _CONNECTIONS,
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation": _CONNECTIONS,
    "test_sqlite_session_keeps_connections_of_live_worker_threads": _CONNECTIONS,
    "test_sqlite_session_closed_rejects_empty_add_items": (
        "calls SQLiteSession.close() and matches its RuntimeError 'SQLiteSession is closed': close() is "
        "SQLiteSession's own, not in the Session protocol (a MemEngineSession holds no resource to close; "
        "the engine's lifetime is the open_engine block)"
    ),
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": _CORRUPT_ROW,
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _CORRUPT_ROW,
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _CORRUPT_ROW,
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _CORRUPT_ROW,
    "test_sqlite_session_file_lock_is_shared_across_instances": (
        "reads SQLiteSession._lock, SQLiteSession._file_locks and SQLiteSession._file_lock_counts"
    ),
    "test_sqlite_session_failed_clear_session_rolls_back": (
        "drops SQLiteSession's table agent_sessions from db_path; " + _WRITE_LOCK
    ),
    "test_sqlite_session_failed_pop_item_releases_write_lock": (
        "drops SQLiteSession's table agent_messages from db_path; " + _WRITE_LOCK
    ),
    "test_sqlite_session_rollback_failure_evicts_connection": _FAILING_CONNECTION,
    "test_sqlite_session_close_retries_quarantined_connection": (
        _FAILING_CONNECTION + ", and reads SQLiteSession._closed and _quarantined_connections"
    ),
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": (
        _FAILING_CONNECTION + " (memengine's rule, that a caller cancelled after sending still has its operation "
        "carried out, is tested in tests/agents_sdk/test_openai_agents_session.py)"
    ),
}

# Run, and expected to fail only where they read SQLiteSession's internals, after the session's part has passed:
# each fails with exactly this error (strict: a pass, or any other failure, fails the suite).
READS_INTERNALS_LAST = {
    "test_sqlite_session_failed_add_items_releases_write_lock": (
        sqlite3.OperationalError,
        "after add_items([unserializable]) raised TypeError as it should, probes SQLiteSession's table "
        "agent_sessions in db_path with sqlite3 (no such table: memengine's store is elsewhere); the rest "
        "(the session usable after the failure) is "
        "test_an_item_that_is_not_json_serializable_raises_type_error_as_the_sdk_sessions_do",
    ),
}

# Not applicable with the engine on the test's own event loop only.
BLOCKS_THE_LOOP = {
    "test_sqlite_session_concurrent_access": (
        "blocks the test's event loop (a sync thread pool) while its threads call the session; with the engine "
        "on that loop they wait for it for ever. Runs with the engine in a thread of its own"
    ),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = NOT_APPLICABLE.get(getattr(item, "originalname", item.name))
        callspec = getattr(item, "callspec", None)
        on_test_loop = (
            callspec is not None and callspec.params.get("memengine_for_sdk_tests") == "engine on the test's loop"
        )
        if reason is None and on_test_loop and getattr(item, "originalname", "") in BLOCKS_THE_LOOP:
            reason = BLOCKS_THE_LOOP[item.originalname]
        if item.path.parent != Path(__file__).parent:
            continue
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"SDK test not applicable to memengine: {reason}"))
        elif (last := READS_INTERNALS_LAST.get(getattr(item, "originalname", item.name))) is not None:
            error, why = last
            item.add_marker(pytest.mark.xfail(raises=error, strict=True, reason=why))


@pytest.fixture(autouse=True, params=["engine on the test's loop", "engine in a thread of its own"])
async def memengine_for_sdk_tests(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[None]:
    """An engine with a window no SDK test fills, for the shim's sessions.

    Twice: on the test's own event loop (a portal onto it serves the calls made
    from other threads), and in a thread of its own behind a blocking portal
    (every call crosses threads).
    """
    config = SessionConfig(max_episodes=100_000, max_chars=100_000_000)
    if request.param == "engine on the test's loop":
        async with open_engine(tmp_path / "sdk.db", config=config) as engine, BlockingPortal() as portal:
            current.engine, current.portal = engine, portal
            try:
                yield
            finally:
                current.engine = current.portal = None
        return
    with (
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(open_engine(tmp_path / "sdk.db", config=config)) as engine,
    ):
        current.engine, current.portal = engine, portal
        try:
            yield
        finally:
            current.engine = current.portal = None
