"""What the engine needs from a summarizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..episode import Episode


@runtime_checkable
class Summarizer(Protocol):
    """Folds episodes that left the window into the rolling summary.

    ``previous`` is the summary so far (``None`` at first); ``episodes`` are the
    episodes to fold in, in order. Return the new summary: a non-empty string.
    Raising is fine: the engine retries with backoff, and after the last attempt
    keeps the episodes pending and tries again later. The call may be cancelled
    (engine shutdown, or the session was cleared meanwhile).

    Optional: ``async def fold(self, summaries: Sequence[str]) -> str``, one
    summary of consecutive summaries given oldest first, used by sessions with
    ``SessionConfig.segment_summaries`` to merge two of them. Without it,
    they are merged with ``summarize(first, [Episode("summary", second)])``.
    """

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str: ...
