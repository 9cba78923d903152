"""Choose a store backend from what the user passed to ``open_engine``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .base import Store

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(path: object) -> bool:
    return isinstance(path, str) and path.startswith(POSTGRES_SCHEMES)


@asynccontextmanager
async def open_store(
    path: str | os.PathLike[str], *, synchronous: str = "NORMAL", owner: str | None = None
) -> AsyncIterator[Store]:
    """A PostgreSQL store for a ``postgresql://`` URL, else the SQLite file (or ``":memory:"``) at ``path``."""
    if is_postgres_url(path):
        from .postgres import open_postgres_store  # psycopg is an optional dependency

        async with open_postgres_store(str(path), owner=owner) as store:
            yield store
    else:
        from .sqlite import open_sqlite_store

        async with open_sqlite_store(path, synchronous=synchronous, owner=owner) as store:
            yield store
