"""PostgreSQL connections that stop waiting for a server gone silent (``reply_timeout``).

The server-side timeouts (``lock_timeout``, ``statement_timeout``) bound a
statement the server is running; TCP keepalives notice a peer that vanished
while the connection was idle. Neither helps when the server never sees the
statement, or its answer never arrives, while the socket stays open: a
partition that drops nothing, a frozen server, a stuck middlebox. psycopg
then waits for ever. A :class:`RepliesBoundedConnection` waits at most
``reply_timeout`` seconds without a byte from the server (or without room to
send one); then it closes the connection and raises :class:`ReplyTimeout`,
which the store reports as :class:`~memengine.errors.StoreError` (or
:class:`~memengine.errors.UncertainCommitError` if it was the commit itself
that got no answer). The next transaction opens a new connection.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")


class ReplyTimeout(psycopg.OperationalError):
    """The server sent nothing for ``reply_timeout`` seconds; the connection was closed."""


class RepliesBoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded by :attr:`reply_timeout`."""

    #: Seconds of silence from the server after which the connection is given up; None waits for ever.
    reply_timeout: float | None = None

    def wait(self, gen: Generator[Any, Any, T], *args: Any, **kwargs: Any) -> T:
        if self.reply_timeout is None:
            return super().wait(gen, *args, **kwargs)
        return super().wait(self._bounded(gen, self.reply_timeout), *args, **kwargs)

    def _bounded(self, gen: Generator[Any, Any, T], seconds: float) -> Generator[Any, Any, T]:
        # psycopg resumes the generator when the socket is ready, and with "nothing ready"
        # every fraction of a second: the clock is checked then, and restarts on any progress.
        deadline = time.monotonic() + seconds
        try:
            state = next(gen)
            while True:
                ready = yield state
                if ready:
                    deadline = time.monotonic() + seconds
                elif time.monotonic() >= deadline:
                    gen.close()
                    self.pgconn.finish()  # where the protocol stands is unknown: the connection is done
                    raise ReplyTimeout(
                        f"the server sent nothing for {seconds:g} s (reply_timeout); the connection was closed"
                    )
                state = gen.send(ready)
        except StopIteration as finished:
            return finished.value  # type: ignore[no-any-return]
