"""An adapter for any OpenAI-compatible chat-completions endpoint.

Needs the ``openai`` package: ``pip install 'agent-memengine[openai]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from ..episode import Episode

DEFAULT_INSTRUCTIONS = (
    "You maintain the running memory of a conversation between a user and an assistant. "
    "Given the current summary and the turns that just left the conversation window, "
    "write the updated summary: keep every durable fact, preference, decision and open "
    "question; drop small talk; write plain prose, at most {max_words} words."
)
#: What the model is told when two summaries are merged (``SessionConfig.segment_summaries``).
DEFAULT_FOLD_INSTRUCTIONS = (
    "You maintain the running memory of a conversation between a user and an assistant. "
    "Given summaries of consecutive parts of the conversation, oldest first, write one summary of them all: "
    "keep every durable fact, preference, decision and open question, and where a later part changes an "
    "earlier one, keep the later; write plain prose, at most {max_words} words."
)


class OpenAISummarizer:
    """Summarizes with a chat model.

    Pass an ``openai.AsyncOpenAI`` (or compatible) ``client``, or let one be made
    from ``base_url`` and ``api_key`` (the usual ``OPENAI_*`` environment
    variables apply). Retries are the engine's job: the client is built with
    ``max_retries=0`` unless you pass your own. In ``instructions`` (and
    ``fold_instructions``, for merging two summaries of a segmented session:
    see ``SessionConfig.segment_summaries``), ``{max_words}`` is replaced by
    ``max_words``; every other brace is kept as written (JSON examples work).
    """

    def __init__(
        self,
        model: str,
        *,
        client: Any | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_words: int = 200,
        instructions: str = DEFAULT_INSTRUCTIONS,
        fold_instructions: str = DEFAULT_FOLD_INSTRUCTIONS,
        temperature: float = 0.0,
    ) -> None:
        if not model:
            raise ValueError("model must be a non-empty string")
        if client is None:
            try:
                from openai import AsyncOpenAI
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "OpenAISummarizer needs the openai package: pip install 'agent-memengine[openai]'"
                ) from exc
            client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        self.model = model
        self.client = client
        # Not str.format: instructions often show JSON, whose braces are meant literally.
        self.instructions = instructions.replace("{max_words}", str(max_words))
        self.fold_instructions = fold_instructions.replace("{max_words}", str(max_words))
        self.temperature = temperature

    def __repr__(self) -> str:
        # The model and where it is called, never the client's API key (nor a password in its URL).
        return (
            f"OpenAISummarizer(model={self.model!r}, base_url={_without_user_info(self.client)!r}, "
            f"temperature={self.temperature})"
        )

    def messages(self, previous: str | None, episodes: Sequence[Episode]) -> list[dict[str, str]]:
        turns = "\n".join(f"{episode.role}: {episode.content}" for episode in episodes)
        return [
            {"role": "system", "content": self.instructions},
            {
                "role": "user",
                "content": f"Current summary:\n{previous or '(none yet)'}\n\nTurns to fold in:\n{turns}",
            },
        ]

    def fold_messages(self, summaries: Sequence[str]) -> list[dict[str, str]]:
        parts = "\n\n".join(f"Part {number}:\n{summary}" for number, summary in enumerate(summaries, 1))
        return [
            {"role": "system", "content": self.fold_instructions},
            {"role": "user", "content": f"Summaries of consecutive parts, oldest first:\n\n{parts}"},
        ]

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        return await self._complete(self.messages(previous, episodes))

    async def fold(self, summaries: Sequence[str]) -> str:
        """One summary of consecutive summaries, oldest first (for ``SessionConfig.segment_summaries``)."""
        return await self._complete(self.fold_messages(summaries))

    async def _complete(self, messages: list[dict[str, str]]) -> str:
        response = await self.client.chat.completions.create(
            model=self.model,
            messages=cast(Any, messages),  # the client's TypedDicts, as plain dicts
            temperature=self.temperature,
        )
        content = response.choices[0].message.content
        return content.strip() if isinstance(content, str) else ""


def _without_user_info(client: Any) -> str | None:
    base_url = getattr(client, "base_url", None)
    if base_url is None:
        return None
    parts = urlsplit(str(base_url))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
