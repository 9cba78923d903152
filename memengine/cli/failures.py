"""Which failures a command reports as a one-line message instead of a traceback, and with which exit status."""

from __future__ import annotations

import sqlite3
import sys

from ..errors import MemEngineError, StoreError
from ..store.open_errors import one_line
from . import exit_status

try:
    from psycopg import Error as _PostgresError
except ImportError:  # pragma: no cover - depends on the install (PostgreSQL is an extra)
    _PostgresError = OSError  # type: ignore[assignment,misc]

# What a command can run into for reasons outside the program: the store refused
# an operation, SQLite could not read or write the file, PostgreSQL could not be
# reached or refused a statement, the file system said no.
EXPECTED_FAILURES = (MemEngineError, sqlite3.Error, _PostgresError, OSError)
# Of those, the ones that say the store itself cannot be opened or used.
STORE_FAILURES = (StoreError, sqlite3.Error, _PostgresError, OSError)


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first plain exception inside a (possibly nested) exception group.

    Task groups (the engine's and the store's) wrap what fails inside them; the
    message users need is the innermost one.
    """
    failure: BaseException = group
    while isinstance(failure, BaseExceptionGroup):
        failure = failure.exceptions[0]
    return failure


def status_of(failure: BaseException) -> int:
    """The exit status for ``failure`` (see exit_status.py)."""
    return exit_status.STORE_UNUSABLE if isinstance(failure, STORE_FAILURES) else exit_status.FAILED


def report(command: str, failure: BaseException, what: str = "") -> int:
    """Print ``failure`` as one line on stderr (``what`` the command was doing first); return its exit status."""
    doing = f"{what}: " if what else ""
    print(f"memengine {command}: {doing}{one_line(failure)}", file=sys.stderr)
    return status_of(failure)
