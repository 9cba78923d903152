"""What a retain sink receives, and the protocols it implements (``retain``; ``forget`` if it can erase)."""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol, runtime_checkable

import attrs

from ..episode import Episode

RetainMode = Literal["append", "replace"]


def retain_key(session_id: str, first_seq: int, last_seq: int, mode: RetainMode) -> str:
    """A stable idempotency key for one batch: the same session, range and mode give the same key."""
    digest = hashlib.sha256(f"{mode}\x00{session_id}\x00{first_seq}\x00{last_seq}".encode()).hexdigest()
    return f"memengine-{digest[:32]}"


def forget_key(session_id: str, generation: int) -> str:
    """A stable idempotency key for one forget: the delete or clear that made the session's ``generation``."""
    digest = hashlib.sha256(f"forget\x00{session_id}\x00{generation}".encode()).hexdigest()
    return f"memengine-{digest[:32]}"


@attrs.frozen
class RetainBatch:
    """Episodes of one session handed on to long-term memory.

    In ``"append"`` mode ``episodes`` are the new episodes ``first_seq..last_seq``
    only; in ``"replace"`` mode they are the whole live session up to
    ``last_seq`` (``first_seq`` is then its first live seq), for sinks whose
    write replaces a document. ``key`` is stable for the same session, range
    and mode: a sink may use it to drop a batch it has already stored.
    """

    session_id: str
    first_seq: int
    last_seq: int
    episodes: tuple[Episode, ...]
    key: str
    mode: RetainMode = "append"


@runtime_checkable
class RetainSink(Protocol):
    """Receives batches, in order per session. Raise to have the batch retried.

    A sink may declare ``mode = "replace"`` to receive whole sessions; the
    default is ``"append"``. The engine calls ``retain`` from its delivery
    actor, never from a writer: a slow or failing sink cannot slow ``add``.
    """

    async def retain(self, batch: RetainBatch) -> None: ...


@attrs.frozen
class ForgetRequest:
    """Episodes a delete (``seqs``) or a clear (``seqs is None``: the whole session) removed after they were handed on.

    ``seqs`` are only episodes the sink may hold: ones in a batch it was handed
    (or was being handed when the delete committed). ``through_seq`` is how far
    the session has been handed on when the request is sent (every batch
    before it included); ``kept`` are the session's episodes up to it that are
    still live then, in order, for a sink that rewrites a document from what
    remains (empty for a clear). Batches
    recorded before the delete reach the sink before this request, batches
    recorded after it come after it and never hold a forgotten episode. ``key``
    is stable: a redelivery after a crash carries the same key.
    """

    session_id: str
    seqs: tuple[int, ...] | None
    through_seq: int
    kept: tuple[Episode, ...]
    key: str


@runtime_checkable
class ForgettingSink(RetainSink, Protocol):
    """A retain sink that can also erase what it was handed: the engine passes deletes and clears on.

    ``forget`` is called from the delivery actor, in order with the session's
    retain batches, exactly as ``retain`` is (claimed, retried, redelivered with
    the same key). Raise to have the request retried. Forgetting what the sink
    does not hold must succeed. A sink without ``forget`` keeps what it was
    handed: deletes and clears stop at the engine's store.
    """

    async def forget(self, request: ForgetRequest) -> None: ...
