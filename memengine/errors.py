"""The exceptions memengine raises, in one small hierarchy.

Catch :class:`MemEngineError` to handle anything the engine itself reports;
bad arguments raise the usual :class:`ValueError` / :class:`TypeError`.
"""

from __future__ import annotations


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


class StoreError(MemEngineError):
    """The store failed to carry out an operation; nothing of it was committed."""


class SummaryError(MemEngineError):
    """A summarizer returned something that cannot be stored as a summary."""
