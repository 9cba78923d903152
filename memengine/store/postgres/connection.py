"""How the PostgreSQL store connects: bounded waits, one pinned schema, prepared statements.

Every connection the store opens (writer, reader, every reconnect) goes
through :func:`connect`, which adds these defaults to what the URL says:

==========================================  =========  ==========================================
setting                                     default    why
==========================================  =========  ==========================================
``connect_timeout``                         10 s       an unreachable server fails the open (or
                                                       the reconnect) instead of hanging it
``keepalives``, ``keepalives_idle``,        1, 30 s,   a peer that vanished (a failover, a cut
``keepalives_interval``, ``keepalives_count``  10 s, 3    network) is noticed in about a minute,
                                                       not after the kernel's two hours
``lock_timeout`` (server setting)           5 s        a statement waiting on a lock (a
                                                       migration's, an operator's) fails rather
                                                       than queueing every replica behind it
``idle_in_transaction_session_timeout``     60 s       a frozen or partitioned replica's
                                                       transaction, and its row locks, die with
                                                       its session instead of blocking others
``statement_timeout``                       60 s       no statement runs unbounded
``reply_timeout`` (memengine's own)         statement  a server gone silent (a partition that
                                            timeout    drops nothing, a frozen server) fails the
                                            + 30 s     call instead of hanging it; see
                                                       postgres/replies.py
==========================================  =========  ==========================================

A setting the URL already gives is left as the user gave it: a parameter
(``?connect_timeout=3``) or a server setting in ``options``
(``?options=-c%20lock_timeout%3D1s``, or ``-clock_timeout=1s``, ``--lock-timeout=1s``).
Without ``options`` in the URL, ``PGOPTIONS`` from the environment is the starting point;
``PGCONNECT_TIMEOUT`` counts as setting ``connect_timeout``. ``0`` turns a timeout off.

``reply_timeout`` (seconds, in the URL: ``?reply_timeout=20``) is the client's
own bound: how long a connection waits without a byte from the server before
it gives the connection up. memengine takes it out of the URL. By default it
is the ``statement_timeout`` in force plus 30 s, so that a statement the
server is still running is never cut short; with ``statement_timeout`` off
(``0``) and no ``reply_timeout`` given, the client waits for ever.

Prepared statements: psycopg prepares a statement on the server after it has
run it five times on a connection, which breaks transaction poolers that do
not track prepared statements (PgBouncer before 1.21 in transaction mode).
``?prepare_threshold=none`` in the URL turns preparing off
(``prepare_threshold=N`` prepares after N runs); memengine takes the
parameter out of the URL before connecting.

The schema: :func:`pinned` rewrites a URL so its connections use exactly one
schema (``-c search_path=<schema>``), whatever the user's ``search_path``
said; :func:`pinned_to_tables` resolves that schema once, when the store opens
(see postgres_schema.find_schema), and every connection the store opens
afterwards is pinned to it: a schema created later in front of it in the
``search_path`` changes nothing, for running and restarting replicas alike.
"""

from __future__ import annotations

import contextlib
import os
import re
import weakref
from typing import Any
from urllib.parse import quote, unquote

from ...errors import StoreError

#: Connection parameters added when neither the URL nor the environment gives them.
DEFAULT_PARAMETERS = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}
#: Server settings added (as ``options=-c name=value``) when the URL's options do not set them.
DEFAULT_SETTINGS = {
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "60s",
    "statement_timeout": "60s",
}
#: Seconds ``reply_timeout`` adds, by default, to the ``statement_timeout`` in force.
REPLY_MARGIN = 30.0
_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}
_PREPARE_THRESHOLD = "prepare_threshold"
_REPLY_TIMEOUT = "reply_timeout"
_MEMENGINE_PARAMETERS = (_PREPARE_THRESHOLD, _REPLY_TIMEOUT)
# PostgreSQL's time units; a bare number of statement_timeout is milliseconds.
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "": 1e-3}
_TIME_VALUE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-z]*)\s*", re.IGNORECASE)
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")
_USER_INFO = re.compile(r"^(?P<scheme>[a-z]+://)(?P<user>[^@/?:]*)(?::[^@/?]*)?@", re.IGNORECASE)


