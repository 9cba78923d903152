"""The running engines, and what a dead one held: released at once, not when its leases expire.

Each engine registers one row while it runs: its owner name (what its leases
and retain claims carry), an incarnation id (SQLite: its lock file's path),
and the key of a lock that says it is alive (store/liveness.py): a file lock
beside a SQLite file, an advisory lock held by an open transaction on
PostgreSQL. The operating system or the database server ends that lock when
the process dies (kill -9 and OOM included), never a clock. Death is
declared only on proof: a lock found free, or a pid gone from this very
process table; what cannot be told is alive, and the leases decide.

An owner name is dead when it has registered incarnations and none of them
holds its lock. Then another engine *reaps* it, in one transaction that checks
again: the dead owner's unexpired leases expire now (so its sessions are taken
over on their next call, and the orphan sweep finds them at once), and its
retain claims lapse now (so its batches are delivered by whoever comes next).
Only the incarnations proved dead are unregistered: an engine restarted under
the same name meanwhile keeps its registration, and what it took back.
Fencing is unchanged: a takeover still increments the token, so nothing a
former owner might still send is stored.

An owner is reaped once it has been seen dead for the liveness' ``grace``.
On SQLite the grace is 0: a file lock is held exactly as long as the
process lives. On PostgreSQL the server also ends the lock of a live process
whose connection dropped; such a process notices within a heartbeat, stops
answering reads from memory until its leases are renewed (session/lease.py)
and cancels its sink calls (retain/delivery.py), all before the grace is over
and another process could take a session or a batch over. No grace either
for a process of this machine (host name, boot id and PID namespace) that is
surely gone (its pid no longer exists, or is a zombie): the usual restart.
Where the checker cannot see the owner's process table (another machine,
another container, an older version's registration), the grace applies.

An owner never reaps its own name (a restart under the same name takes its
sessions and claims back by name), and owners that never registered (older
versions) are left to their leases' expiry.
"""

from __future__ import annotations

import os
import socket
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import attrs

from .dialect import Db, placeholders

OWNERS_TABLE = (
    "CREATE TABLE engine_owners ("
    "  incarnation text PRIMARY KEY, owner text NOT NULL, lock_key bigint NOT NULL,"
    "  host text NOT NULL, pid bigint NOT NULL, started_at double precision NOT NULL, dead_since double precision)"
)
OWNERS_INDEX = "CREATE INDEX engine_owners_by_owner ON engine_owners (owner)"


class Liveness(Protocol):
    """How one engine says it is alive, and learns whether others are (see store/liveness.py)."""

    #: Seconds an owner must have been seen dead before its retain claims are voided.
    grace: float
    incarnation: str
    lock_key: int

    def hold(self) -> None:
        """Take this engine's lock (blocking; in a thread)."""
        ...

    def check(self) -> bool:
        """Whether the lock was held all along; if it was lost, take it again (False). Blocking."""
        ...

    def release(self, wait: float) -> None:
        """Give the lock up (the engine has left); a check still running gets ``wait`` seconds, then is left behind."""
        ...

    def alive(self, db: Db, incarnations: Sequence[Incarnation]) -> set[str]:
        """Which of ``incarnations`` are alive (in a transaction of ``db``): all but those proved dead.

        Proof is a lock taken that only the process's end could have freed (or,
        on this machine, its pid gone). Whatever cannot be told (a lock file
        missing or unreadable, a lock of another kind) counts as alive: the
        lease decides.
        """
        ...

    def forget(self, incarnations: Sequence[str]) -> None:
        """Remove what is left of incarnations reaped (and committed as such): their lock files."""
        ...

    def process_gone(self, host: str, pid: int) -> bool:
        """Whether the process ``pid`` of ``host`` has surely ended (only knowable on this machine)."""
        ...


@attrs.frozen
class Incarnation:
    """One registered engine, as others check it."""

    name: str
    lock_key: int
    host: str
    pid: int


@attrs.frozen
class Reaped:
    """What one reaping released."""

    #: Owner names found dead whose leases (and, past the grace, claims) were released.
    owners: tuple[str, ...] = ()
    #: Some dead owner's claims wait for the grace: reap again a little later.
    waiting: bool = False
    #: Other engines are registered on the store (alive or not): sessions may move between processes.
    others: bool = False
    #: The incarnations proved dead and unregistered (their lock files are removed after the commit).
    incarnations: tuple[str, ...] = ()


NOTHING_REAPED = Reaped()


