"""The interface every store backend implements.

A session is event-sourced: an append-only journal of episodes keyed by
``(session_id, seq)`` plus summary snapshots keyed by ``(session_id,
through_seq)``. Each method is one operation of a transaction, run in the
order submitted. If the caller is cancelled while waiting, the operation may
still complete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import attrs

from ..episode import Episode
from ..errors import StoreError
from ..scope import Scope

if TYPE_CHECKING:
    from ..retain.batch import RetainMode
    from .owners import Reaped

T = TypeVar("T")

#: Called on the event loop once an operation's transaction has ended:
#: ``(result, None)`` after it committed, ``(None, error)`` if nothing was stored.
Completion = Callable[[T | None, BaseException | None], None]

#: For each episode given to an append, in order: the stored episode (with its
#: seq; for an id already stored, the earlier row) and whether it is new.
AppendResult = tuple[tuple[Episode, bool], ...]


@attrs.frozen
class SessionSnapshot:
    """A session's recoverable state: the latest summary and the episodes after it.

    ``last_seq`` is the highest seq the session ever assigned (seqs are never
    reused, not even after ``clear``). ``generation`` changes on every clear
    or delete; a summary computed under an older generation is refused.
    """

    session_id: str
    generation: int
    last_seq: int
    summary: str | None
    summarized_through: int
    episodes: tuple[Episode, ...]
    retained_through: int = 0
    #: The newest seq evicted from the raw window (see session/window.py); 0 when none.
    evicted_through: int = 0
    #: Set when the session's summary batch is set aside (store/set_aside.py): nothing is summarized until a retry.
    summary_set_aside: SetAside | None = None
    #: A segmented session's holes and due folds (store/segments.py); None if the session is not segmented.
    segments: SegmentState | None = None


@attrs.frozen
class SegmentState:
    """What a segmented session's summary leaves out, and whether it has work due (store/segments.py).

    ``holes``: ranges ``(first_seq, last_seq)`` of leaves a delete erased, to be
    summarized again; meanwhile the summary shows their live episodes in their
    place as they were said (up to a bound; past it, and over a read's token
    ceiling, it says which are left out). ``folds_due``: two
    neighbouring parts of the summary can be folded into one; ``folds_first``:
    the summary has so many parts that a fold goes ahead of evicted episodes.
    """

    holes: tuple[tuple[int, int], ...] = ()
    folds_due: bool = False
    folds_first: bool = False


@attrs.frozen
class Composed:
    """A segmented session's summary as reads get it: through the last leaf, and what it leaves out."""

    through_seq: int
    text: str | None
    state: SegmentState


@attrs.frozen
class SegmentRepair:
    """One node to make: a leaf from its live ``episodes``, or a fold of its children's ``parts``."""

    level: int
    index: int
    first_seq: int
    through_seq: int
    episodes: tuple[Episode, ...] = ()
    parts: tuple[str, str] | None = None


@attrs.frozen
class SetAside:
    """Work given up on after too many failed rounds, until retried (or, for a retain batch, discarded).

    ``kind`` is ``"summary"`` (the session's episodes ``first_seq..last_seq``
    waiting for a summary when it was set aside; they stay stored and shown
    raw) or ``"retain"`` (an outbox batch, kept in the outbox). ``attempts``
    counts the failed tries (summarizer calls, or sink calls), ``error`` is
    the last one's, ``set_aside_at`` is in unix seconds.
    """

    kind: Literal["summary", "retain"]
    session_id: str
    first_seq: int
    last_seq: int
    attempts: int
    error: str
    set_aside_at: float


@attrs.frozen
class SetAsideCounts:
    """How many summary batches (one per session at most) and retain batches are set aside in a store."""

    summaries: int
    retains: int


@attrs.frozen
class Recalled:
    """An episode found by :meth:`Engine.recall`, with its session and bm25 score (higher is better)."""

    session_id: str
    episode: Episode
    score: float


class RecallIndexDamaged(StoreError):
    """The recall index does not match the journal (rows missing, a wrong watermark, a table gone).

    A backend's search raises it instead of answering from a damaged index;
    the store then rebuilds the index from the journal and searches again.
    It reaches a caller (a :class:`StoreError`) only if the rebuilt index is
    damaged too.
    """


