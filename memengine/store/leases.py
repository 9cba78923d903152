"""Session leases: at most one process owns (writes) a session at a time.

A lease row names the owner, a fencing token and an expiry, judged by the
database's clock. Taking a session over (when its lease is free, expired or
already ours) increments the token, so every earlier activation holds a stale
one. Every write of a session checks its token and expiry inside the write's
own transaction (locking the lease row on PostgreSQL, where a takeover must
then wait for the write to commit): a paused or partitioned former owner can
never write. Releasing keeps the row (and its token), so tokens never repeat.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import LeaseLostError, SessionBusyError
from . import handover
from .dialect import Db, placeholders

_PER_STATEMENT = 1000  # leases per statement (two parameters each)

#: The floor of new lease tokens (one row): the highest token an erased lease held (store/erasure.py).
TOKEN_FLOOR_TABLE = "CREATE TABLE lease_token_floor (id integer PRIMARY KEY CHECK (id = 1), token bigint NOT NULL)"
#: The first token of a lease row created now: above every token an erased lease held, so none repeats.
NEW_LEASE_TOKEN = "1 + coalesce((SELECT f.token FROM lease_token_floor AS f WHERE f.id = 1), 0)"


def acquire(db: Db, session_id: str, owner: str, ttl: float) -> int | SessionBusyError:
    """Take the session's lease for ``ttl`` seconds and return the new token, or why not.

    Busy is returned, not raised, so the transaction it shares with other
    operations goes on; and a lease seen held is not touched (a refused
    upsert would still lock its row on PostgreSQL). Nor is a lease row that
    another transaction has locked waited for (PostgreSQL): that transaction
    may belong to a process frozen mid-write, and every operation sharing
    this transaction would wait with it. The session is reported busy
    instead, and the caller tries again within ``lease_wait``.
    """
    holder = db.execute(
        "SELECT owner, expires_at - {now} FROM session_leases WHERE session_id = ?{skip_locked}", (session_id,)
    ).fetchone()
    if holder is None:
        locked = db.execute(
            "SELECT owner, expires_at - {now} FROM session_leases WHERE session_id = ?", (session_id,)
        ).fetchone()
        if locked is not None:
            return SessionBusyError(session_id, locked[0] or "another process", float(locked[1]), locked=True)
    busy = _busy(session_id, owner, holder)
    if busy is not None:
        handover.mark_wanted(db, session_id)  # its owner lets it go once idle (store/handover.py)
        return busy
    row = db.execute(
        # A new row's first token lies above every token of an erased lease (store/erasure.py).
        f"INSERT INTO session_leases (session_id, owner, token, expires_at) VALUES (?, ?, {NEW_LEASE_TOKEN}, "
        "{now} + ?) "
        # The expiry is computed again on conflict: the row lock may have been waited for.
        "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, token = session_leases.token + 1, "
        "  expires_at = {now} + ?, wanted_at = NULL "
        "WHERE session_leases.owner IS NULL OR session_leases.owner = excluded.owner "
        "  OR session_leases.expires_at <= {now} "
        "RETURNING token",
        (session_id, owner, ttl, ttl),
    ).fetchone()
    if row is not None:
        return int(row[0])
    # Taken by another process since the check (PostgreSQL): report it.
    return _held_elsewhere(db, session_id, owner) or acquire(db, session_id, owner, ttl)


def _held_elsewhere(db: Db, session_id: str, owner: str) -> SessionBusyError | None:
    holder = db.execute(
        "SELECT owner, expires_at - {now} FROM session_leases WHERE session_id = ?", (session_id,)
    ).fetchone()
    return _busy(session_id, owner, holder)


def _busy(session_id: str, owner: str, holder: tuple | None) -> SessionBusyError | None:
    if holder is None or holder[0] is None or holder[0] == owner or holder[1] <= 0:
        return None
    return SessionBusyError(session_id, holder[0], float(holder[1]))


def require(db: Db, session_id: str, token: int) -> None:
    """Refuse the write (and with it its transaction's savepoint) unless ``token`` holds the live lease."""
    row = db.execute(
        "SELECT 1 FROM session_leases WHERE session_id = ? AND token = ? AND expires_at > {now}{for_share}",
        (session_id, token),
    ).fetchone()
    if row is None:
        raise LeaseLostError(
            f"session {session_id!r}: this process's lease (token {token}) expired or was taken over; "
            "nothing was stored"
        )


def all_held(db: Db, leases: Sequence[tuple[str, int]]) -> bool:
    """Whether every ``(session_id, token)`` holds its live lease (a query per 1,000 for a group commit).

    The rows are found by session id (the primary key), and the tokens
    compared here: matching ``(session_id, token)`` pairs in SQL made SQLite
    scan every lease row ever written, for every group commit.
    """
    tokens = dict(leases)
    if len(tokens) != len(set(leases)):
        return False  # one session under two tokens: one of them is stale (the caller checks each on its own)
    # In id order across statements too: the rows are locked in the order renew locks them.
    ids = sorted(tokens)
    for start in range(0, len(ids), _PER_STATEMENT):  # any number of sessions: the fast path holds
        chunk = ids[start : start + _PER_STATEMENT]
        rows = db.execute(
            f"SELECT session_id, token FROM session_leases WHERE session_id IN ({placeholders(len(chunk))}) "
            f"AND expires_at > {{now}} ORDER BY session_id{{for_share}}",
            chunk,
        ).fetchall()
        if len(rows) != len(chunk) or any(tokens[session_id] != token for session_id, token in rows):
            return False
    return True


def renew(db: Db, owner: str, leases: Iterable[tuple[str, int]], ttl: float, *, skip_locked: bool = False) -> set[str]:
    """Extend the given leases still held, unexpired, under their token; return the sessions renewed.

    An expired lease is not revived, even if nobody took it yet: other
    processes may already treat its session as orphaned. With ``skip_locked``
    (PostgreSQL), a lease row another transaction holds locked is passed over
    instead of waited for.
    """
    lock = "{skip_locked}" if skip_locked else "{for_update}"
    held = list(dict.fromkeys(leases))
    renewed: set[str] = set()
    for start in range(0, len(held), _PER_STATEMENT):  # stay far below the drivers' parameter limits
        chunk = held[start : start + _PER_STATEMENT]
        values = ", ".join(["(?, ?)"] * len(chunk))
        # The rows are locked in id order, as all_held locks them: a renewal on its own connection
        # (PostgreSQL) waits for this process's writes instead of deadlocking with them.
        rows = db.execute(
            "UPDATE session_leases SET expires_at = {now} + ? WHERE session_id IN ("
            f"  SELECT session_id FROM session_leases WHERE owner = ? AND expires_at > {{now}} "
            f"  AND (session_id, token) IN (VALUES {values}) ORDER BY session_id{lock}) "
            "RETURNING session_id",
            [ttl, owner, *(part for lease in chunk for part in lease)],
        ).fetchall()
        renewed.update(row[0] for row in rows)
    return renewed


def extend(db: Db, session_id: str, token: int, ttl: float) -> None:
    """Set the lease this transaction took (its row locked until commit) to last ``ttl`` from now."""
    db.execute(
        "UPDATE session_leases SET expires_at = {now} + ? WHERE session_id = ? AND token = ?", (ttl, session_id, token)
    )


def release(db: Db, session_id: str, token: int) -> None:
    db.execute(
        "UPDATE session_leases SET owner = NULL, expires_at = 0 WHERE session_id = ? AND token = ?",
        (session_id, token),
    )


def release_all(db: Db, owner: str) -> None:
    """Give up every session lease and retain claim of ``owner`` (engine exit)."""
    db.execute("UPDATE session_leases SET owner = NULL, expires_at = 0 WHERE owner = ?", (owner,))
    db.execute("UPDATE retain_outbox SET claimed_by = NULL, claim_until = NULL WHERE claimed_by = ?", (owner,))


#: SQL condition: the session aliased ``s`` is not owned by a live process other than ``?``.
NOT_OWNED_ELSEWHERE = (
    "NOT EXISTS (SELECT 1 FROM session_leases AS l WHERE l.session_id = s.session_id "
    "AND l.owner IS NOT NULL AND l.owner <> ? AND l.expires_at > {now})"
)
#: SQL condition: the session aliased ``s`` was left by an owner that died (its lease expired, never released).
#: Driven from the leases still held (a partial index), not by a scan of every session.
ORPHANED = (
    "s.session_id IN (SELECT l.session_id FROM session_leases AS l WHERE l.owner IS NOT NULL AND l.expires_at <= {now})"
)


def still_unowned(db: Db, session_id: str, owner: str, orphaned_only: bool) -> bool:
    """:func:`unowned`, checked again for one session with its lease row locked (PostgreSQL) until commit.

    A lease row another transaction holds locked counts as owned: never waited for.
    """
    row = db.execute(
        "SELECT owner, expires_at <= {now} FROM session_leases WHERE session_id = ?{skip_locked}", (session_id,)
    ).fetchone()
    if row is None:
        # No lease yet, or one another transaction has locked (left alone: it may never end).
        return (
            not orphaned_only
            and db.execute("SELECT 1 FROM session_leases WHERE session_id = ?", (session_id,)).fetchone() is None
        )
    lease_owner, expired = row
    if orphaned_only:
        return lease_owner is not None and bool(expired)
    return lease_owner is None or lease_owner == owner or bool(expired)


def unowned(owner: str, orphaned_only: bool) -> tuple[str, tuple[str, ...]]:
    """The SQL condition (on sessions ``s``) and its parameters for sessions this owner may take on."""
    return (ORPHANED, ()) if orphaned_only else (NOT_OWNED_ELSEWHERE, (owner,))
