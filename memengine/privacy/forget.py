"""Forgetting the sessions of a scope: each erased through its own activation, a few at a time.

Each session gets a :class:`~memengine.session.messages.ForgetSession`
message, as ``clear()`` sends ``ClearSession``: the session is activated
here (taking its lease: a session another process keeps in memory is handed
over once idle, store/handover.py), everything it holds is erased in bounded
transactions (store/erasure.py), and the activation ends. No other process
can keep or bring the session back: it gave its lease up before this one took
it, and a process that lost it while paused is fenced by the lease token.

The scope's sessions are listed a page at a time and erased
:data:`SESSIONS_AT_ONCE` at a time, so other sessions' writers share every
transaction with a few small erasure steps at most. A session busy
elsewhere past ``lease_wait`` (work in flight there) is tried once more at the
end; what is still left is reported by :class:`ForgetIncompleteError`, and a
second call erases it. Forgetting is idempotent and resumable: what a
crashed call erased is gone, and the next call erases the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import attrs

from ..errors import ForgetIncompleteError, LeaseLostError, MemEngineError, SessionBusyError
from ..scope import Scope
from ..store.base import Erased, Store
from .report import ForgetReport

#: Session ids listed per read.
SESSIONS_PER_PAGE = 100
#: Sessions being erased at once.
SESSIONS_AT_ONCE = 4


async def count(store: Store, scope: Scope) -> ForgetReport:
    """What forgetting ``scope`` would erase now (a read)."""
    found = await store.scope_counts(scope)
    return ForgetReport(str(scope), found.sessions, found.episodes, found.summaries, found.outbox_batches, dry_run=True)


async def forget(store: Store, scope: Scope, erase: Callable[[str], Awaitable[Erased]]) -> ForgetReport:
    """Erase every session of ``scope`` with ``erase(session_id)``; the totals, or :class:`ForgetIncompleteError`."""
    totals = _Totals()
    left: dict[str, MemEngineError] = {}
    limiter = anyio.CapacityLimiter(SESSIONS_AT_ONCE)

    async def erase_one(session_id: str) -> None:
        async with limiter:
            try:
                totals.add(await erase(session_id))
            except MemEngineError as exc:
                left[session_id] = exc  # busy (or its lease lost) a moment ago: tried again at the end

    after: str | None = None
    while page := await store.scope_session_ids(scope, after, SESSIONS_PER_PAGE):
        after = page[-1]
        async with anyio.create_task_group() as tasks:
            for session_id in page:
                tasks.start_soon(erase_one, session_id)
    for session_id in list(left):  # busy a moment ago: once more, each after the other
        if isinstance(left[session_id], SessionBusyError | LeaseLostError):
            del left[session_id]
            await erase_one(session_id)
    report = totals.report(str(scope))
    if left:
        raise ForgetIncompleteError(report, left)
    return report


@attrs.define
class _Totals:
    sessions: int = 0
    episodes: int = 0
    summaries: int = 0
    outbox_batches: int = 0
    waiting_for_sink: int = 0

    def add(self, erased: Erased) -> None:
        self.sessions += 1
        self.episodes += erased.episodes
        self.summaries += erased.summaries
        self.outbox_batches += erased.outbox_batches
        self.waiting_for_sink += erased.traces_left

    def report(self, scope: str) -> ForgetReport:
        return ForgetReport(
            scope,
            self.sessions,
            self.episodes,
            self.summaries,
            self.outbox_batches,
            waiting_for_sink=self.waiting_for_sink,
        )