@attrs.frozen
class OutboxEntry:
    """One undelivered retain batch, or forget (``mode == "forget"``), as recorded in the outbox.

    A forget's ``forget_seqs`` are the seqs to forget (``None``: the whole
    session), ``last_seq`` how far the session had been handed on when it was
    recorded, and ``episodes`` is empty (see :meth:`Store.handed_on`).
    """

    id: int
    session_id: str
    first_seq: int
    last_seq: int
    mode: str
    key: str
    episodes: tuple[Episode, ...]
    created_at: float
    attempts: int
    forget_seqs: tuple[int, ...] | None = None


@attrs.frozen
class DueBatch:
    """An outbox batch that may be sent now: what it takes to claim it."""

    id: int
    session_id: str
    key: str


@attrs.frozen
class DueRetains:
    """Batches that may be sent now, oldest first, and when the next of the others falls due."""

    batches: tuple[DueBatch, ...]
    next_due_in: float | None  # seconds until a batch waiting now becomes due; None if none waits


@attrs.frozen
class OutboxState:
    """How much is waiting for the retain sink."""

    depth: int
    oldest_created_at: float | None


@attrs.frozen
class SessionRow:
    """One line of a store's session listing (for inspection)."""

    session_id: str
    generation: int
    episodes: int
    summarized_through: int
    last_seq: int


@attrs.frozen
class ScopeCounts:
    """What the sessions of a scope hold in the store (``memengine forget --dry-run``)."""

    sessions: int
    episodes: int
    summaries: int
    outbox_batches: int


@attrs.frozen
class Erased:
    """What one step of erasing a session deleted; ``complete`` once the erasure is done.

    ``traces_left``: done, but the session's row and lease stay (no content) until the retain outbox has
    delivered what the erasure's clear left for the sink; a later erasure removes them.
    """

    episodes: int
    summaries: int
    outbox_batches: int
    complete: bool = True
    traces_left: bool = False


@attrs.frozen
class ExportedSession:
    """A session as an export describes it before its episodes: its latest summary and its size."""

    session_id: str
    summary: str | None
    summarized_through: int
    summary_created_at: str | None
    episodes: int


