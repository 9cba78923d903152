"""Which failures a command reports as a one-line message instead of a traceback."""

from __future__ import annotations

import sqlite3

from ..errors import MemEngineError

try:
    from psycopg import Error as _PostgresError
except ImportError:  # pragma: no cover - depends on the install (PostgreSQL is an extra)
    _PostgresError = OSError  # type: ignore[assignment,misc]

# What a command can run into for reasons outside the program: the store refused
# an operation, SQLite could not read or write the file, PostgreSQL could not be
# reached or refused a statement, the file system said no.
EXPECTED_FAILURES = (MemEngineError, sqlite3.Error, _PostgresError, OSError)


def first_failure(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first plain exception inside a (possibly nested) exception group.

    Task groups (the engine's and the store's) wrap what fails inside them; the
    message users need is the innermost one.
    """
    failure: BaseException = group
    while isinstance(failure, BaseExceptionGroup):
        failure = failure.exceptions[0]
    return failure
