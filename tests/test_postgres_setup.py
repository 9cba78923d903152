"""Setting PostgreSQL up the way operators do: an owner migrates, app roles only read and write.

Every test runs against the real test server (``MEMENGINE_TEST_POSTGRES``), in
schemas and roles of its own that it drops at the end. What is checked is what
an operator sees: which schema the rows land in, which settings the store's
connections run under, and the error (and the command it names) when the
schema is missing, old or too new.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memengine import Episode, SessionConfig, StoreError, open_engine
from memengine.cli import main
from memengine.scope import EVERY_SESSION
from memengine.store.open import open_store
from memengine.store.postgres import schema as postgres_schema

from .conftest import POSTGRES_SERVER, postgres_unreachable
from .conftest import postgres_schema as fresh_schema
from .fakes import RecordingSink, RecordingSummarizer, covered

pytestmark = pytest.mark.anyio


def admin(sql: str, *params: object) -> list[tuple]:
    import psycopg

    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []


def schema_of(url: str) -> str:
    return url.rsplit("%3D", 1)[1]


def with_search_path(*schemas: str, extra: str = "") -> str:
    return f"{POSTGRES_SERVER}?options=-csearch_path%3D{'%2C'.join(schemas)}{extra}"


def tables_in(schema: str) -> set[str]:
    return {name for (name,) in admin("SELECT tablename FROM pg_tables WHERE schemaname = %s", schema)}


@contextmanager
def empty_schemas(count: int) -> Iterator[list[str]]:
    """``count`` schema names, none created yet; any of them that exists at the end is dropped."""
    if (reason := postgres_unreachable()) is not None:
        pytest.skip(reason)
    names = [f"memengine_test_{uuid.uuid4().hex[:12]}" for _ in range(count)]
    try:
        yield names
    finally:
        for name in names:
            admin(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@contextmanager
def data_only_role(schema: str) -> Iterator[str]:
    """A login role with USAGE on ``schema`` and data rights on whatever tables it holds now.

    Yields its URL (with a password the server ignores, to check no message shows it).
    """
    role = f"memengine_app_{uuid.uuid4().hex[:12]}"
    admin(f"CREATE ROLE {role} LOGIN")
    try:
        admin(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        admin(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
        server = POSTGRES_SERVER.split("://", 1)[1].split("@", 1)[1]
        yield f"postgresql://{role}:hunter2@{server}?options=-csearch_path%3D{schema}"
    finally:
        admin(f"DROP OWNED BY {role}")
        admin(f"DROP ROLE {role}")


def unwrap(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def opening_fails(url: str) -> BaseException:
    try:
        async with open_engine(url):
            pass
    except BaseException as exc:  # the test looks at whatever came out
        return unwrap(exc)
    raise AssertionError(f"open_engine({url!r}) opened")


# -- 7: an owner migrates, app roles only read and write ------------------------------------


async def test_a_data_only_role_opens_the_engine_after_migrate(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_schema() as owner_url:
        assert main(["migrate", owner_url]) == 0
        assert f"from version 0 to {postgres_schema.SCHEMA_VERSION}" in capsys.readouterr().out
        with data_only_role(schema_of(owner_url)) as app_url:
            sink = RecordingSink()
            config = SessionConfig(max_episodes=3, retain_every=2, passivate_after=None)
            async with open_engine(
                app_url, summarizer=RecordingSummarizer(), retain_sink=sink, config=config
            ) as engine:
                session = engine.session("s")
                await session.add([Episode("user", "hello"), Episode("assistant", "hi")])
                await session.add([Episode("user", f"turn {n}") for n in range(3, 7)])
                assert covered((await session.context(wait_for_summary=True)).summary) == ["hello", "hi", "turn 3"]
                await sink.wait_for(1)
                await engine.session("gone").add([Episode("user", "bye")])
                await engine.session("gone").clear()
            async with open_engine(app_url, summarizer=RecordingSummarizer(), config=config) as engine:
                context = await engine.session("s").context()
                assert [e.content for e in context.episodes] == ["turn 4", "turn 5", "turn 6"]
                assert [r.episode.content for r in await engine.recall("hello", all_sessions=True)] == ["hello"]
            assert sink.delivered_contents()[:2] == ["hello", "hi"]
        assert main(["migrate", owner_url]) == 0
        assert f"already at version {postgres_schema.SCHEMA_VERSION}" in capsys.readouterr().out


async def test_a_data_only_role_against_an_empty_schema_is_told_to_run_migrate() -> None:
    with fresh_schema() as owner_url, data_only_role(schema_of(owner_url)) as app_url:
        error = await opening_fails(app_url)
        assert isinstance(error, StoreError), repr(error)
        assert "memengine migrate" in str(error)
        assert "hunter2" not in str(error)
        assert schema_of(owner_url) in str(error)
        assert tables_in(schema_of(owner_url)) == set()


async def test_a_data_only_role_against_an_old_schema_is_told_to_run_migrate() -> None:
    with fresh_schema() as owner_url:
        async with open_store(owner_url):
            pass
        admin(f"UPDATE {schema_of(owner_url)}.memengine_schema SET version = version - 1")
        with data_only_role(schema_of(owner_url)) as app_url:
            error = await opening_fails(app_url)
            assert isinstance(error, StoreError), repr(error)
            assert "memengine migrate" in str(error) and "hunter2" not in str(error)


async def test_opening_a_current_schema_writes_nothing_to_it() -> None:
    with fresh_schema() as url:
        async with open_engine(url):
            pass
        schema = schema_of(url)
        before = admin(f"SELECT xmin::text, version FROM {schema}.memengine_schema")
        async with open_engine(url):
            pass
        assert admin(f"SELECT xmin::text, version FROM {schema}.memengine_schema") == before


async def test_a_role_without_rights_on_the_tables_is_told_what_to_grant() -> None:
    with fresh_schema() as owner_url:
        async with open_store(owner_url):
            pass
        with data_only_role(schema_of(owner_url)) as app_url:
            role = app_url.split("://", 1)[1].split(":", 1)[0]
            admin(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema_of(owner_url)} FROM {role}")
            error = await opening_fails(app_url)
            assert isinstance(error, StoreError), repr(error)
            assert "GRANT" in str(error).upper() and "memengine_schema" in str(error)


def test_migrate_as_a_data_only_role_fails_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_schema() as owner_url, data_only_role(schema_of(owner_url)) as app_url:
        assert main(["migrate", app_url]) == 3  # the store cannot be used (as this role)
        err = capsys.readouterr().err
        assert err.startswith("memengine migrate: could not migrate") and err.count("\n") == 1
        assert "permission denied" in err and "hunter2" not in err


async def test_opening_waits_for_another_process_migration_longer_than_lock_timeout() -> None:
    import anyio
    import psycopg

    with fresh_schema() as url:
        holder = psycopg.connect(POSTGRES_SERVER)
        try:
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (postgres_schema.MIGRATION_LOCK,))
            async with anyio.create_task_group() as group:
                opened = anyio.Event()

                async def open_one() -> None:
                    async with open_store(url + "%20-c%20lock_timeout%3D200ms"):
                        opened.set()

                group.start_soon(open_one)
                with anyio.fail_after(10):
                    # The server's state, polled: there is nothing to wait on instead.
                    while not admin(  # noqa: ASYNC110
                        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
                        postgres_schema.MIGRATION_LOCK & 0xFFFFFFFF,
                    ):
                        await anyio.sleep(0.05)
                await anyio.sleep(0.5)  # past the opener's lock_timeout
                assert not opened.is_set()
                await anyio.to_thread.run_sync(holder.rollback)
                with anyio.fail_after(10):
                    await opened.wait()
        finally:
            holder.close()


def test_migrate_takes_a_sqlite_path_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from memengine.store.sqlite import schema as sqlite_schema

    db = tmp_path / "memory.db"
    assert main(["migrate", str(db)]) == 0
    assert f"from version 0 to {sqlite_schema.SCHEMA_VERSION}" in capsys.readouterr().out
    assert main(["migrate", str(db)]) == 0
    assert f"already at version {sqlite_schema.SCHEMA_VERSION}" in capsys.readouterr().out


# -- 8: one schema, resolved once ------------------------------------------------------------


async def test_a_new_schema_in_search_path_leaves_the_tables_where_they_are() -> None:
    with empty_schemas(2) as (new, old):
        admin(f"CREATE SCHEMA {old}")
        url = with_search_path(new, old)
        async with open_engine(url) as running:
            await running.session("a").add([Episode("user", "one")])
            admin(f"CREATE SCHEMA {new}")  # an operator's, for something else
            async with open_engine(url, owner="restarted") as restarted:  # a replica restarting meanwhile
                await restarted.session("b").add([Episode("user", "two")])
            (added,) = await running.session("a").add([Episode("user", "three")])
            assert added.seq == 2
        assert tables_in(new) == set()
        assert admin(f"SELECT session_id, seq FROM {old}.episodes ORDER BY session_id, seq") == [
            ("a", 1),
            ("a", 2),
            ("b", 1),
        ]


async def test_a_running_engine_keeps_its_schema_when_tables_appear_in_another() -> None:
    with empty_schemas(2) as (new, old):
        admin(f"CREATE SCHEMA {old}")
        name = f"memengine_test_{uuid.uuid4().hex[:8]}"
        url = with_search_path(new, old, extra=f"&application_name={name}")
        async with open_engine(url) as running:
            await running.session("a").add([Episode("user", "one")])
            admin(f"CREATE SCHEMA {new}")
            async with open_store(with_search_path(new)):  # memengine's tables, in the first schema now
                pass
            # The running engine's connections are lost too: the new ones must go to the old schema.
            admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", name)
            for _ in range(3):
                try:
                    await running.session("a").add([Episode("user", "two")])
                    break
                except StoreError:
                    continue
            context = await running.session("a").context()
            assert [e.content for e in context.episodes] == ["one", "two"]
        assert admin(f"SELECT seq, content FROM {old}.episodes ORDER BY seq") == [(1, "one"), (2, "two")]
        assert admin(f"SELECT count(*) FROM {new}.episodes") == [(0,)]


async def test_tables_in_two_schemas_of_search_path_refuse_to_open() -> None:
    with empty_schemas(2) as (first, second):
        for schema in (first, second):
            admin(f"CREATE SCHEMA {schema}")
            async with open_store(with_search_path(schema)):
                pass
        error = await opening_fails(with_search_path(first, second))
        assert isinstance(error, StoreError), repr(error)
        assert first in str(error) and second in str(error)


async def test_an_empty_search_path_schema_gets_the_tables() -> None:
    with empty_schemas(2) as (new, old):
        admin(f"CREATE SCHEMA {old}")
        async with open_engine(with_search_path(new, old)) as engine:
            await engine.session("s").add([Episode("user", "hello")])
        assert {"episodes", "memengine_schema"} <= tables_in(old)


async def test_a_schema_name_that_needs_quoting_is_pinned_as_it_is() -> None:
    from urllib.parse import quote

    with empty_schemas(1) as (plain,):
        schema = f"Memengine Test {plain[-12:]}"
        admin(f'CREATE SCHEMA "{schema}"')
        try:
            options = quote(f'-c search_path="{schema.replace(" ", chr(92) + " ")}"', safe="")
            async with open_engine(f"{POSTGRES_SERVER}?options={options}") as engine:
                await engine.session("s").add([Episode("user", "hello")])
                assert show(engine.store._reader, "search_path") == f'"{schema}"'  # type: ignore[attr-defined]
            assert admin(f'SELECT content FROM "{schema}".episodes') == [("hello",)]
        finally:
            admin(f'DROP SCHEMA "{schema}" CASCADE')


# -- rolling upgrades: the compatibility window ---------------------------------------------


async def test_a_newer_schema_that_declares_this_code_compatible_opens() -> None:
    with fresh_schema() as url:
        async with open_store(url):
            pass
        schema = schema_of(url)
        version = postgres_schema.SCHEMA_VERSION
        # What a newer memengine whose one new migration is additive records.
        admin(f"UPDATE {schema}.memengine_schema SET version = %s, compatible_back = 1", version + 1)
        async with open_engine(url) as engine:
            await engine.session("s").add([Episode("user", "hello")])
        assert admin(f"SELECT version FROM {schema}.memengine_schema") == [(version + 1,)]
        assert main(["migrate", url]) == 0  # leaves it as it is
        assert admin(f"SELECT version, compatible_back FROM {schema}.memengine_schema") == [(version + 1, 1)]


async def test_a_newer_schema_beyond_the_window_is_refused() -> None:
    with fresh_schema() as url:
        async with open_store(url):
            pass
        schema = schema_of(url)
        version = postgres_schema.SCHEMA_VERSION
        admin(f"UPDATE {schema}.memengine_schema SET version = %s, compatible_back = 0", version + 1)
        error = await opening_fails(url)
        assert isinstance(error, StoreError), repr(error)
        assert "upgrade memengine" in str(error)


def test_the_window_reaches_back_over_additive_migrations_only() -> None:
    from memengine.store.schema_window import compatible_from

    additive = [False, True, False, True, True]
    assert compatible_from(additive, 5) == 3
    assert compatible_from(additive, 3) == 3
    assert compatible_from(additive, 2) == 1
    assert compatible_from(additive, 0) == 0


# -- connections: bounded waits, overridable; prepared statements --------------------------


def show(conn: object, setting: str) -> str:
    return conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[attr-defined]


async def test_every_store_connection_has_bounded_waits_and_the_pinned_schema() -> None:
    with fresh_schema() as url:
        async with open_store(url) as store:
            extra = store._new_connection()  # type: ignore[attr-defined]
            try:
                for conn in (store._conn, store._reader, extra):  # type: ignore[attr-defined]
                    assert show(conn, "lock_timeout") == "5s"
                    assert show(conn, "idle_in_transaction_session_timeout") == "1min"
                    assert show(conn, "statement_timeout") == "1min"
                    assert show(conn, "search_path") == schema_of(url)
                    parameters = conn.info.get_parameters()
                    assert parameters["connect_timeout"] == "10"
                    assert parameters["keepalives_idle"] == "30"
            finally:
                extra.close()


async def test_url_settings_override_the_defaults() -> None:
    with fresh_schema() as url:
        overridden = url + "%20-clock_timeout%3D1234ms%20-c%20statement_timeout%3D0&connect_timeout=3"
        async with open_store(overridden) as store:
            for conn in (store._conn, store._reader):  # type: ignore[attr-defined]
                assert show(conn, "lock_timeout") == "1234ms"
                assert show(conn, "statement_timeout") == "0"
                assert show(conn, "idle_in_transaction_session_timeout") == "1min"
                assert conn.info.get_parameters()["connect_timeout"] == "3"


async def test_prepare_threshold_is_taken_from_the_url_and_not_sent_to_the_server() -> None:
    with fresh_schema() as url:
        async with open_store(url + "&prepare_threshold=none") as store:
            assert store._conn.prepare_threshold is None  # type: ignore[attr-defined]
            assert store._reader.prepare_threshold is None  # type: ignore[attr-defined]
        async with open_store(url + "&prepare_threshold=2") as store:
            assert store._conn.prepare_threshold == 2  # type: ignore[attr-defined]
        with pytest.raises(StoreError, match="prepare_threshold"):
            async with open_store(url + "&prepare_threshold=often"):
                pass


async def test_reply_timeout_is_taken_from_the_url_and_bounds_every_connection_of_the_store() -> None:
    with fresh_schema() as url:
        async with open_store(url + "&reply_timeout=7") as store:
            assert store._conn.reply_timeout == 7  # type: ignore[attr-defined]
            assert store._reader.reply_timeout == 7  # type: ignore[attr-defined]
            assert await store.recall("anything", EVERY_SESSION, 10) == []  # the server never saw the parameter
        async with open_store(url) as store:
            assert store._conn.reply_timeout == 90  # type: ignore[attr-defined]
        with pytest.raises(StoreError, match="reply_timeout"):
            async with open_store(url + "&reply_timeout=soon"):
                pass


@pytest.mark.parametrize(
    ("query", "seconds"),
    [
        ("", 90.0),  # the default statement_timeout (60 s), plus 30 s
        ("?reply_timeout=2.5", 2.5),
        ("?reply_timeout=0", None),  # asked to wait for ever
        ("?options=-c%20statement_timeout%3D2min", 150.0),
        ("?options=-cstatement_timeout%3D500", 30.5),  # a bare number is milliseconds
        ("?options=--statement-timeout%3D0", None),  # statements may run for ever: so may their answer
        ("?options=-c%20statement_timeout%3D0&reply_timeout=20", 20.0),
    ],
)
def test_reply_timeout_defaults_to_the_statement_timeout_in_force_plus_a_margin(
    query: str, seconds: float | None
) -> None:
    from memengine.store.postgres.connection import reply_timeout

    assert reply_timeout("postgresql://app@db/memory" + query) == seconds


@pytest.mark.parametrize("value", ["-1", "soon", "inf", "nan"])
def test_a_reply_timeout_that_is_no_number_of_seconds_is_refused(value: str) -> None:
    from memengine.store.postgres.connection import reply_timeout

    with pytest.raises(StoreError, match="reply_timeout"):
        reply_timeout(f"postgresql://app@db/memory?reply_timeout={value}")


async def test_sqlite_keeps_the_same_window(tmp_path: Path) -> None:
    import sqlite3
    from contextlib import closing

    from memengine.store.sqlite import schema as sqlite_schema

    db = tmp_path / "memory.db"
    async with open_engine(db):
        pass
    version = sqlite_schema.SCHEMA_VERSION
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(f"PRAGMA user_version = {version + 1}")
        conn.execute("UPDATE memengine_schema SET compatible_back = 1")
        conn.commit()
    async with open_engine(db) as engine:
        await engine.session("s").add([Episode("user", "hello")])
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (version + 1,)
        conn.execute("UPDATE memengine_schema SET compatible_back = 0")
        conn.commit()
    error = await opening_fails(str(db))
    assert isinstance(error, StoreError) and "upgrade memengine" in str(error)


# -- URLs: what is kept, added and shown ------------------------------------------------------


def test_settings_the_url_gives_in_any_spelling_are_kept() -> None:
    from memengine.store.postgres.connection import with_settings

    defaults = {"lock_timeout": "5s", "statement_timeout": "60s", "idle_in_transaction_session_timeout": "60s"}
    given = "-c lock_timeout=1s -cstatement_timeout=2s --idle-in-transaction-session-timeout=3s"
    assert with_settings(given, defaults) == given
    assert with_settings("-c work_mem=64MB", {"lock_timeout": "5s"}) == "-c work_mem=64MB -c lock_timeout=5s"


def test_pgoptions_is_the_starting_point_without_options_in_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from psycopg.conninfo import conninfo_to_dict

    from memengine.store.postgres.connection import connection_arguments

    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=2s")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "4")
    conninfo, _ = connection_arguments("postgresql://app@db/memory")
    parameters = conninfo_to_dict(conninfo)
    assert "-c lock_timeout=2s" in parameters["options"] and "statement_timeout=60s" in parameters["options"]
    assert "connect_timeout" not in parameters  # libpq reads PGCONNECT_TIMEOUT itself


def test_the_pinned_schema_replaces_the_search_path_and_keeps_the_rest() -> None:
    from psycopg.conninfo import conninfo_to_dict

    from memengine.store.postgres.connection import connection_arguments, pinned

    url = pinned("postgresql://app@db/memory?options=-csearch_path%3Dnew%2Cold%20-c%20work_mem%3D64MB", "Old Schema")
    options = conninfo_to_dict(connection_arguments(url)[0])["options"]
    assert "search_path=new" not in options and "work_mem=64MB" in options
    assert '-c search_path="Old\\ Schema"' in options


def test_messages_show_urls_without_their_password() -> None:
    from memengine.store.postgres.connection import shown

    assert shown("postgresql://app:s3cret@db:5432/memory?sslmode=require") == (
        "postgresql://app@db:5432/memory?sslmode=require"
    )
    assert "s3cret" not in shown("postgresql://app@db/memory?password=s3cret&sslmode=require")
    assert shown("postgresql://db/memory") == "postgresql://db/memory"
