"""What a context read returns."""

from __future__ import annotations

import attrs

from .episode import Episode


@attrs.frozen
class Context:
    """A session's memory as the agent should see it.

    ``summary`` covers every live episode with ``seq <= summarized_through``
    (``None`` and ``0`` when nothing is summarized yet); ``episodes`` holds every
    live episode after that, in order. Together they cover the session with no
    gap and no overlap. Episodes with ``seq <= evicted_through`` have left the
    window and are waiting for their summary; they stay visible raw until it is
    stored. ``tokens`` counts the summary and the episodes returned, by the
    session's tokenizer (``SessionConfig.tokenizer``, else an offline
    estimate), so a caller can budget the rest of its prompt.
    """

    session_id: str
    summary: str | None
    summarized_through: int
    episodes: tuple[Episode, ...]
    evicted_through: int
    tokens: int = 0
