"""A store that cannot be opened fails with a StoreError that names it (never its password) and says what to do.

The driver's own error (sqlite3's, psycopg's) stays reachable as ``__cause__``;
what the user reads is one message about *their* path or URL.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from memengine import StoreError, open_engine
from memengine.store.open import open_store

from .conftest import POSTGRES_SERVER, postgres_unreachable

pytestmark = pytest.mark.anyio


async def open_failure(target: str | Path) -> StoreError:
    with pytest.raises(StoreError) as raised:
        async with open_engine(target):
            pytest.fail("the store opened")
    return raised.value


async def test_a_postgres_server_that_is_down_names_the_url_without_its_password() -> None:
    pytest.importorskip("psycopg")
    import psycopg

    failure = await open_failure("postgresql://app:s3cret@127.0.0.1:1/memory?connect_timeout=3")

    message = str(failure)
    assert "postgresql://app:***@127.0.0.1:1/memory" in message
    assert "s3cret" not in message
    assert "cannot connect to PostgreSQL" in message
    assert "check that the server is running" in message
    assert "\n" not in message
    assert isinstance(failure.__cause__, psycopg.OperationalError)


async def test_a_password_given_as_a_parameter_is_hidden_too() -> None:
    pytest.importorskip("psycopg")

    failure = await open_failure("postgresql://app@127.0.0.1:1/memory?password=s3cret&connect_timeout=3")

    assert "s3cret" not in str(failure)
    assert "password=***" in str(failure)


async def test_a_schema_that_does_not_exist_names_the_url_and_the_way_out() -> None:
    if (reason := postgres_unreachable()) is not None:
        pytest.skip(reason)
    url = f"{POSTGRES_SERVER}?options=-csearch_path%3Dmemengine_no_such_schema"

    failure = await open_failure(url)

    message = str(failure)
    assert "memengine_no_such_schema" in message
    assert POSTGRES_SERVER.split("?")[0] in message
    assert "create one" in message


async def test_a_missing_directory_names_it(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "memory.db"

    failure = await open_failure(path)

    assert str(path) in str(failure)
    assert f"directory {path.parent} does not exist" in str(failure)
    assert isinstance(failure.__cause__, sqlite3.Error)
    assert not path.parent.exists()


async def test_a_url_of_another_database_is_refused_without_creating_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    failure = await open_failure("mysql://app:s3cret@db.example/memory")

    message = str(failure)
    assert "mysql://app:***@db.example/memory" in message
    assert "s3cret" not in message
    assert "postgresql://" in message  # what it takes instead
    assert os.listdir(tmp_path) == []


async def test_a_file_that_is_not_a_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "random.bin"
    junk = os.urandom(8192)
    path.write_bytes(junk)

    failure = await open_failure(path)

    assert str(path) in str(failure)
    assert "not a SQLite database" in str(failure)
    assert isinstance(failure.__cause__, sqlite3.DatabaseError)
    assert path.read_bytes() == junk


async def test_a_directory_given_as_the_file_is_named(tmp_path: Path) -> None:
    failure = await open_failure(tmp_path)

    assert str(tmp_path) in str(failure)
    assert "is a directory" in str(failure)
    assert isinstance(failure.__cause__, sqlite3.Error)


async def test_the_store_alone_reports_the_same_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        async with open_store(tmp_path / "nowhere" / "memory.db"):
            pass
