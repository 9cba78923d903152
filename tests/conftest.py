from __future__ import annotations

import os
import random
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

# -- property tests: never judged by the machine's speed ---------------------------------
# Hypothesis's defaults fail a test whose example takes over 200 ms (deadline) or whose inputs take
# over a second or so to draw (too_slow): on a loaded machine (two CPU hogs beside the suite) a single
# draw took 2.9 s. What a property test checks is its property; a test's own settings add to these.
settings.register_profile("memengine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("memengine")

# -- how the suite runs: soaks, test order ---------------------------------------------

SOAK_REASON = "a long soak: run with --soak (.ci/run does, after the default run)"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memengine")
    group.addoption(
        "--soak",
        action="store_true",
        help="also run the long soaks (tests marked soak: chaos hammers, large scales, many property examples); "
        "`-m soak --soak` runs only them",
    )
    group.addoption(
        "--shuffle",
        nargs="?",
        const="random",
        default=None,
        metavar="SEED",
        help="run the tests in a random order (a seed from the run when none is given; the seed used is printed)",
    )


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:  # an xdist worker: every worker collects in the order its controller drew
        config.option.shuffle = workerinput.get("memengine_shuffle")
    elif config.option.shuffle == "random":
        config.option.shuffle = str(random.SystemRandom().randrange(10**6))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The worker count for ``-n auto``: twice the cores, from 4 to 8 (PYTEST_XDIST_AUTO_NUM_WORKERS overrides).

    Most tests wait (on child processes, the database, timers) far more than they
    compute, so two workers per core keep the cores busy; at most 8, so that the
    PostgreSQL server's connections and a small machine's memory suffice.
    """
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if chosen:
        return int(chosen)
    return min(max(2 * (os.cpu_count() or 1), 4), 8)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # xdist's hook, on the controller, for each worker it starts
    node.workerinput["memengine_shuffle"] = node.config.option.shuffle


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = ["soaks: " + ("run (--soak)" if config.getoption("--soak") else "skipped (--soak runs them)")]
    if config.getoption("--shuffle") is not None:
        lines.append(f"order: shuffled, --shuffle={config.getoption('--shuffle')} repeats it")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seed = config.getoption("--shuffle")
    if seed is not None:
        random.Random(seed).shuffle(items)
    if not config.getoption("--soak"):
        skip = pytest.mark.skip(reason=SOAK_REASON)
        for item in items:
            if item.get_closest_marker("soak") is not None:
                item.add_marker(skip)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def virtual_time_backends():
    """Backends for tests about time: trio with a MockClock, asyncio in real time.

    The MockClock jumps only after every task has waited 0.1 s of real time, so
    it skips idle waits but not the moments the engine waits on its SQLite
    thread (a threshold of 0 would age sessions during every commit).
    """
    return pytest.fixture(params=["asyncio", "trio"])(_virtual_time_backend)


def _virtual_time_backend(request: pytest.FixtureRequest):
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0.1)})
    return "asyncio"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def stored(db_path: Path) -> Iterator[StoredRows]:
    yield StoredRows(db_path)


class StoredRows:
    """Reads what is really in the database file, behind the engine's back."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def query(self, sql: str, *params: object) -> list[tuple]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def episodes(self, session_id: str) -> list[tuple[int, str]]:
        return self.query("SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", session_id)

    def summaries(self, session_id: str) -> list[tuple[int, str]]:
        return self.query(
            "SELECT through_seq, summary FROM summaries WHERE session_id = ? ORDER BY through_seq", session_id
        )


# -- store backends ---------------------------------------------------------------

POSTGRES_SERVER = os.environ.get("MEMENGINE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_unreachable() -> str | None:
    """Why PostgreSQL tests cannot run here, or None if they can."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    try:
        psycopg.connect(POSTGRES_SERVER, connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"no PostgreSQL server at {POSTGRES_SERVER} ({exc.__class__.__name__}: {str(exc).strip()[:200]})"
    return None


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh, empty schema on the test server; yields a URL whose search_path is that schema."""
    import psycopg

    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    schema = f"memengine_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES_SERVER}?options=-csearch_path%3D{schema}"
    finally:
        _drop_schema(schema)


def _drop_schema(schema: str, timeout: float = 120.0) -> None:
    """Drops a test's schema; a backend a test left behind (a killed worker's, still exiting) may hold locks on it.

    DROP ... CASCADE takes every table's lock in turn and can deadlock with such a backend's last statement;
    the server then cancels one of the two, and the drop is tried again until the backend is gone.
    """
    import psycopg
    from psycopg import errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
            return
        except (errors.DeadlockDetected, errors.LockNotAvailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a store lives, for each backend every store must behave the same on."""
    if request.param == "sqlite":
        yield str(tmp_path / "memory.db")
        return
    with postgres_schema() as url:
        yield url


class StoreRows:
    """Reads what is really in either backend's tables, behind the engine's back (``?`` parameters)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, *params: object) -> list[tuple]:
        if self.url.startswith("postgresql://"):
            import psycopg

            with psycopg.connect(self.url) as conn:
                cursor = conn.execute(sql.replace("?", "%s"), params)
                return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        conn = sqlite3.connect(self.url, timeout=10)
        try:
            result = conn.execute(sql, params).fetchall()
            conn.commit()
            return result
        finally:
            conn.close()


@pytest.fixture
def rows(store_url: str) -> StoreRows:
    return StoreRows(store_url)