class Store(Protocol):
    """What the engine needs of a backend (SQLite and PostgreSQL implement it).

    Sessions are leased: :meth:`activate` takes a session's lease for this
    store's ``owner`` and returns a fencing token. Every write of a session
    carries its token, and the store refuses it with
    :class:`~memengine.errors.LeaseLostError`, in the write's own transaction,
    once the lease has expired or another process holds a newer token.
    """

    owner: str

    async def activate(self, session_id: str, ttl: float) -> tuple[int, SessionSnapshot]:
        """Take the session's lease for ``ttl`` seconds and load its state, in one transaction.

        Returns the new fencing token and the session's state; raises
        :class:`~memengine.errors.SessionBusyError` if another live owner holds it.
        """

    async def renew_leases(self, held: Sequence[tuple[str, int]], ttl: float) -> set[str]:
        """Extend these ``(session_id, token)`` leases to ``ttl`` from now; return those still ours."""

    async def release_lease(self, session_id: str, token: int) -> None:
        """Give the session up (nothing happens if the token is stale)."""

    async def release_leases(self) -> None:
        """Give up every lease and retain claim this owner holds, and leave the running engines (engine exit)."""

    async def start_liveness(self) -> None:
        """Hold this engine's liveness lock and register it (see store/owners.py); a no-op where impossible."""

    async def keep_alive(self) -> bool:
        """Whether the liveness lock was held since the last call (if it was lost, it is taken again)."""

    def alive_until(self) -> float:
        """Until when (``anyio.current_time()``) no other process can have taken this one for dead.

        Reads from memory and new retain claims count on it; ``inf`` where the lock cannot be lost.
        """

    async def wanted_sessions(self) -> list[str]:
        """The sessions this owner holds that another process waits for (see store/handover.py)."""

    async def reap_dead_owners(self, among: Sequence[str] | None = None) -> Reaped:
        """Release the leases and retain claims of owners whose processes are gone (``among`` them, or all)."""

    async def load_session(self, session_id: str) -> SessionSnapshot:
        """The session's latest summary and the live episodes after it (a read; no lease)."""

    def submit_append(
        self,
        session_id: str,
        token: int,
        first_seq: int,
        episodes: Sequence[Episode],
        done: Completion[AppendResult],
        metadata_json: Sequence[str | None] | None = None,
    ) -> None:
        """Queue storing episodes with seqs from ``first_seq`` on, skipping ids already stored.

        Does not wait: ``done`` is called on the event loop once the transaction
        holding the append has committed (or failed), before any operation
        queued after it completes. Operations run in the order submitted.
        ``metadata_json``, if given, is each episode's metadata exactly as
        ``encode_json`` writes it (``None``: the store encodes that one).
        """

    def submit_eviction(self, session_id: str, token: int, through_seq: int, done: Completion[None]) -> None:
        """Queue recording that the session's raw window evicted everything up to ``through_seq``.

        Does not wait, nor cost a commit of its own while others run: it goes into
        the next transaction, whatever else it holds (or alone, about a second
        later, if none comes). ``done`` is called once committed (or failed).
        See session/window.py.
        """

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
        """Upsert a summary of live episodes ``1..through_seq``.

        Returns ``False``, writing nothing, when ``generation`` is no longer the
        session's generation (checked in the same transaction as the write).
        It rides along with the next write, or commits alone a moment later
        (see :meth:`hurry_riders`); with ``awaited`` (a read waits for it), now;
        with ``backlog`` (more batches wait behind it), after a few milliseconds.
        """

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
    ) -> Composed | None:
        """Store a segmented session's new leaf: the summary of its evicted episodes up to ``through_seq``.

        Returns the composed summary it makes (store/segments.py), or ``None``,
        writing nothing, when ``generation`` is no longer the session's. Rides
        along with writes as :meth:`store_summary` does.
        """

    async def segment_repair(self, session_id: str) -> SegmentRepair | Composed | None:
        """The next node a segmented session's summary needs (a hole, then a fold), or its summary if none (a read)."""

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
    ) -> Composed | None:
        """Store a node :meth:`segment_repair` asked for; ``None``, writing nothing, if it is no longer wanted."""

    def hurry_riders(self) -> None:
        """If a summary waits to ride along with the next write, commit it (and what rides with it) now.

        For a read that waits for a summary: it is not kept waiting for a write to come along.
        """

    async def delete_episodes(self, session_id: str, token: int, seqs: Sequence[int]) -> tuple[int, SessionSnapshot]:
        """Delete episodes and every summary covering any of them.

        When anything was deleted the generation changes. Returns the number of
        episodes deleted and the session's state afterwards.
        """

    async def clear_session(self, session_id: str, token: int) -> SessionSnapshot:
        """Delete every episode and summary of the session; the generation changes."""

    async def sessions_needing_summary(
        self, max_episodes: int, max_chars: int, *, orphaned_only: bool = False
    ) -> list[str]:
        """Sessions no other live owner holds whose unsummarized episodes overflow the given window.

        With ``orphaned_only``, only those whose owner died (lease expired, never released).
        """

    async def release_orphans(self, max_episodes: int, max_chars: int, *, retaining: bool) -> int:
        """Release the leases of sessions whose owner died and that need nothing more; return how many.

        Nothing more: no summary for the given window, and (if ``retaining``)
        no un-retained tail. See orphans.py.
        """

    def submit_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None,
        limit: int | None,
        done: Completion[int],
    ) -> None:
        """Queue recording the session's un-retained episodes (at most ``limit``) as an outbox batch.

        The batch and the watermark are written in one transaction; ``done``
        gets the watermark afterwards.
        """

    async def enqueue_retain(
        self,
        session_id: str,
        token: int,
        mode: RetainMode,
        through_seq: int | None = None,
        *,
        batch_size: int | None = None,
    ) -> int:
        """Record the session's un-retained episodes (up to ``through_seq``) in the outbox (a boundary).

        As one batch, or in append mode as batches of at most ``batch_size``
        episodes (a replace batch is the whole session: one is recorded).
        Returns the watermark: every seq up to it is in the outbox, delivered, or deleted.
        """

    async def enqueue_all_retains(
        self, mode: RetainMode, *, orphaned_only: bool = False, batch_size: int | None = None
    ) -> list[str]:
        """Record the un-retained tail of every session no other live owner holds (engine start and exit).

        With ``orphaned_only``, only of sessions whose owner died (lease expired, never released).
        Each tail is split as by :meth:`enqueue_retain` with ``batch_size``.
        """

    async def pending_retains(self, limit: int) -> list[OutboxEntry]:
        """Undelivered batches, oldest first."""

    async def due_retains(self, limit: int, *, ignore_backoff: bool = False) -> DueRetains:
        """The oldest batch of each session that may be sent now, oldest first (at most ``limit``; a read).

        A batch is due when no earlier batch of its session is left, no other
        live process holds its claim, and its retry time has come (unless
        ``ignore_backoff``). Also says in how many seconds the next batch not
        due now becomes due (a retry time comes, another process's claim lapses).
        """

    async def claim_retain(self, entry_id: int, key: str, ttl: float) -> OutboxEntry | Literal["gone", "busy"]:
        """Claim a batch for sending, and return it as it stands now.

        ``"gone"`` if a delivery, clear or delete removed it; ``"busy"`` if
        another process holds it, or an earlier batch of its session.
        """

    async def extend_retain_claim(self, entry_id: int, key: str, ttl: float) -> bool:
        """Extend this process's live claim on the batch to ``ttl`` from now; False if it lapsed or is gone."""

    async def mark_retained(self, entry_id: int, key: str) -> None:
        """The sink accepted the batch: remove it from the outbox (whoever holds its claim)."""

    async def mark_retain_failed(
        self, entry_id: int, key: str, error: str, retry_in: float = 0.0, *, set_aside: bool = False
    ) -> None:
        """The sink refused the batch: count the attempt, keep the batch, let this process's claim go.

        The batch is due again ``retry_in`` seconds from now, or, if
        ``set_aside``, not until it is retried. Nothing changes if another
        process holds a live claim on it (this process's lapsed).
        """

    async def handed_on(self, session_id: str) -> tuple[int, tuple[Episode, ...]]:
        """How far the session has been handed on to the sink, and its live episodes up to there (a read).

        Read when a forget is sent: every batch ahead of the forget is included.
        """

    async def outbox_state(self) -> OutboxState:
        """How many batches wait, and since when."""

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
        """Record that the session's summary batch up to ``through_seq`` is set aside (see store/set_aside.py).

        ``first_seq``: where the batch starts, if not right after the session's summary (a segmented
        session's repair of a node, store/segments.py).

        Returns ``False``, writing nothing, when ``generation`` is no longer the session's.
        """

    async def lift_summary_set_aside(self, session_id: str, token: int | None) -> bool:
        """Remove the session's summary mark (under its lease if ``token``); True if a current one was removed."""

    async def summary_set_aside(self, session_id: str) -> SetAside | None:
        """The session's summary batch if it is set aside (a read; no lease)."""

    async def list_set_aside(self, session_id: str | None = None, limit: int = 1000) -> list[SetAside]:
        """Set-aside work, of one session or all: summary batches first, then retain batches oldest first."""

    async def set_aside_counts(self) -> SetAsideCounts:
        """How many summary and retain batches are set aside."""

    async def retry_set_aside_retains(self, session_id: str | None = None) -> int:
        """Put set-aside retain batches back into delivery, due now, attempts counted afresh; return how many."""

    async def discard_set_aside_retains(self, session_id: str | None = None) -> list[SetAside]:
        """Remove set-aside retain batches from the outbox (the sink never gets them); return what was removed."""

    async def recall(self, query: str, scope: Scope, limit: int) -> list[Recalled]:
        """Stored episodes of ``scope`` matching any of the first 1,000 distinct words of ``query``, best first.

        Never deleted ones.

        A damaged index is rebuilt from the journal (and the search made again).
        """

    async def scope_session_ids(self, scope: Scope, after: str | None, limit: int) -> list[str]:
        """The ids of the scope's sessions after ``after``, in order, at most ``limit`` (a read)."""

    async def scope_counts(self, scope: Scope) -> ScopeCounts:
        """How many sessions, episodes, summaries and retain batches the scope holds (a read)."""

    async def exported_session(self, session_id: str) -> ExportedSession:
        """The session's latest summary and episode count, for an export (a read)."""

    async def episodes_after(self, session_id: str, after_seq: int, limit: int) -> list[Episode]:
        """The session's stored episodes after ``after_seq``, in order, at most ``limit`` (a read)."""

    async def erase_session(self, session_id: str, token: int) -> Erased:
        """Erase everything stored of the session, under its lease, in bounded transactions (see erasure.py).

        Returns the totals, ``complete``. Idempotent; a crash in between leaves less to erase next time.
        """

    async def rebuild_recall_index(self) -> int:
        """Rebuild the recall index from the journal; return how many episodes it holds."""

    async def list_sessions(self) -> list[SessionRow]:
        """Every session the store knows, for inspection."""

    async def aclose(self, grace: float = 2.0) -> bool:
        """Finish the operations already submitted (within ``grace`` seconds), then stop.

        True if every operation ran; after ``grace`` the one in progress is
        interrupted and the rest fail with :class:`~memengine.errors.StoreError`.
        """
