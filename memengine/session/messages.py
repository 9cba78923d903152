"""Every message a session actor handles: one type per operation.

Client messages carry a :class:`~memengine.actor.reply.Reply` the caller awaits.
The summarizer child reports with :class:`SummaryStored` / :class:`SummaryFailed`;
the engine's idle sweeper sends :class:`Tick`, and :class:`LeaseLost` tells the
actor to give the session up.
"""

from __future__ import annotations

import attrs

from ..actor.reply import Reply
from ..context import Context
from ..episode import Episode
from ..errors import LeaseLostError
from ..store.base import Erased, SegmentState


@attrs.frozen(eq=False)
class AddEpisodes:
    episodes: tuple[Episode, ...]
    reply: Reply[tuple[Episode, ...]]
    #: Token counts of the large contents, made by the caller off the event loop (tokens.count_large).
    counted: dict[str, int] = attrs.field(factory=dict)
    #: Whether the caller gets copies of the stored episodes (``add``); an engine adapter that builds
    #: each episode for one add and drops the answer gets the session's own (``Handle._add_private``).
    copies: bool = True
    #: Each episode's metadata as ``encode_json`` writes it (``None``: the store encodes it), from such an adapter.
    metadata_json: tuple[str | None, ...] | None = None


@attrs.define(eq=False)
class ReadContext:
    """A context read; with ``wait_for_ceiling``, one that waits rather than leave out episodes (see handle.py).

    ``passed_by``: the number of the append that took adds queued behind this
    read (add_batch.py), if one did; 0 if none.
    """

    wait_for_summary: bool
    wait_for_ceiling: bool
    reply: Reply[Context]
    passed_by: int = attrs.field(default=0, init=False)


@attrs.frozen(eq=False)
class DeleteEpisodes:
    seqs: tuple[int, ...]
    reply: Reply[int]


@attrs.frozen(eq=False)
class ClearSession:
    reply: Reply[None]


@attrs.frozen(eq=False)
class ForgetSession:
    """Erase everything stored of the session (Engine.forget); the activation ends after it."""

    reply: Reply[Erased]


@attrs.frozen(eq=False)
class CloseSession:
    reply: Reply[None]


@attrs.frozen(eq=False)
class RetrySummary:
    """Lift the session's set-aside summary batch (if any) and summarize at once; the reply says if one was set aside.

    An operator's call (:meth:`~memengine.Engine.retry_set_aside`), not part of the conversation: not recorded.
    """

    reply: Reply[bool]


@attrs.frozen(eq=False)
class SummaryStored:
    """The child stored (or, if ``stored`` is false, was refused) a summary.

    For a segmented session, ``summary`` is the composed summary through
    ``through_seq`` (``None`` if its every leaf is empty) and ``segments`` what
    it leaves out and whether folds are due (store/segments.py).
    """

    generation: int
    through_seq: int
    summary: str | None
    stored: bool
    segments: SegmentState | None = None


@attrs.frozen(eq=False)
class SummaryFailed:
    """The child gave up on a batch for now (after ``attempts`` summarizer calls); its episodes stay pending."""

    generation: int
    through_seq: int
    error: BaseException
    attempts: int = 1
    #: A segmented session's repair (store/segments.py): the first seq of the node it was making.
    first_seq: int | None = None


@attrs.frozen(eq=False)
class Tick:
    """From the engine's idle sweeper: the time now, for deciding to passivate."""

    now: float


@attrs.frozen(eq=False)
class HandOver:
    """From the engine: another process waits for this session; passivate as soon as nothing is in flight."""


@attrs.frozen(eq=False)
class LeaseLost:
    """Give the session up: its lease was lost (a refused write, a failed renewal) or a commit is in doubt."""

    error: BaseException


@attrs.frozen(eq=False)
class LeaseNotRenewed:
    """From the engine's renewal: the lease was not renewed (expired, taken over, or its row locked meanwhile).

    No proof of loss by itself: the session renews its lease alone and gives
    up only if that fails. While an append of the session is in flight, it
    waits for that append instead, whose commit checks the lease (a part of a
    large add holds the row locked, and extends the lease as it commits).
    """

    error: LeaseLostError


@attrs.frozen(eq=False)
class EnterStored:
    """From the actor's own append completion: a large append is stored; enter it into the window (large_entry.py)."""


ClientMessage = AddEpisodes | ReadContext | DeleteEpisodes | ClearSession | ForgetSession | CloseSession | RetrySummary
SessionMessage = (
    ClientMessage | SummaryStored | SummaryFailed | Tick | HandOver | LeaseLost | LeaseNotRenewed | EnterStored
)
