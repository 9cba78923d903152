"""The store operations: what each public method of the store submits to the group commit, or reads.

Each is a small function of journal.py, outbox.py, set_aside.py, scoped.py
or erasure.py run in a write transaction (``_submit``) or on the read
connection (``_read``). The mechanism is in committer.py, the side work
(renewals, liveness) in side_work.py; the backends subclass
:class:`GroupCommitStore`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from ..episode import Episode
from ..errors import SessionBusyError
from ..retain.batch import RetainMode
from ..scope import Scope
from . import committer, erasure, journal, orphans, outbox, scoped, segments, set_aside
from .base import (
    Completion,
    DueRetains,
    Erased,
    ExportedSession,
    OutboxEntry,
    OutboxState,
    Recalled,
    RecallIndexDamaged,
    ScopeCounts,
    SessionRow,
    SessionSnapshot,
    SetAside,
    SetAsideCounts,
)
from .side_work import SideWork
from .submission import Submission

log = logging.getLogger("memengine.store")


class GroupCommitStore(SideWork):
    """A store over one blocking DB-API connection; see :class:`~memengine.store.base.Store`.

    ``owner`` names this process in lease rows (one store per engine).
    ``reader`` is a second connection for reads, or ``None`` to read through
    the committer (an in-memory SQLite database has no second connection).
    """

    # -- sessions --------------------------------------------------------------

    async def activate(self, session_id: str, ttl: float) -> tuple[int, SessionSnapshot]:
        self._longest_ttl = max(self._longest_ttl, ttl)
        activated = await self._submit(lambda db: journal.activate(db, session_id, self.owner, ttl))
        if isinstance(activated, SessionBusyError):
            raise activated
        return activated

    async def load_session(self, session_id: str) -> SessionSnapshot:
        return await self._read(lambda db: journal.load(db, session_id))

    async def store_summary(
        self,
        session_id: str,
        token: int,
        generation: int,
        through_seq: int,
        summary: str,
        *,
        awaited: bool = False,
        backlog: bool = False,
    ) -> bool:
        # It rides along with the next write (an add, most often), within SUMMARY_RIDER_SECONDS: a commit (an
        # fsync at synchronous=FULL) less per summary, and no add waits behind a summary's own commit. Unless
        # a read waits for it: then it commits now; or a backlog waits behind it: then only briefly.
        return await self._submit(
            lambda db: journal.store_summary(db, session_id, token, generation, through_seq, summary),
            ride=_summary_ride(awaited, backlog),
        )

    async def store_segment_leaf(
        self,
        session_id: str,
        token: int,
        generation: int,
        through_seq: int,
        summary: str,
        *,
        awaited: bool = False,
        backlog: bool = False,
    ) -> segments.Composed | None:
        return await self._submit(
            lambda db: segments.store_leaf(db, session_id, token, generation, through_seq, summary),
            ride=_summary_ride(awaited, backlog),
        )

    async def segment_repair(self, session_id: str) -> segments.SegmentRepair | segments.Composed | None:
        return await self._read(lambda db: journal.segment_repair(db, session_id))

    async def store_segment_node(
        self,
        session_id: str,
        token: int,
        generation: int,
        level: int,
        index: int,
        summary: str,
        *,
        awaited: bool = False,
    ) -> segments.Composed | None:
        # More work is most often due behind a node (the folds above it): it rides only briefly, as a backlog's.
        return await self._submit(
            lambda db: segments.store_node(db, session_id, token, generation, level, index, summary),
            ride=_summary_ride(awaited, backlog=True),
        )

    async def delete_episodes(self, session_id: str, token: int, seqs: Sequence[int]) -> tuple[int, SessionSnapshot]:
        return await self._submit(lambda db: journal.delete_episodes(db, session_id, token, seqs))

    async def clear_session(self, session_id: str, token: int) -> SessionSnapshot:
        return await self._submit(lambda db: journal.clear_session(db, session_id, token))

    async def sessions_needing_summary(
        self, max_episodes: int, max_chars: int, *, orphaned_only: bool = False
    ) -> list[str]:
        return await self._read(
            lambda db: journal.sessions_needing_summary(db, self.owner, max_episodes, max_chars, orphaned_only)
        )

    async def release_orphans(self, max_episodes: int, max_chars: int, *, retaining: bool) -> int:
        released = 0
        after: str | None = None
        while True:
            step, after = await self._submit(
                functools.partial(
                    orphans.release_handled,
                    max_episodes=max_episodes,
                    max_chars=max_chars,
                    retaining=retaining,
                    after=after,
                )
            )
            released += step
            if after is None:
                return released

    async def list_sessions(self) -> list[SessionRow]:
        return await self._read(journal.list_sessions)

    # -- retain outbox and recall ---------------------------------------------

    def submit_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None,
        limit: int | None,
        done: Completion[int],
    ) -> None:
        operation = functools.partial(
            outbox.enqueue, session_id=session_id, token=token, mode=mode, through_seq=through_seq, limit=limit
        )
        self._enqueue(Submission(operation, done))

    async def enqueue_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None = None,
        *,
        batch_size: int | None = None,
    ) -> int:
        return await self._submit(
            lambda db: outbox.enqueue(db, session_id, token, mode, through_seq, batch_size=batch_size)
        )

    async def enqueue_all_retains(
        self, mode: RetainMode, *, orphaned_only: bool = False, batch_size: int | None = None
    ) -> list[str]:
        # A step of at most a hundred sessions per transaction: renewals and writers go in between.
        handled: list[str] = []
        after: str | None = None
        while True:
            step, after = await self._submit(
                functools.partial(
                    outbox.enqueue_all,
                    owner=self.owner,
                    mode=mode,
                    orphaned_only=orphaned_only,
                    after=after,
                    batch_size=batch_size,
                )
            )
            handled.extend(step)
            if after is None:
                return handled

    async def pending_retains(self, limit: int) -> list[OutboxEntry]:
        return await self._read(lambda db: outbox.pending(db, limit, journal.episode_from_row))

    async def due_retains(self, limit: int, *, ignore_backoff: bool = False) -> DueRetains:
        return await self._read(lambda db: outbox.due(db, self.owner, limit, ignore_backoff))

    async def claim_retain(self, entry_id: int, key: str, ttl: float) -> OutboxEntry | outbox.Unclaimable:
        return await self._submit(lambda db: outbox.claim(db, entry_id, key, self.owner, ttl, journal.episode_from_row))

    async def extend_retain_claim(self, entry_id: int, key: str, ttl: float) -> bool:
        return await self._submit(lambda db: outbox.extend_claim(db, entry_id, key, self.owner, ttl))

    async def mark_retained(self, entry_id: int, key: str) -> None:
        await self._submit(lambda db: outbox.mark_delivered(db, entry_id, key))

    async def mark_retain_failed(
        self, entry_id: int, key: str, error: str, retry_in: float = 0.0, *, set_aside: bool = False
    ) -> None:
        await self._submit(lambda db: outbox.mark_failed(db, entry_id, key, self.owner, error, retry_in, set_aside))

    async def handed_on(self, session_id: str) -> tuple[int, tuple[Episode, ...]]:
        return await self._read(lambda db: outbox.handed_on(db, session_id, journal.episode_from_row))

    async def outbox_state(self) -> OutboxState:
        return await self._read(outbox.state)

    # -- work set aside ---------------------------------------------------------

    async def set_summary_aside(
        self,
        session_id: str,
        token: int,
        generation: int,
        through_seq: int,
        attempts: int,
        error: str,
        *,
        first_seq: int | None = None,
    ) -> bool:
        return await self._submit(
            lambda db: set_aside.set_summary_aside(
                db, session_id, token, generation, through_seq, attempts, error, first_seq
            )
        )

    async def lift_summary_set_aside(self, session_id: str, token: int | None) -> bool:
        return await self._submit(lambda db: set_aside.clear_summary_mark(db, session_id, token))

    async def summary_set_aside(self, session_id: str) -> SetAside | None:
        return await self._read(lambda db: set_aside.summary_of(db, session_id))

    async def list_set_aside(self, session_id: str | None = None, limit: int = 1000) -> list[SetAside]:
        return await self._read(lambda db: set_aside.listing(db, session_id, limit))

    async def set_aside_counts(self) -> SetAsideCounts:
        return await self._read(set_aside.counts)

    async def retry_set_aside_retains(self, session_id: str | None = None) -> int:
        return await self._submit(lambda db: set_aside.retry_retains(db, session_id))

    async def discard_set_aside_retains(self, session_id: str | None = None) -> list[SetAside]:
        return await self._submit(lambda db: set_aside.discard_retains(db, session_id))

    async def recall(self, query: str, scope: Scope, limit: int) -> list[Recalled]:
        """Search ``scope``: index what waits (in bounded steps), then read; rebuild a damaged index."""
        search = functools.partial(self._search, query=query, scope=scope, limit=limit)
        try:
            await self._catch_up_recall_index()
            return await self._read(search)
        except RecallIndexDamaged as damage:
            log.warning("%s; rebuilding it from the journal", damage)
            await self.rebuild_recall_index()
            return await self._read(search)

    async def rebuild_recall_index(self) -> int:
        return await self._submit(self._rebuild_recall_index)

    # -- scopes: listing, export, erasure (scoped.py, erasure.py) -------------

    async def scope_session_ids(self, scope: Scope, after: str | None, limit: int) -> list[str]:
        return await self._read(lambda db: scoped.session_ids(db, scope, after, limit))

    async def scope_counts(self, scope: Scope) -> ScopeCounts:
        return await self._read(lambda db: scoped.counts(db, scope))

    async def exported_session(self, session_id: str) -> ExportedSession:
        return await self._read(lambda db: scoped.exported_session(db, session_id))

    async def episodes_after(self, session_id: str, after_seq: int, limit: int) -> list[Episode]:
        return await self._read(lambda db: scoped.episodes_after(db, session_id, after_seq, limit))

    async def erase_session(self, session_id: str, token: int) -> Erased:
        # Steps of at most an add's transaction: other sessions' writes and renewals go in between.
        episodes = summaries = batches = 0
        while True:
            step = await self._submit(
                functools.partial(
                    erasure.erase_step, session_id=session_id, token=token, limit=committer.TRANSACTION_ROWS
                )
            )
            episodes += step.episodes
            summaries += step.summaries
            batches += step.outbox_batches
            if step.complete:
                return Erased(episodes, summaries, batches, traces_left=step.traces_left)


def _summary_ride(awaited: bool, backlog: bool) -> float | None:
    """How long a summary waits to ride along with another write: not at all if a read waits for it."""
    if awaited:
        return None
    return committer.BACKLOG_RIDER_SECONDS if backlog else committer.SUMMARY_RIDER_SECONDS
