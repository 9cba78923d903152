"""What a context read returns."""

from __future__ import annotations

from typing import Any

import attrs

from . import rendering
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
    estimate), so a caller can budget the rest of its prompt. With
    ``SessionConfig.tool_clipping``, an old tool result among ``episodes`` is
    shown clipped, with a marker naming its seq, and counted so (see
    :mod:`memengine.clipping`); the store keeps it whole.
    """

    session_id: str
    summary: str | None
    summarized_through: int
    episodes: tuple[Episode, ...]
    evicted_through: int
    tokens: int = 0

    def to_openai_chat(self) -> list[dict[str, Any]]:
        """OpenAI Chat Completions ``messages``: the summary as the first ``system`` message, then the episodes.

        A valid request prefix: every tool result follows its call. See :mod:`memengine.rendering`.
        """
        return rendering.to_openai_chat(self)

    def to_openai_responses(self) -> list[dict[str, Any]]:
        """OpenAI Responses ``input`` items: the summary as the first ``system`` message, then the episodes.

        A valid request prefix: every ``function_call_output`` follows its call. See :mod:`memengine.rendering`.
        """
        return rendering.to_openai_responses(self)

    def to_anthropic(self) -> dict[str, Any]:
        """Anthropic Messages arguments ``{"system": ..., "messages": [...]}``, the summary in ``system``.

        ``client.messages.create(model=..., max_tokens=..., **context.to_anthropic())``
        after appending the new user turn to ``messages``. A valid request
        prefix: every ``tool_result`` is in the user message right after its
        ``tool_use``. See :mod:`memengine.rendering`.
        """
        return rendering.to_anthropic(self)
