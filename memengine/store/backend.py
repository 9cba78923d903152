"""What a backend gives the shared store: how it begins, interrupts, reconnects, inserts and searches.

The SQLite and PostgreSQL stores (sqlite/store.py, postgres/store.py) override
these hooks; everything else (the group commit, the side work, the store
operations) is shared and built on them.
"""

from __future__ import annotations

from typing import Any

from ..scope import Scope
from .base import Recalled
from .dialect import Db, Dialect
from .submission import Operation


class BackendHooks:
    """The connections of one store and the hooks each backend fills in."""

    def __init__(self, conn: Any, dialect: Dialect, reader: Any | None = None) -> None:
        self._conn = conn
        self._reader = reader
        self._dialect = dialect

    def _begin(self, db: Db) -> None:
        """Begin a write transaction (in the worker thread)."""
        db.execute("BEGIN")

    def _begin_read(self, db: Db) -> None:
        """Begin a read-only transaction on the read connection."""
        db.execute("BEGIN")

    def _insert_new_episodes(self, db: Db, sessions: list[str], rows: list[tuple]) -> bool:
        """Insert the rows with one statement; True if every row was new (else the caller undoes it)."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _upkeep(self) -> None:
        """Work on the write connection between two transactions, in the commit thread (see Committer)."""

    def _interrupt(self) -> None:
        """Make the statement running in the worker thread fail soon (called from the event loop)."""

    def _interrupt_reads(self) -> None:
        """Make the statement running on the read connection fail soon (called from the event loop)."""

    def _interrupted(self, error: BaseException) -> bool:
        """Whether ``error`` is what an interrupt makes a statement raise."""
        return False

    def _give_up(self, conn: Any) -> None:
        """Make a thread still waiting on ``conn`` after an interrupt return soon (it is left behind). Any thread."""

    def _reader_connection(self) -> Any:
        """The read connection, reconnected if it was lost."""
        return self._reader

    def _reader_lost(self) -> bool:
        """Whether the read connection is gone (the server dropped it): a read is tried again on a new one."""
        return False

    def _reconnect(self) -> None:
        """Replace the write connection, which was lost (in the worker thread, outside a transaction)."""
        raise NotImplementedError

    async def _side_work(self) -> None:
        """Work of the backend's own beside the committer, while the store serves (cancelled at close)."""

    def _close_side_work(self) -> None:
        """Close what :meth:`_side_work` used (in a thread, after it was cancelled)."""

    def _close_own_connections(self, wait: float) -> None:
        """Close the backend's further connections (in a thread), waiting ``wait`` seconds at most for one in use."""

    def _committed(self) -> None:
        """A transaction committed (called on the event loop)."""

    def _new_liveness(self) -> Any:
        """This engine's liveness lock (store/liveness.py), not yet held; None where there is none."""
        return None

    def _housekeeping(self) -> Operation[Any] | None:
        """An extra operation to ride along with the next transaction, if one is due."""
        return None

    async def _catch_up_recall_index(self) -> None:
        """Index what is stored but not indexed yet (nothing, for a backend that indexes as it writes)."""

    def _search(self, db: Db, query: str, scope: Scope, limit: int) -> list[Recalled]:
        """Search the recall index; a read. Raises :class:`RecallIndexDamaged` if the index is damaged."""
        raise NotImplementedError

    def _rebuild_recall_index(self, db: Db) -> int:
        """Rebuild the recall index from the journal; return how many episodes it holds."""
        raise NotImplementedError
