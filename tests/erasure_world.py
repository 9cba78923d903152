"""Searching everything memengine writes for a text: the store's tables, a recording, listings, exports, logs.

Shared by test_erasure_world.py (one forgotten tenant with every kind of
trace) and the stateful property test (after each forget).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from .conftest import StoreRows


def store_texts(url: str) -> Iterable[tuple[str, str, str]]:
    """Every text value of every column of every table of the store, as ``(table, column, value)``.

    SQLite: every table (the full-text index's shadow tables included), every value whose type is
    text. PostgreSQL: every column of a text or JSON type of every table of the schema.
    """
    if url.startswith("postgresql://"):
        rows = StoreRows(url)
        columns = rows.query(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND data_type IN ('text', 'character varying', 'json', 'jsonb')"
        )
        for table, column in columns:
            for (value,) in rows.query(f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL'):
                yield table, column, value
        return
    conn = sqlite3.connect(url, timeout=10)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
            for column in columns:
                for (value,) in conn.execute(
                    f'SELECT "{column}" FROM "{table}" WHERE typeof("{column}") = \'text\''
                ).fetchall():
                    yield table, column, value
    finally:
        conn.close()


def store_holding(url: str, marker: str) -> list[tuple[str, str]]:
    """The ``(table, column)`` places of the store whose text holds ``marker``."""
    return sorted({(table, column) for table, column, value in store_texts(url) if marker in value})


def log_text(records: Iterable[logging.LogRecord]) -> str:
    """Everything the log records say, tracebacks included."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in records)


def file_holds(path: Path, marker: str) -> bool:
    return path.exists() and marker.encode("utf-8") in path.read_bytes()


def json_holds(value: object, marker: str) -> bool:
    return marker in json.dumps(value, ensure_ascii=False, default=str)
