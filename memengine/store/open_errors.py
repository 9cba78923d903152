"""Why a store could not be opened, said as a :class:`StoreError` about the user's own path or URL.

The drivers report "unable to open database file" (no path) or a connection
failure spread over several lines; the messages here name the store (a URL
with its password replaced by ``***``), say what is wrong in one line and
what to do, and keep the driver's error as ``__cause__``.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from ..errors import StoreError

_PASSWORD_IN_USER_INFO = re.compile(r"^(?P<start>[a-z][a-z0-9+.-]*://[^@/?:]*):[^@/?]*@", re.IGNORECASE)
_PASSWORD_PARAMETER = re.compile(r"(?P<start>[?&]password=)[^&]*", re.IGNORECASE)
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://", re.IGNORECASE)


def redacted(location: str | os.PathLike[str]) -> str:
    """``location`` as a message may show it: a URL's password (in the user info or a parameter) as ``***``."""
    text = os.fspath(location)
    text = _PASSWORD_IN_USER_INFO.sub(r"\g<start>:***@", text)
    return _PASSWORD_PARAMETER.sub(r"\g<start>***", text)


def url_scheme(location: object) -> str | None:
    """The scheme of ``location`` if it is written as a URL (``scheme://...``), else ``None``."""
    if not isinstance(location, str):
        return None
    match = _URL.match(location)
    return match["scheme"].lower() if match else None


def unsupported_url(location: str) -> StoreError:
    """The error for a URL of a database memengine does not store in."""
    return StoreError(
        f"cannot open {redacted(location)}: memengine stores in SQLite (give a file path, e.g. ./memengine.db) "
        "or PostgreSQL (a postgresql:// URL), not in other databases"
    )


def driver_error(error: BaseException) -> BaseException:
    """The error to chain as ``__cause__``: the driver's, under a StoreError that already wrapped it."""
    if isinstance(error, StoreError) and error.__cause__ is not None:
        return error.__cause__
    return error


def one_line(error: BaseException) -> str:
    """A driver's message on one line, whatever it spans."""
    return " ".join(str(error).split()) or type(error).__name__


def sqlite_open_failed(path: str, error: BaseException) -> StoreError:
    """What went wrong opening the SQLite file at ``path``, and what to do, for the driver's ``error``."""
    location = Path(path)
    if isinstance(error, StoreError):
        reason = str(error)
    elif location.is_dir():
        reason = "it is a directory; give the path of a database file in it (e.g. " + str(location / "memengine.db")
        reason += ")"
    elif not location.parent.is_dir():
        reason = f"directory {location.parent} does not exist; create it, or give a path in an existing directory"
    elif isinstance(error, sqlite3.DatabaseError) and "not a database" in str(error):
        reason = (
            "the file is not a SQLite database; give the path of a memengine store or of a new file "
            "(memengine never overwrites another file)"
        )
    elif any(word in str(error) for word in ("unable to open", "readonly", "read-only", "permission")):
        reason = f"{one_line(error)}; check the path and its permissions"
    else:
        reason = one_line(error)
    return StoreError(f"cannot open the SQLite store {redacted(path)}: {reason}")


def postgres_open_failed(url: str, error: BaseException, *, connecting: bool) -> StoreError:
    """What went wrong opening the PostgreSQL store at ``url`` (``connecting``: before a connection was made)."""
    shown = redacted(url)
    if isinstance(error, StoreError):
        return StoreError(f"cannot open the PostgreSQL store at {shown}: {error}")
    if connecting:
        return StoreError(
            f"cannot connect to PostgreSQL at {shown}: {one_line(error)}; check that the server is running and "
            "that the URL's host, port, database, user and password are right"
        )
    return StoreError(f"cannot open the PostgreSQL store at {shown}: {one_line(error)}")
