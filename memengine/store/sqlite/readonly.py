"""Opening an existing SQLite store read-only, for commands that only look (``memengine inspect``).

The connection is opened with ``mode=rw`` (never ``rwc``: a missing file
is not created) and ``PRAGMA query_only``, so SQLite refuses every write and
a database that is not a store never gains memengine's tables. Not
``mode=ro``: a read-only connection to a WAL database cannot remove the
``-wal`` and ``-shm`` files when it closes, and would leave them behind. A
file this process may not write is opened with ``mode=ro`` instead. A file that is not a store, or whose
schema is not one this memengine reads, is refused with a
:class:`StoreError` that names it and says what to do.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ...errors import StoreError
from ..schema_window import check_readable_version
from .schema import SCHEMA_VERSION, recorded_compatible_from

#: The tables every memengine SQLite store has had since its first version.
MEMENGINE_TABLES = frozenset({"sessions", "episodes", "summaries"})


def connect(path: str) -> sqlite3.Connection:
    """A read-only connection to the memengine store at ``path``; :class:`StoreError` if it is not one."""
    location = Path(path)
    if not location.exists() and location.parent.is_dir():
        raise no_tables(path, "no such file")
    uri = location.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=rw", uri=True, check_same_thread=False)
    except sqlite3.OperationalError:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
    try:
        conn.execute("PRAGMA query_only = ON")
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not MEMENGINE_TABLES <= tables:
            raise no_tables(path, "an empty file" if location.stat().st_size == 0 else "another SQLite database")
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        check_readable_version(
            version,
            lambda: recorded_compatible_from(conn, version),
            SCHEMA_VERSION,
            f"the SQLite store {path} is at schema version {version} and this memengine reads version "
            f"{SCHEMA_VERSION}: run `memengine migrate {path}` first (it only adds)",
        )
    except BaseException:
        conn.close()
        raise
    return conn


def no_tables(path: str, what: str) -> StoreError:
    """The error for a path that holds no memengine store (``what`` it is instead)."""
    return StoreError(
        f"{path} has no memengine tables ({what}); give the path of a store an engine has written "
        "(this command never creates one)"
    )
