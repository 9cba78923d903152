"""A throwaway PostgreSQL schema for a benchmark run: made on the server, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def throwaway_schema(server: str) -> Iterator[str]:
    """A URL whose connections use a new, empty schema of ``server``; the schema is dropped on leaving."""
    import psycopg

    schema = f"memengine_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{server}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
