"""One SQL text for both backends: a connection wrapper that fills in the dialect.

The store's statements are written once, with ``?`` parameters and a few
named slots for what SQLite and PostgreSQL spell differently:

- ``{now}``: the database's clock, in unix seconds (lease expiry is judged by
  the database, so the processes sharing it need not agree on the time);
- ``{greatest}``: the two-argument maximum (``max`` / ``greatest``);
- ``{for_share}`` / ``{for_update}``: row locks, which PostgreSQL needs under
  READ COMMITTED and SQLite (one writer at a time) does not;
- ``{skip_locked}``: lock the row unless another transaction holds it (then the
  row is not returned): for rows a frozen process may hold, never waited for.

Both drivers' connections have ``execute(sql, params)`` returning a cursor with
``fetchone``, ``fetchall`` and ``rowcount``, so the operations need nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs


@attrs.frozen
class Dialect:
    name: str
    placeholder: str
    now: str
    greatest: str
    for_share: str
    for_update: str
    skip_locked: str
    errors: tuple[type[BaseException], ...]
    #: Errors that say "try the whole transaction again" (another transaction deadlocked with it).
    transient: tuple[type[BaseException], ...] = ()
    #: Errors that say "this statement waited too long" (``lock_timeout``, ``statement_timeout``):
    #: the operation that met one is refused alone, not run again with the rest of its transaction.
    too_slow: tuple[type[BaseException], ...] = ()


def sqlite_dialect() -> Dialect:
    import sqlite3

    return Dialect(
        name="sqlite",
        placeholder="?",
        now="((julianday('now') - 2440587.5) * 86400.0)",
        greatest="max",
        for_share="",
        for_update="",
        skip_locked="",
        errors=(sqlite3.Error,),
    )


def postgres_dialect() -> Dialect:
    import psycopg

    return Dialect(
        name="postgresql",
        placeholder="%s",
        now="extract(epoch from clock_timestamp())::float8",
        greatest="greatest",
        for_share=" FOR SHARE",
        for_update=" FOR UPDATE",
        skip_locked=" FOR UPDATE SKIP LOCKED",
        errors=(psycopg.Error,),
        transient=(psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure),
        too_slow=(psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled),
    )


_TEXTS: dict[tuple[str, str], str] = {}


class Db:
    """A connection plus its dialect, as the store's operations see it (inside a transaction)."""

    __slots__ = ("conn", "dialect")

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    def text(self, template: str) -> str:
        key = (self.dialect.name, template)
        text = _TEXTS.get(key)
        if text is None:
            d = self.dialect
            text = template.format(
                now=d.now,
                greatest=d.greatest,
                for_share=d.for_share,
                for_update=d.for_update,
                skip_locked=d.skip_locked,
            ).replace("?", d.placeholder)
            if len(_TEXTS) < 4096:  # IN lists of many lengths must not grow it without bound
                _TEXTS[key] = text
        return text

    def execute(self, template: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self.text(template), params)

    def executemany(self, template: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run ``template`` once per row (a sqlite3 connection does it itself; with psycopg, a cursor does)."""
        if self.dialect.name == "postgresql":
            with self.conn.cursor() as cursor:
                cursor.executemany(self.text(template), rows)
            return
        self.conn.executemany(self.text(template), rows)


def placeholders(count: int) -> str:
    """``?, ?, ...`` for an ``IN (...)`` list of ``count`` values."""
    return ", ".join("?" * count)
