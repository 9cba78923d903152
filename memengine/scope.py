"""Which sessions a call reaches: one session, one tenant's, those under a prefix, or every one.

Tenancy is a naming convention: a session id ``"alice/chat-1"`` belongs to
the tenant ``"alice"``, the part before the first ``/``. A tenant's sessions
are the sessions whose ids start with ``"alice/"``, so the convention needs
no table and no migration, and works on ids already stored.

A scope is always said explicitly (:meth:`Scope.of`): a call that searches or
erases across sessions names one session, one tenant, a prefix, or (recall
only) every session, so that one forgotten argument never reaches another
user's data.

Prefixes are matched exactly, case and all, on both stores: the condition
compares the id's first characters with the prefix (``substr``), not a
``LIKE`` pattern, so ``%`` and ``_`` in an id are ordinary characters and
SQLite's case-insensitive ``LIKE`` cannot match ``"Alice/"`` to ``"alice/"``.
"""

from __future__ import annotations

import attrs

from .limits import MAX_SESSION_ID_BYTES, require_text

#: What separates a tenant from the rest of a session id.
TENANT_SEPARATOR = "/"


def tenant_prefix(tenant: object) -> str:
    """The prefix of ``tenant``'s session ids: ``"alice"`` -> ``"alice/"`` (``ValueError`` if not a tenant).

    A tenant is a non-blank str without ``/`` and without NUL, short enough
    that its sessions' ids fit ``MAX_SESSION_ID_BYTES``.
    """
    require_text("a tenant", tenant, max_bytes=MAX_SESSION_ID_BYTES - 2)
    assert isinstance(tenant, str)
    if TENANT_SEPARATOR in tenant:
        raise ValueError(f"a tenant must not contain {TENANT_SEPARATOR!r} (its sessions are 'tenant/...'): {tenant!r}")
    return tenant + TENANT_SEPARATOR


def tenant_of(session_id: str) -> str | None:
    """The tenant a session id belongs to (the part before the first ``/``), or None if it has no ``/``."""
    tenant, separator, _ = session_id.partition(TENANT_SEPARATOR)
    return tenant if separator and tenant else None


@attrs.frozen
class Scope:
    """One session (``session_id``), the sessions whose ids start with ``prefix``, or (both None) every session."""

    session_id: str | None = None
    prefix: str | None = None

    @classmethod
    def of(
        cls,
        call: str,
        *,
        session_id: str | None = None,
        tenant: str | None = None,
        prefix: str | None = None,
        all_sessions: bool = False,
        allow_all: bool = True,
    ) -> Scope:
        """The one scope given to ``call``; ``ValueError`` naming the options unless exactly one was given."""
        if not isinstance(all_sessions, bool):
            raise TypeError(f"all_sessions must be a bool, not {type(all_sessions).__name__}")
        given = [
            name
            for name, value in (
                ("session_id", session_id),
                ("tenant", tenant),
                ("prefix", prefix),
                ("all_sessions", all_sessions or None),
            )
            if value is not None
        ]
        options = "session_id=..., tenant=... (its sessions 'tenant/...'), prefix=..."
        options += ", or all_sessions=True" if allow_all else ""
        if len(given) != 1:
            what = "none" if not given else " and ".join(given)
            raise ValueError(f"{call} takes exactly one scope: {options}; got {what}")
        if all_sessions:
            if not allow_all:
                raise ValueError(f"{call} does not take all_sessions; give {options}")
            return cls()
        if session_id is not None:
            return cls(session_id=require_text("a session id", session_id, max_bytes=MAX_SESSION_ID_BYTES))
        if tenant is not None:
            return cls(prefix=tenant_prefix(tenant))
        return cls(prefix=require_text("a prefix", prefix, max_bytes=MAX_SESSION_ID_BYTES))

    @property
    def every_session(self) -> bool:
        return self.session_id is None and self.prefix is None

    def includes(self, session_id: str) -> bool:
        if self.session_id is not None:
            return session_id == self.session_id
        return self.prefix is None or session_id.startswith(self.prefix)

    def condition(self, column: str) -> tuple[str, tuple[str, ...]]:
        """An SQL condition on ``column`` (a session id) for this scope, with its parameters (``?`` style).

        The same text on SQLite and PostgreSQL: ``substr`` and ``length`` count
        characters on both, and the comparison is exact (no wildcards, no case folding).
        """
        if self.session_id is not None:
            return f"{column} = ?", (self.session_id,)
        if self.prefix is not None:
            return f"substr({column}, 1, length(?)) = ?", (self.prefix, self.prefix)
        return "1 = 1", ()

    def __str__(self) -> str:
        if self.session_id is not None:
            return f"session {self.session_id!r}"
        if self.prefix is not None:
            tenant = self.prefix[: -len(TENANT_SEPARATOR)]
            if self.prefix.endswith(TENANT_SEPARATOR) and tenant and TENANT_SEPARATOR not in tenant:
                return f"tenant {tenant!r}"
            return f"sessions under {self.prefix!r}"
        return "every session"


#: Every session (recall with ``all_sessions=True``).
EVERY_SESSION = Scope()
