"""PostgreSQL connections that stop waiting for a server gone silent (``reply_timeout``).

The server-side timeouts (``lock_timeout``, ``statement_timeout``) bound a
statement the server is running; TCP keepalives notice a peer that vanished
while the connection was idle. Neither helps when the server never sees the
statement, or its answer never arrives, while the socket stays open: a
partition that drops nothing, a frozen server, a stuck middlebox. psycopg
then waits for ever. libpq's ``tcp_user_timeout`` would not help either when
the other end's kernel still acknowledges every byte (a frozen server, a
proxy): only the client knows that no answer came. A :class:`RepliesBoundedConnection` waits at most
``reply_timeout`` seconds without a byte from the server (or without room to
send one); then it closes the connection and raises :class:`ReplyTimeout`,
which the store reports as :class:`~memengine.errors.StoreError` (or
:class:`~memengine.errors.UncertainCommitError` if it was the commit itself
that got no answer). The next transaction opens a new connection.

A closing store that leaves a thread behind on such a connection (an
interrupt the silent server never answered) calls :meth:`give_up`: the wait
ends within a fraction of a second, in its own thread, which closes the
connection. No socket is touched from another thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


class ReplyTimeout(psycopg.OperationalError):
    """The server sent nothing for ``reply_timeout`` seconds; the connection was closed."""


class GivenUp(psycopg.OperationalError):
    """The store gave the connection up while a thread waited on it (see :meth:`RepliesBoundedConnection.give_up`)."""


class RepliesBoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded by :attr:`reply_timeout`."""

    #: Seconds of silence from the server after which the connection is given up; None waits for ever.
    reply_timeout: float | None = None
    _given_up = False

    def give_up(self) -> None:
        """End a wait on this connection in another thread within a fraction of a second. Safe from any thread.

        That wait raises :class:`GivenUp` and closes the connection; so does every later one.
        """
        self._given_up = True

    def wait(self, gen: Generator[Any, Any, T], *args: Any, **kwargs: Any) -> T:
        return super().wait(self._bounded(gen, self.reply_timeout), *args, **kwargs)

    def _bounded(self, gen: Generator[Any, Any, T], seconds: float | None) -> Generator[Any, Any, T]:
        # psycopg resumes the generator when the socket is ready, and with "nothing ready"
        # every fraction of a second: the clock is checked then, and restarts on any progress.
        limit = math.inf if seconds is None else seconds
        deadline = time.monotonic() + limit
        try:
            state = next(gen)
            while True:
                ready = yield state
                if self._given_up:
                    self._close_in_wait(gen)
                    raise GivenUp("the store gave this connection up (it was closing); the connection was closed")
                if ready:
                    deadline = time.monotonic() + limit
                elif time.monotonic() >= deadline:
                    self._close_in_wait(gen)
                    raise ReplyTimeout(
                        f"the server sent nothing for {limit:g} s (reply_timeout); the connection was closed"
                    )
                state = gen.send(ready)
        except StopIteration as finished:
            return finished.value  # type: ignore[no-any-return]

    def _close_in_wait(self, gen: Generator[Any, Any, Any]) -> None:
        gen.close()
        self.pgconn.finish()  # where the protocol stands is unknown: the connection is done


def give_up(conn: object) -> None:
    """:meth:`RepliesBoundedConnection.give_up` ``conn``, if it is one (and not None)."""
    if isinstance(conn, RepliesBoundedConnection):
        conn.give_up()
