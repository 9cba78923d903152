"""The PostgreSQL store: for several processes (or machines) serving the same sessions.

The operations and the committer are shared with SQLite (operations.py, committer.py,
journal.py, outbox.py, leases.py): group commit on one write connection per
process, reads on a second, psycopg 3's blocking driver run in worker
threads, so it works the same under asyncio and trio. Lease renewals get a
third connection (postgres/renewals.py): a write waiting for a lock held by
a frozen replica never holds up this process's renewals. A connection the
server dropped while idle is replaced before its next transaction. This
module connects (reconnecting after a lost connection),
inserts a run of appends with one ``unnest`` statement, and searches with
PostgreSQL's full-text search (recall.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from ...errors import StoreError
from ...scope import Scope
from .. import journal
from ..base import Recalled
from ..dialect import Db, postgres_dialect
from ..liveness import AdvisoryLiveness
from ..open_errors import driver_error, postgres_open_failed, redacted
from ..operations import GroupCommitStore
from . import recall
from .connection import connect, pinned_to_tables, shown, with_url_settings
from .readonly import check_readable
from .renewals import RenewalConnection
from .replies import give_up
from .schema import prepare_schema

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the PostgreSQL store needs psycopg 3: pip install 'agent-memengine[postgres]'") from exc

log = logging.getLogger("memengine.store")
_CANCEL_TIMEOUT = 2.0
_INSERT_SESSIONS = "INSERT INTO sessions (session_id) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING"
_INSERT_EPISODES = (
    "INSERT INTO episodes (session_id, seq, id, role, content, created_at, metadata) "
    "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[]) "
    "ON CONFLICT DO NOTHING"
)


class PostgresStore(GroupCommitStore):
    """The PostgreSQL backend. Open it with :func:`open_postgres_store`."""

    def __init__(self, conn: psycopg.Connection[Any], url: str, owner: str | None = None) -> None:
        super().__init__(conn, postgres_dialect(), owner)
        self._url = url
        self._renewals = RenewalConnection(self._new_connection, self._dialect)

    async def renew_leases(self, held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        if self.forked():
            return set()  # the parent's leases: never renewed from a forked child
        # On a connection of their own: never behind queued writes, nor a write waiting for a lock.
        return await self._renewals.renew(self.owner, held, ttl)

    def _close_own_connections(self, wait: float) -> None:
        self._renewals.close(wait)

    def _new_liveness(self) -> AdvisoryLiveness:
        return AdvisoryLiveness(self._new_connection)

    def _begin_read(self, db: Db) -> None:
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot for the whole read

    def _new_connection(self) -> psycopg.Connection[Any]:
        """A new connection as every one of the store's must be: pinned to its schema, with its settings."""
        return _connect(self._url)

    def _reader_connection(self) -> Any:
        if self._reader is None or self._reader.closed or self._reader.broken:
            self._reader = self._new_connection()
        return self._reader

    def _reader_lost(self) -> bool:
        return self._reader is None or bool(self._reader.closed or self._reader.broken)

    def _reconnect(self) -> None:
        old, self._conn = self._conn, self._new_connection()
        old.close()

    def _interrupt(self) -> None:
        # Cancelling talks to the server over a new connection: not from the event loop.
        threading.Thread(target=_cancel, args=(self._conn,), name="memengine cancel", daemon=True).start()

    def _interrupt_reads(self) -> None:
        threading.Thread(target=_cancel, args=(self._reader,), name="memengine cancel", daemon=True).start()

    def _interrupted(self, error: BaseException) -> bool:
        return isinstance(error, psycopg.errors.QueryCanceled)

    def _give_up(self, conn: Any) -> None:
        give_up(conn)

    def _in_transaction(self) -> bool:
        status = self._conn.info.transaction_status
        return status in (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)

    def _connection_lost(self) -> bool:
        return bool(self._conn.closed or self._conn.broken)

    def _commit(self, batch: list[Any]) -> None:
        if self._conn.closed:
            # The server went away (restart, failover, a silence past reply_timeout): the batch
            # gets a new connection, or fails whole if there is none to be had.
            try:
                self._conn = self._new_connection()
            except psycopg.Error as exc:
                for submission in batch:
                    submission.result = None
                    submission.error = StoreError(f"could not reconnect to the database; nothing was stored: {exc}")
                return
        super()._commit(batch)

    def _insert_new_episodes(self, db: Db, sessions: list[str], rows: list[tuple]) -> bool:
        if sessions:
            db.conn.execute(_INSERT_SESSIONS, (sessions,))
        columns = [list(column) for column in zip(*rows, strict=True)]
        cursor = db.conn.execute(_INSERT_EPISODES, columns)
        return bool(cursor.rowcount == len(rows))

    def _search(self, db: Db, query: str, scope: Scope, limit: int) -> list[Recalled]:
        return recall.search(db, query, scope, limit, journal.episode_from_row)

    def _rebuild_recall_index(self, db: Db) -> int:
        return recall.rebuild(db)


def _cancel(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.cancel_safe(timeout=_CANCEL_TIMEOUT)
    except Exception as exc:
        log.warning("could not cancel the PostgreSQL statement in progress: %s", exc)


def _connect(url: str) -> psycopg.Connection[Any]:
    """A new autocommit connection, with the timeouts and settings of postgres/connection.py."""
    return connect(url)  # type: ignore[no-any-return]


@asynccontextmanager
async def open_postgres_store(
    url: str, *, owner: str | None = None, read_only: bool = False
) -> AsyncIterator[PostgresStore]:
    """Connect to PostgreSQL at ``url`` (creating or migrating the schema if it is behind) for the block's duration.

    The tables are looked for once, here: in the first schema of the
    connection's ``search_path`` that holds them, else created in its
    ``current_schema()`` (``?options=-csearch_path%3Dmyschema`` in the URL
    picks one); every connection of the store is then pinned to that schema.
    A current schema is only read, so a role with data rights alone can open
    the store; one that is behind is migrated if the role may, else
    :class:`~memengine.errors.StoreError` says to run ``memengine migrate``.
    ``read_only`` creates and migrates nothing: every connection runs with
    ``default_transaction_read_only``, and a schema without memengine's
    tables (or behind this code) is refused (see postgres/readonly.py).
    Connections get bounded waits (see postgres/connection.py), which the URL
    can override. A server that cannot be reached, or a schema that cannot be
    used, raises :class:`~memengine.errors.StoreError` naming the URL without
    its password. On exit, operations already submitted are committed.
    """
    given = url  # what messages show: the user's URL, not the settings added to it here
    if read_only:
        url = with_url_settings(url, {"default_transaction_read_only": "on"})
    try:
        pinned_url = await anyio.to_thread.run_sync(pinned_to_tables, url)
        conn = await anyio.to_thread.run_sync(_connect, pinned_url)
    except (psycopg.Error, StoreError) as exc:
        connecting = isinstance(exc, psycopg.OperationalError)
        raise postgres_open_failed(given, exc, connecting=connecting) from driver_error(exc)
    store = PostgresStore(conn, pinned_url, owner)
    store.location = redacted(given)

    def prepare() -> None:
        try:
            if read_only:
                check_readable(conn)
            else:
                prepare_schema(conn, shown(given))
            store._reader = store._new_connection()  # reads go on their own connection
        except (psycopg.Error, StoreError) as exc:
            raise postgres_open_failed(given, exc, connecting=False) from driver_error(exc)

    async with store.serving(prepare):
        yield store
