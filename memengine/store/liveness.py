"""An engine's proof of life: a lock the operating system or the database ends when the process dies.

See store/owners.py for what is done with it. Two kinds:

- :class:`FileLiveness` (SQLite): an exclusive ``flock`` on a file of its own
  in ``<database>-owners/`` (beside the database's resolved path), held for
  the engine's lifetime; the engine registers that file's absolute path. The
  kernel drops the lock when the process exits, however it exits. Another
  engine that can take the lock knows the process is gone (and, once it has
  reaped it, removes the file); one that cannot open the file knows nothing.
  ``flock`` locks belong to the open file, so two engines in one process are
  told apart.
  Where files cannot be locked (no ``fcntl``, a read-only directory), there is
  no liveness: leases expire as before.
- :class:`AdvisoryLiveness` (PostgreSQL): an advisory lock on a random 63-bit
  key, held by a transaction left open on a connection of its own (so that a
  transaction pooler pins it to one server connection, which no other client
  then shares). The server drops it when that connection ends: at once when
  the process dies (its socket is closed), later when a network cut is noticed. Another engine checks with
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
import re
import threading
import uuid
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .dialect import Db
from .owners import Incarnation, process_gone

log = logging.getLogger("memengine.store")

#: PostgreSQL: seconds an owner must have been seen dead before its retain claims are voided. Longer
#: than a heartbeat (:data:`HEARTBEAT_SECONDS`) and its timeout, so a live process that lost its lock
#: has cancelled its sink calls by then.
ADVISORY_GRACE = 5.0
#: How often an engine checks that it still holds its liveness lock (and reaps dead owners).
HEARTBEAT_SECONDS = 1.0

_ID = re.compile("[0-9a-f]{32}")  # an incarnation's random id (uuid4 hex)
_KEYS = random.Random()  # the engine's own: the global random state belongs to the application


def _new_incarnation() -> str:
    return uuid.uuid4().hex


#: The liveness locks this process holds: a forked child lets go of them (:func:`_in_forked_child`).
_HELD: weakref.WeakSet[Any] = weakref.WeakSet()


def _in_forked_child() -> None:
    """A forked child is not its parent: it lets go of the parent's locks, and never takes them again.

    Otherwise the child (a worker forked by ``multiprocessing``, say) would
    keep the parent looking alive after its death, and its sessions would wait
    for their leases. The child's engines are its parent's; they hold no lock.
    """
    for liveness in list(_HELD):
        liveness.drop_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


class FileLiveness:
    """A ``flock`` on ``<database>-owners/<random id>`` for as long as the engine runs.

    The directory sits beside the database file's resolved path (symlinks
    and the working directory resolved when the store opened), and the
    incarnation registered *is* the lock file's absolute path: an engine that
    reaches the database by another path (a symlink, a hard link, another
    working directory) checks the very file the owner locks. A lock file that
    cannot be opened (removed by a tmp cleaner, unreadable) proves nothing:
    its owner is alive unless its pid is gone from this machine. The owner
    puts a removed file back at its next heartbeat.
    """

    grace = 0.0
    lock_key = 0

    def __init__(self, directory: Path, mode: int = 0o600, group: int | None = None) -> None:
        self._directory = directory
        self._path = directory / _new_incarnation()
        self.incarnation = str(self._path)
        self._mode = mode  # the lock files' (the database file's read and write bits)
        self._group = group  # and their group (the database file's)
        self._fd: int | None = None
        self._lock = threading.Lock()  # a heartbeat putting the file back, the exit removing it
        self._unreadable: set[str] = set()  # lock files of others this engine could not open (said once)

    @classmethod
    def beside(cls, database: str) -> FileLiveness | None:
        """The liveness for the SQLite file ``database``; None where files cannot be locked."""
        if database == ":memory:" or database.startswith("file:"):
            return None
        try:
            import fcntl  # noqa: F401
        except ImportError:  # not on this platform: leases expire as before
            return None
        resolved = os.path.realpath(database)
        try:
            stat = os.stat(resolved)
        except OSError:
            return cls(Path(resolved + "-owners"))
        # Whoever may write the database may lock beside it, and others can check the lock.
        return cls(Path(resolved + "-owners"), stat.st_mode & 0o666, stat.st_gid)

    def hold(self) -> None:
        _HELD.add(self)
        try:
            self._fd = _locked_file(self._path, self._mode, self._group)
        except PermissionError as exc:
            raise PermissionError(
                f"cannot create this engine's liveness lock file {self._path} ({exc.strerror}). Every user of the "
                f"database needs write access to {self._directory}: give them a shared group that may write it "
                f"(chgrp GROUP {self._directory}; chmod g+rwx {self._directory}), or remove the directory and "
                "give the database file the permissions they share (memengine makes the directory and its files "
                "like it)"
            ) from exc

    def alive(self, db: Db, incarnations: Sequence[Incarnation]) -> set[str]:
        return {each.name for each in incarnations if not self._proved_dead(each)}

    def _proved_dead(self, incarnation: Incarnation) -> bool:
        import fcntl

        path = self._lock_file(incarnation.name)
        try:
            if path is None:
                raise FileNotFoundError(incarnation.name)
            fd = os.open(path, os.O_RDONLY)  # flock needs no write access
        except OSError as exc:
            # Removed (a tmp cleaner, a reaper whose transaction failed), unreadable, not ours to judge:
            # no proof from the file.
            if isinstance(exc, PermissionError) and incarnation.name not in self._unreadable:
                self._unreadable.add(incarnation.name)
                log.warning(
                    "cannot read another engine's liveness lock file %s (%s): it counts as alive until its pid is "
                    "gone or its leases expire. Give the database file permissions every user of it shares (the "
                    "lock files follow them), or a group that may read %s",
                    path,
                    exc.strerror,
                    self._directory,
                )
            return process_gone(incarnation.host, incarnation.pid)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # held (or not lockable here): alive
        else:
            return True  # only the end of its holder frees it
        finally:
            os.close(fd)

    def _lock_file(self, incarnation: str) -> Path | None:
        """Where ``incarnation`` keeps its lock; None for what is no incarnation of this kind."""
        if os.sep not in incarnation:
            return self._directory / incarnation  # an older version's: beside the file, by its bare id
        path = Path(incarnation)
        if path.is_absolute() and path.parent.name.endswith("-owners") and _ID.fullmatch(path.name):
            return path
        return None

    def forget(self, incarnations: Sequence[str]) -> None:
        for incarnation in incarnations:
            path = self._lock_file(incarnation)
            if path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()

    def check(self) -> bool:
        """A file lock is held exactly as long as the process lives; its file is put back if it was removed."""
        with self._lock:
            if self._fd is None:
                return True
            try:
                if os.path.samestat(os.stat(self._path), os.fstat(self._fd)):
                    return True
            except OSError:
                pass
            try:
                fd = _locked_file(self._path, self._mode, self._group)
            except OSError as exc:
                log.warning("this engine's liveness file %s was removed and cannot be made again (%s)", self._path, exc)
                return True  # others cannot tell: they count it alive, its leases decide
            log.warning("this engine's liveness file %s was removed (a tmp cleaner?): made again", self._path)
            os.close(self._fd)
            self._fd = fd
            return True

    def process_gone(self, host: str, pid: int) -> bool:
        return process_gone(host, pid)

    def drop_inherited(self) -> None:
        """In a forked child: close this copy of the parent's lock file (the parent's lock ends with the parent)."""
        self._lock = threading.Lock()  # another thread of the parent may have held it: that thread is not here
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None  # nothing to check, put back or remove from here

    def release(self, wait: float) -> None:
        with self._lock:
            if self._fd is None:
                return
            with contextlib.suppress(OSError):
                self._path.unlink()
            os.close(self._fd)
            self._fd = None


def _locked_file(path: Path, mode: int, group: int | None) -> int:
    """A new file at ``path``, locked before it appears there: never found unlocked while its owner lives.

    It gets ``mode`` and ``group`` whatever the umask (the directory too, if made now: searchable where readable).
    """
    import fcntl

    directory = path.parent
    try:
        directory.mkdir()
    except FileExistsError:
        pass
    else:
        _share(directory, mode | (mode & 0o444) >> 2, group)
    unseen = path.with_name(f".{path.name}.new")
    fd = os.open(unseen, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o600)
    try:
        _share(fd, mode, group)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(unseen, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            unseen.unlink()
        raise
    return fd


def _share(target: int | Path, mode: int, group: int | None) -> None:
    """Give ``target`` (a descriptor or a path) ``mode`` and, where this process may, ``group``."""
    if group is not None:
        with contextlib.suppress(OSError):  # not a member of the database file's group: its own group then
            os.chown(target, -1, group)
    os.chmod(target, mode)


def _in_transaction(conn: Any) -> bool:
    """Whether ``conn`` (psycopg) is still in the transaction that holds the lock (not ended, not failed)."""
    return getattr(conn.info.transaction_status, "name", "") == "INTRANS"


class AdvisoryLiveness:
    """A transaction-level advisory lock, held in a transaction that stays open on a connection of its own."""

    grace = ADVISORY_GRACE

    def __init__(self, connect: Callable[[], Any]) -> None:
        self.incarnation = _new_incarnation()
        self.lock_key = _KEYS.getrandbits(63)
        self._connect = connect
        self._conn: Any = None
        self._lock = threading.Lock()  # one thread on the connection at a time
        self._released = False  # set by release: a check still running closes the connection itself
        self._inherited = False  # in a forked child: the lock and its connection are the parent's

    def hold(self) -> None:
        _HELD.add(self)
        with self._lock:
            self._take()

    def drop_inherited(self) -> None:
        """In a forked child: never check, take or give back the parent's lock (its connection is the parent's).

        The connection's socket itself is let go of with every memengine
        connection's (postgres/connection.py): the server ends the lock when
        the parent dies. The connection object is kept: dropped, it would be
        finalized, and say goodbye to the server on the parent's socket.
        """
        self._lock = threading.Lock()
        self._released = True
        self._inherited = True

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
                # Held in a transaction that stays open: a transaction pooler (PgBouncer) pins it to one
                # server connection, where no other client runs. A session-level lock would stay on a
                # pooled server connection, where another engine's probe gets it too (advisory locks are
                # re-entrant per server session) and takes this live engine for dead. The transaction
                # takes no snapshot between statements and writes nothing: it holds back no vacuum.
                conn.execute("BEGIN")
                conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")  # idle between heartbeats
                # Another engine may hold it for a moment (checking whether this one is alive).
                if conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (self.lock_key,)).fetchone()[0]:
                    self._conn = conn
                    return
                conn.execute("ROLLBACK")
                threading.Event().wait(0.1)
            raise RuntimeError(f"the advisory lock {self.lock_key} stayed taken")
        except BaseException:
            conn.close()
            raise

    def alive(self, db: Db, incarnations: Sequence[Incarnation]) -> set[str]:
        # Taking another's key succeeds only if its session is gone; held until this transaction ends.
        return {
            each.name
            for each in incarnations
            if not db.execute("SELECT pg_try_advisory_xact_lock(?)", (each.lock_key,)).fetchone()[0]
        }

    def forget(self, incarnations: Sequence[str]) -> None:
        pass  # nothing outside the database

    def process_gone(self, host: str, pid: int) -> bool:
        return process_gone(host, pid)

    def check(self) -> bool:
        """Whether the lock was held all along; if it was lost, take it again (False)."""
        if self._inherited:
            return True  # the parent's, not this child's to check
        with self._lock:
            try:
                return self._check()
            finally:
                if self._released:  # release gave up waiting for this check: the connection is ours to close
                    self._close()

    def _check(self) -> bool:
        try:
            if self._conn is not None and not self._conn.broken and _in_transaction(self._conn):
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
            )  # a PostgreSQL connection ends its wait (postgres/replies.py)
            if given_up is not None:
                given_up()
            return
        try:
            self._close()
        finally:
            self._lock.release()

    def _close(self) -> None:
        if self._conn is not None and not self._inherited:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
