"""The exceptions memengine raises, in one small hierarchy.

Catch :class:`MemEngineError` to handle anything the engine itself reports;
bad arguments raise the usual :class:`ValueError` / :class:`TypeError`.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .privacy.report import ForgetReport


class MemEngineError(Exception):
    """Base class for every error the engine reports."""


class SessionClosedError(MemEngineError):
    """The session handle was closed with :meth:`Session.close`.

    Only that handle is closed: ``engine.session(id)`` returns a working one.
    """


class EngineClosedError(MemEngineError):
    """The engine has shut down (or is shutting down) and takes no more calls.

    A call that was waiting for its reply when the engine stopped gets this
    error too; its message may or may not have been handled (``add`` is
    idempotent by episode id, so re-adding after a restart is safe).
    """


class ForeignLoopError(MemEngineError, RuntimeError):
    """A call came from an event loop other than the engine's (another thread's, or another library's).

    The engine answers a call by waking its caller on the engine's own event
    loop, which cannot wake a task of another loop: such a call would never
    return. It is refused before anything is sent (nothing was done). Make
    the call on the engine's loop instead: run the engine behind a portal
    (``anyio.from_thread.start_blocking_portal()``) and call through it
    (``portal.call(session.add, episodes)``); :class:`MemEngineSession` of the
    OpenAI Agents integration takes it as ``portal=``.
    """


class EngineFailedError(MemEngineError):
    """One of the engine's own tasks failed unexpectedly (a bug): the engine stopped.

    Raised when leaving ``open_engine``; the original error is its ``__cause__``.
    An error raised by the code inside the ``async with`` block is never replaced
    by this: it leaves the block as itself.
    """


class StoreError(MemEngineError):
    """The store failed to carry out an operation; nothing of it was committed."""


class UncertainCommitError(StoreError):
    """The connection to the database was lost while committing: the operation may or may not be stored.

    The session is reloaded from the store before its next operation.
    Retrying ``add`` is safe: adds are idempotent by episode id.
    """


class SummaryError(MemEngineError):
    """A summarizer returned something that cannot be stored as a summary."""


class SessionBusyError(MemEngineError):
    """Another process owns the session (holds its lease) and did not give it up in time.

    ``owner`` names that process; ``expires_in`` is how long its lease runs
    unless renewed (seconds). ``locked`` is true when the lease itself was
    free to take but another process's transaction held its row locked
    (PostgreSQL: a process frozen or cut off mid-write; the server ends such a
    transaction after ``idle_in_transaction_session_timeout``). Retry later,
    or route the session's traffic to its owner. When the owner is another
    engine of this same process (a default owner name, ``host:pid:random``,
    with this host and pid), the message says so: engines on one store
    contend for sessions like separate processes, so share one engine.
    """

    def __init__(
        self, session_id: str, owner: str, expires_in: float, waited: float = 0.0, *, locked: bool = False
    ) -> None:
        if locked:
            held = (
                f"is locked by an unfinished transaction (last owner {owner!r}; the process may be frozen or cut "
                "off mid-write)"
            )
        elif _is_this_process(owner):
            held = (
                f"is owned by another engine in this same process (pid {os.getpid()}, owner {owner!r}; its lease "
                f"runs {max(expires_in, 0.0):.1f} s more unless renewed): engines on one store contend for its "
                "sessions like separate processes, so share one engine"
            )
        else:
            held = f"is owned by {owner!r} (its lease runs {max(expires_in, 0.0):.1f} s more unless renewed)"
        super().__init__(f"session {session_id!r} {held}; waited {waited:.1f} s")
        self.session_id = session_id
        self.owner = owner
        self.expires_in = expires_in
        self.locked = locked


class LeaseLostError(MemEngineError):
    """This process no longer owns the session: its lease expired or another process took it over.

    The operation was not stored (the store refuses writes under a stale
    lease, in the same transaction). The session is given up here; calling
    again activates it anew once no other process owns it.
    """


def _is_this_process(owner: str) -> bool:
    """Whether ``owner`` is a default owner name (``host:pid:random``) of this very process."""
    parts = owner.rsplit(":", 2)
    return len(parts) == 3 and parts[0] == socket.gethostname() and parts[1] == str(os.getpid())


class ForgetIncompleteError(MemEngineError):
    """``Engine.forget`` erased what it could, but not every session of the scope.

    ``report`` counts what was erased (a ``ForgetReport``); ``left`` maps each
    session not erased to why (usually :class:`SessionBusyError`: another
    process kept it busy past ``lease_wait``). Nothing is half-erased that a
    second ``forget`` would not finish: call it again.
    """

    def __init__(self, report: ForgetReport, left: dict[str, MemEngineError]) -> None:
        first_id, first_error = next(iter(left.items()))
        erased = report.sessions
        super().__init__(
            f"forget of {report.scope}: {erased} session{'s' if erased != 1 else ''} "
            f"erased, {len(left)} not (session {first_id!r}: {first_error}); call forget again"
        )
        self.report = report
        self.left = left