def connect(url: str) -> Any:
    """A new autocommit connection for ``url``: the defaults above, its ``prepare_threshold``, ``reply_timeout``."""
    from .replies import RepliesBoundedConnection

    conninfo, prepare_threshold = connection_arguments(url)
    bound = reply_timeout(url, conninfo)  # before connecting: a bad value opens nothing
    conn = RepliesBoundedConnection.connect(conninfo, autocommit=True, prepare_threshold=prepare_threshold)
    conn.reply_timeout = bound
    _OPEN.add(conn)
    return conn


#: Every connection :func:`connect` made that may still be open: a forked child lets go of them.
_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()


def _in_forked_child() -> None:
    """A forked child lets go of its parent's connections: their sockets become ``/dev/null`` in the child.

    A connection shared with a child keeps its server session open after the
    parent dies: its liveness lock (store/liveness.py), a transaction's row
    locks. The child never uses them (libpq connections cannot be shared
    across a fork); whatever it writes to them at exit goes nowhere.
    """
    for conn in list(_OPEN):
        with contextlib.suppress(Exception):  # closed already
            socket = conn.pgconn.socket
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, socket, inheritable=False)
            finally:
                os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_forked_child)


def connection_arguments(url: str) -> tuple[str, int | None]:
    """The libpq conninfo string (defaults added) and the ``prepare_threshold`` for ``url``."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    base, query = _split(url)
    prepare_threshold: int | None = 5  # psycopg's own default
    for name, value in query:
        if name == _PREPARE_THRESHOLD:
            prepare_threshold = _prepare_threshold(value)
    kept = [(name, value) for name, value in query if name not in _MEMENGINE_PARAMETERS]
    parameters = conninfo_to_dict(_join(base, kept))
    for name, value in DEFAULT_PARAMETERS.items():
        if name not in parameters and not os.environ.get(_ENVIRONMENT.get(name, "")):
            parameters[name] = value
    options = str(parameters["options"]) if "options" in parameters else os.environ.get("PGOPTIONS", "")
    parameters["options"] = with_settings(options, DEFAULT_SETTINGS)
    return make_conninfo("", **parameters), prepare_threshold


def reply_timeout(url: str, conninfo: str | None = None) -> float | None:
    """Seconds a connection for ``url`` waits for the server without a byte from it; None: for ever.

    ``conninfo`` is ``url``'s conninfo string, if already made (see :func:`connection_arguments`).
    """
    from psycopg.conninfo import conninfo_to_dict

    given = [value for name, value in _split(url)[1] if name == _REPLY_TIMEOUT]
    if given:
        return _reply_timeout(given[-1])
    if conninfo is None:
        conninfo = connection_arguments(url)[0]
    options = str(conninfo_to_dict(conninfo).get("options", ""))
    statement_timeout = next(
        (_seconds(_setting_value(token)) for token in _tokens(options) if _setting_name(token) == "statement_timeout"),
        None,
    )
    if statement_timeout == 0:
        return None  # statements may run for ever: so may the wait for their answer
    return (statement_timeout or float(DEFAULT_SETTINGS["statement_timeout"].rstrip("s"))) + REPLY_MARGIN


def pinned(url: str, schema: str) -> str:
    """``url`` with its connections' ``search_path`` set to exactly ``schema``."""
    tokens = [token for token in _tokens(_options(url)) if _setting_name(token) != "search_path"]
    tokens.append(f"-c search_path={_escape(_identifier(schema))}")
    return _with_options(url, " ".join(tokens))


def pinned_to_tables(url: str) -> str:
    """``url`` pinned to the schema memengine's tables are in (or are to be created in), looked up once.

    Refuses (:class:`StoreError`) a ``search_path`` with memengine's tables in two schemas.
    """
    from .schema import find_schema

    probe = connect(url)
    try:
        return pinned(url, find_schema(probe))
    finally:
        probe.close()


