"""Checks on the file a command is pointed at, made before the store opens it.

Opening a store creates a missing file and adds memengine's tables to any
SQLite database, so the commands look first, read-only, and refuse a file that
is not theirs to touch.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from ..errors import StoreError
from ..store.open import is_postgres_url
from ..store.open_errors import unsupported_url, url_scheme

MEMENGINE_TABLES = frozenset({"sessions", "episodes", "summaries"})


def store_file_problem(path: Path) -> str | None:
    """Why ``path`` is not an existing memengine store, or ``None`` if it is one.

    Reads the file through a read-only connection: it never creates or
    changes anything.
    """
    if not path.exists():
        return "no such file"
    if not path.is_file():
        return "not a regular file"
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        return f"not a readable SQLite database ({exc})"
    if not MEMENGINE_TABLES <= tables:
        return "a SQLite database, but not a memengine store"
    return None


def foreign_url(db: str) -> StoreError | None:
    """The error for a URL of a database memengine does not store in (``mysql://...``), else ``None``.

    Checked first, so that such a URL is never taken for a file path (nor shown with its password).
    """
    if url_scheme(db) is not None and not is_postgres_url(db):
        return unsupported_url(db)
    return None
