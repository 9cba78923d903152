"""What a retain sink receives, and the protocols it implements (``retain``; ``forget`` if it can erase)."""

from __future__ import annotations

import hashlib
from typing import Literal, Protocol, runtime_checkable

import attrs

from ..episode import Episode

RetainMode = Literal["append", "replace"]


def retain_key(session_id: str, first_seq: int, last_seq: int, mode: RetainMode, lease_token: int | None = None) -> str:
    """A stable idempotency key for one batch: the same session, range and mode give the same key.

    The outbox also names the session's lease token when the batch was recorded
    (see store/outbox.py): a session id erased by ``engine.forget`` and used
    again starts at seq 1 again, and its batches must not repeat the keys of
    the first one's. The key is stored with the batch, so redelivery reuses it.
    """
    life = "" if lease_token is None else f"\x00{lease_token}"
    digest = hashlib.sha256(f"{mode}\x00{session_id}\x00{first_seq}\x00{last_seq}{life}".encode()).hexdigest()
    return f"memengine-{digest[:32]}"


def forget_key(session_id: str, generation: int, lease_token: int | None = None) -> str:
    """A stable idempotency key for one forget: the delete or clear that made the session's ``generation``.

    With the lease token of the delete or clear, as for :func:`retain_key`.
    """
    life = "" if lease_token is None else f"\x00{lease_token}"
    digest = hashlib.sha256(f"forget\x00{session_id}\x00{generation}{life}".encode()).hexdigest()
    return f"memengine-{digest[:32]}"


@attrs.frozen
class RetainBatch:
    """Episodes of one session handed on to long-term memory.

    In ``"append"`` mode ``episodes`` are the new episodes ``first_seq..last_seq``
    only; in ``"replace"`` mode they are the whole live session up to
    ``last_seq`` (``first_seq`` is then its first live seq), for sinks whose
    write replaces a document. ``key`` is stable for the batch (recorded with
    it; see :func:`retain_key`), and no other batch of the store ever has it:
    a sink may use it to drop a batch it has already stored.
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