def with_url_settings(url: str, settings: dict[str, str]) -> str:
    """``url`` with each server setting of ``settings`` that its options do not set already."""
    return _with_options(url, with_settings(_options(url), settings))


def shown(url: str) -> str:
    """``url`` as it may be shown in a message: without its password."""
    base, query = _split(url)
    base = _USER_INFO.sub(lambda match: f"{match['scheme']}{match['user']}@", base)
    return _join(base, [(name, value) for name, value in query if name != "password"])


def with_settings(options: str, settings: dict[str, str]) -> str:
    """``options`` (libpq's ``options`` parameter) plus ``-c name=value`` for each setting it lacks."""
    present = {_setting_name(token) for token in _tokens(options)}
    added = [f"-c {name}={_escape(value)}" for name, value in settings.items() if name not in present]
    return " ".join(part for part in (options.strip(), *added) if part)


def _options(url: str) -> str:
    _, query = _split(url)
    return next((value for name, value in query if name == "options"), os.environ.get("PGOPTIONS", ""))


def _with_options(url: str, options: str) -> str:
    base, query = _split(url)
    return _join(base, [*((name, value) for name, value in query if name != "options"), ("options", options)])


def _prepare_threshold(value: str) -> int | None:
    if value.lower() == "none":
        return None
    try:
        threshold = int(value)
    except ValueError:
        threshold = -1
    if threshold < 0:
        raise StoreError(f"prepare_threshold in the URL must be a number of runs or 'none', not {value!r}")
    return threshold


def _reply_timeout(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise StoreError(f"reply_timeout in the URL must be a number of seconds (0: no bound), not {value!r}")
    return None if seconds == 0 else seconds


def _seconds(value: str) -> float | None:
    """A PostgreSQL time setting (``60s``, ``1min``, ``500`` ms) in seconds; None if it cannot be read."""
    match = _TIME_VALUE.fullmatch(value)
    if match is None or match[2].lower() not in _TIME_UNITS:
        return None
    return float(match[1]) * _TIME_UNITS[match[2].lower()]


def _setting_value(token: str) -> str:
    """The value a ``-c name=value`` (or ``--name=value``) token of ``options`` sets, unescaped."""
    value = token.partition("=")[2]
    return re.sub(r"\\(.)", r"\1", value)


def _split(url: str) -> tuple[str, list[tuple[str, str]]]:
    # By hand rather than with parse_qsl: libpq does not read '+' as a space.
    base, _, query = url.partition("?")
    pairs = []
    for item in query.split("&") if query else []:
        name, _, value = item.partition("=")
        pairs.append((unquote(name), unquote(value)))
    return base, pairs


def _join(base: str, query: list[tuple[str, str]]) -> str:
    if not query:
        return base
    return base + "?" + "&".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in query)


def _tokens(options: str) -> list[str]:
    """``options`` split where libpq splits it: at whitespace not escaped by a backslash."""
    tokens: list[str] = []
    current: list[str] = []
    escaped = False
    for char in options:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char.isspace():
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(char)
    if current:
        tokens.append("".join(current))
    # "-c name=value" as one token, so each setting is one token.
    joined: list[str] = []
    for token in tokens:
        if joined and joined[-1] == "-c":
            joined[-1] = f"-c {token}"
        else:
            joined.append(token)
    return joined


def _setting_name(token: str) -> str | None:
    """The server setting a token of ``options`` sets, normalised, or ``None``."""
    if token.startswith("--"):
        assignment = token[2:]
    elif token.startswith("-c"):
        assignment = token[2:].lstrip()
    else:
        return None
    name, equals, _ = assignment.partition("=")
    if not equals:
        return None
    return name.replace("\\", "").strip().lower().replace("-", "_")


def _identifier(name: str) -> str:
    return name if _PLAIN_IDENTIFIER.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")