def this_host() -> str:
    """This machine and process table, as long as they last: host name, boot id and PID namespace.

    A pid means something only within one boot and one PID namespace:
    containers on one machine share the boot id and may share a host name,
    but each has a namespace of its own. What cannot be read is "unknown",
    and a host with anything unknown is never this one (:func:`process_gone`).
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = _UNKNOWN
    try:
        namespace = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]": the namespace's inode
    except OSError:
        namespace = _UNKNOWN
    return f"{socket.gethostname()}/{boot}/{namespace}"


_UNKNOWN = "unknown"


def process_gone(host: str, pid: int) -> bool:
    """Whether process ``pid`` of ``host`` has surely ended: False unless ``host`` is this process table.

    An owner registered by another machine, another PID namespace or an
    older version (whose host names no namespace) cannot be looked up here.
    """
    here = this_host()
    if host != here or _UNKNOWN in here.split("/")[1:]:
        return False
    if pid <= 0:
        return False  # no process's pid (and os.kill would signal a group)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        # Gone, or hidden: a /proc mounted with hidepid shows no other user's processes. Only the
        # kernel's answer is proof: "no such process" (another user's live one is "not permitted").
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")  # killed, not yet reaped by its parent


def register(db: Db, owner: str, liveness: Liveness) -> bool:
    """Record this engine as running (again, after its lock was lost and taken back); whether it still was.

    Not still registered, after a lost lock, means reaped meanwhile: its
    leases may have been released and its sessions taken by others.
    """
    # Locked: a reap of this incarnation under way is waited for, and counts.
    registered = (
        db.execute("SELECT 1 FROM engine_owners WHERE incarnation = ?{for_update}", (liveness.incarnation,)).fetchone()
        is not None
    )
    db.execute(
        "INSERT INTO engine_owners (incarnation, owner, lock_key, host, pid, started_at) "
        "VALUES (?, ?, ?, ?, ?, {now}) ON CONFLICT (incarnation) DO UPDATE SET dead_since = NULL",
        (liveness.incarnation, owner, liveness.lock_key, this_host(), os.getpid()),
    )
    return registered


def unregister(db: Db, liveness: Liveness) -> None:
    """This engine stops (its leases and claims are released with it)."""
    db.execute("DELETE FROM engine_owners WHERE incarnation = ?", (liveness.incarnation,))


def dead_owners(db: Db, liveness: Liveness, own: str, among: Sequence[str] | None = None) -> tuple[list[str], bool]:
    """Owner names (other than ``own``) whose every registered incarnation has lost its lock.

    Also whether any other engine is registered at all.
    """
    if among is not None:
        among = [name for name in dict.fromkeys(among) if name != own]
        if not among:
            return [], False
        rows = db.execute(
            f"SELECT incarnation, owner, lock_key, host, pid FROM engine_owners "
            f"WHERE owner IN ({placeholders(len(among))})",
            among,
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT incarnation, owner, lock_key, host, pid FROM engine_owners WHERE owner <> ?", (own,)
        ).fetchall()
    by_owner: dict[str, list[Incarnation]] = defaultdict(list)
    for incarnation, owner, lock_key, host, pid in rows:
        if incarnation != liveness.incarnation and owner != own:
            by_owner[owner].append(Incarnation(incarnation, int(lock_key), host, int(pid)))
    dead = sorted(owner for owner, incarnations in by_owner.items() if not liveness.alive(db, incarnations))
    return dead, bool(by_owner)


def reap(db: Db, liveness: Liveness, own: str, owners: Sequence[str]) -> Reaped:
    """Release what the dead ``owners`` held, each checked dead again inside this transaction."""
    reaped: list[str] = []
    unregistered: list[str] = []
    waiting = False
    for owner in owners:
        if owner == own:
            continue
        incarnations = [
            Incarnation(incarnation, int(key), host, int(pid))
            for incarnation, key, host, pid in db.execute(
                "SELECT incarnation, lock_key, host, pid FROM engine_owners WHERE owner = ?{for_update}", (owner,)
            ).fetchall()
        ]
        if not incarnations or liveness.alive(db, incarnations):
            continue  # reaped by another engine meanwhile, or back (a restart, a reconnection)
        # Only these incarnations were proved dead: one registered meanwhile under the same name is not touched.
        names = [each.name for each in incarnations]
        these = f"incarnation IN ({placeholders(len(names))})"
        db.execute(f"UPDATE engine_owners SET dead_since = {{now}} WHERE {these} AND dead_since IS NULL", names)
        # Dead since the last of them was found dead: a former incarnation found dead long ago (its row stays
        # while a restart under its name lives) gives no grace to a restart whose lock was lost a moment ago.
        (dead_for,) = db.execute(f"SELECT {{now}} - max(dead_since) FROM engine_owners WHERE {these}", names).fetchone()
        # A process of this machine that has ended can neither write nor answer a read: no grace.
        gone = all(liveness.process_gone(each.host, each.pid) for each in incarnations)
        if not gone and float(dead_for) < liveness.grace:
            waiting = True
            continue
        # Its sessions become orphans now (taken over on their next call, found by the orphan sweep), unless
        # a restart under its name registered meanwhile: that one took them back by name, and lives.
        # (PostgreSQL: each statement sees the registrations committed before it started; SQLite: no meanwhile.)
        no_restart = f"NOT EXISTS (SELECT 1 FROM engine_owners WHERE owner = ? AND NOT {these})"
        # Rows another transaction holds locked are passed over, never waited for (that transaction may
        # belong to a frozen process; every heartbeat of this engine would wait with it): the registration
        # stays, and the next reap comes back for them.
        db.execute(
            "UPDATE session_leases SET expires_at = {now} WHERE session_id IN ("
            "  SELECT session_id FROM session_leases WHERE owner = ? AND expires_at > {now}{skip_locked}) "
            f"AND {no_restart}",
            (owner, owner, *names),
        )
        db.execute(
            "UPDATE retain_outbox SET claim_until = {now} WHERE id IN ("
            "  SELECT id FROM retain_outbox WHERE claimed_by = ? AND claim_until > {now}{skip_locked}) "
            f"AND {no_restart}",
            (owner, owner, *names),
        )
        reaped.append(owner)
        left = db.execute(
            "SELECT EXISTS (SELECT 1 FROM session_leases WHERE owner = ? AND expires_at > {now}) "
            "OR EXISTS (SELECT 1 FROM retain_outbox WHERE claimed_by = ? AND claim_until > {now})",
            (owner, owner),
        ).fetchone()[0]
        if left and db.execute(f"SELECT {no_restart}", (owner, *names)).fetchone()[0]:
            waiting = True  # some were locked: released at the next reap
            continue
        db.execute(f"DELETE FROM engine_owners WHERE {these}", names)
        unregistered.extend(names)
    return Reaped(tuple(reaped), waiting, others=True, incarnations=tuple(unregistered))
