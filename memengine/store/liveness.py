"""An engine's proof of life: a lock the operating system or the database ends when the process dies.

See store/owners.py for what is done with it. Two kinds:

- :class:`FileLiveness` (SQLite): an exclusive ``flock`` on a file of its own
  in ``<database>-owners/``, held for the engine's lifetime. The kernel drops
  it when the process exits, however it exits. Another engine that can take
  the lock knows the process is gone (and removes the file). ``flock`` locks
  belong to the open file, so two engines in one process are told apart.
  Where files cannot be locked (no ``fcntl``, a read-only directory), there is
  no liveness: leases expire as before.
- :class:`AdvisoryLiveness` (PostgreSQL): a session-level advisory lock on a
  random 63-bit key, held by a connection of its own. The server drops it when
  that connection ends: at once when the process dies (its socket is closed),
  later when a network cut is noticed. Another engine checks with
  ``pg_try_advisory_xact_lock`` (held only to the end of its transaction).
  Since a live process can lose its connection too, its own heartbeat
  (:meth:`AdvisoryLiveness.check`, every second) tells the engine to cancel
  its sink calls, and takes the lock back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .dialect import Db
from .owners import process_gone

log = logging.getLogger("memengine.store")

#: PostgreSQL: seconds an owner must have been seen dead before its retain claims are voided. Longer
#: than a heartbeat (:data:`HEARTBEAT_SECONDS`) and its timeout, so a live process that lost its lock
#: has cancelled its sink calls by then.
ADVISORY_GRACE = 5.0
#: How often an engine checks that it still holds its liveness lock (and reaps dead owners).
HEARTBEAT_SECONDS = 1.0

_KEYS = random.Random()  # the engine's own: the global random state belongs to the application


def _new_incarnation() -> str:
    return uuid.uuid4().hex


class FileLiveness:
    """A ``flock`` on ``<directory>/<incarnation>`` for as long as the engine runs."""

    grace = 0.0
    lock_key = 0

    def __init__(self, directory: Path) -> None:
        self.incarnation = _new_incarnation()
        self._directory = directory
        self._fd: int | None = None

    @classmethod
    def beside(cls, database: str) -> FileLiveness | None:
        """The liveness for the SQLite file ``database``; None where files cannot be locked."""
        if database == ":memory:" or database.startswith("file:"):
            return None
        try:
            import fcntl  # noqa: F401
        except ImportError:  # not on this platform: leases expire as before
            return None
        return cls(Path(database + "-owners"))

    def hold(self) -> None:
        import fcntl

        self._directory.mkdir(exist_ok=True)
        fd = os.open(self._directory / self.incarnation, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def alive(self, db: Db, incarnations: Sequence[tuple[str, int]]) -> set[str]:
        import fcntl

        living = set()
        for incarnation, _ in incarnations:
            path = self._directory / incarnation
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue  # removed by whoever found it dead first
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                living.add(incarnation)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # under the lock: its process is gone
            finally:
                os.close(fd)
        return living

    def check(self) -> bool:
        return True  # a file lock is held exactly as long as the process lives

    def process_gone(self, host: str, pid: int) -> bool:
        return True  # its lock is free: the process has ended (grace 0 anyway)

    def release(self, wait: float) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            (self._directory / self.incarnation).unlink()
        os.close(self._fd)
        self._fd = None


class AdvisoryLiveness:
    """A session-level advisory lock, held on a connection of its own."""

    grace = ADVISORY_GRACE

    def __init__(self, connect: Callable[[], Any]) -> None:
        self.incarnation = _new_incarnation()
        self.lock_key = _KEYS.getrandbits(63)
        self._connect = connect
        self._conn: Any = None
        self._lock = threading.Lock()  # one thread on the connection at a time
        self._released = False  # set by release: a check still running closes the connection itself

    def hold(self) -> None:
        with self._lock:
            self._take()

    def _take(self) -> None:
        if self._released:
            raise RuntimeError("the engine has left: its liveness lock is not taken again")
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        conn = self._connect()
        try:
            for _ in range(50):
                # Another engine may hold it for a moment (checking whether this one is alive).
                if conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lock_key,)).fetchone()[0]:
                    self._conn = conn
                    return
                threading.Event().wait(0.1)
            raise RuntimeError(f"the advisory lock {self.lock_key} stayed taken")
        except BaseException:
            conn.close()
            raise

    def alive(self, db: Db, incarnations: Sequence[tuple[str, int]]) -> set[str]:
        # Taking another's key succeeds only if its session is gone; held until this transaction ends.
        return {
            incarnation
            for incarnation, key in incarnations
            if not db.execute("SELECT pg_try_advisory_xact_lock(?)", (key,)).fetchone()[0]
        }

    def process_gone(self, host: str, pid: int) -> bool:
        return process_gone(host, pid)

    def check(self) -> bool:
        """Whether the lock was held all along; if it was lost, take it again (False)."""
        with self._lock:
            try:
                return self._check()
            finally:
                if self._released:  # release gave up waiting for this check: the connection is ours to close
                    self._close()

    def _check(self) -> bool:
        try:
            if self._conn is not None and not self._conn.broken:
                self._conn.execute("SELECT 1")
                return True
        except Exception as exc:
            if self._released:
                return False  # given up by release: the engine has left
            log.warning("the connection holding this engine's liveness lock was lost (%s)", exc)
        try:
            self._take()
        except Exception as exc:
            self._conn = None  # tried again at the next check
            log.warning("could not take this engine's liveness lock again (%s)", exc)
        return False

    def release(self, wait: float) -> None:
        """Close the lock's connection, after a check in progress (``wait`` seconds at most).

        A check that does not return in time (the server went silent) is left
        behind: it closes the connection itself when it returns.
        """
        acquired = self._lock.acquire(timeout=max(wait, 0.0))
        self._released = True
        if not acquired and not self._lock.acquire(blocking=False):
            log.warning("a check of this engine's liveness lock did not return in time; leaving it behind")
            given_up = getattr(
                self._conn, "give_up", None
            )  # a PostgreSQL connection ends its wait (postgres_replies.py)
            if given_up is not None:
                given_up()
            return
        try:
            self._close()
        finally:
            self._lock.release()

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
