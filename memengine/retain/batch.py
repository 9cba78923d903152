"""What a retain sink receives, and the protocol it implements."""

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
