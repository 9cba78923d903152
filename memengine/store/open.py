"""Choose a store backend from what the user passed to ``open_engine``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .base import Store
from .open_errors import unsupported_url, url_scheme

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(path: object) -> bool:
    return isinstance(path, str) and path.startswith(POSTGRES_SCHEMES)


@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str],
    *,
    synchronous: str = "NORMAL",
    owner: str | None = None,
    read_only: bool = False,
    busy_timeout: float | None = None,
) -> AsyncIterator[Store]:
    """A PostgreSQL store for a ``postgresql://`` URL, else the SQLite file (or ``":memory:"``) at ``path``.

    ``read_only`` opens an existing store only to read it: nothing is created,
    migrated or written, and a place without memengine's tables is refused.
    A store that cannot be opened raises :class:`~memengine.errors.StoreError`
    naming it (a URL without its password) and saying what to do; so does a
    URL of another database (``mysql://...``). ``busy_timeout`` is SQLite's
    wait for another process's write lock (None: its default, 10 s; ignored
    for PostgreSQL, where ``lock_timeout`` in the URL says it).
    """
    if is_postgres_url(path):
        from .postgres import open_postgres_store  # psycopg is an optional dependency

        async with open_postgres_store(str(path), owner=owner, read_only=read_only) as store:
            yield store
    elif url_scheme(path) is not None:
        raise unsupported_url(str(path))
    else:
        from .sqlite import open_sqlite_store

        options = {} if busy_timeout is None else {"busy_timeout": busy_timeout}
        async with open_sqlite_store(path, synchronous=synchronous, owner=owner, read_only=read_only, **options) as s:
            yield s
