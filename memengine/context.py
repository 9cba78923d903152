"""What a context read returns."""

from __future__ import annotations

from typing import Any

import attrs

from . import rendering
from .episode import Episode, stored_episode


@attrs.frozen
class Omitted:
    """Live episodes a read left out to stay within its token ceiling: neither summarized nor shown.

    They are the ``count`` live episodes with ``first_seq <= seq <= last_seq``
    (``tokens`` of them), between what the summary covers and the episodes
    shown. They are stored; they were evicted (or, with a summary too large
    for the ceiling, are the window's oldest) and their summary was not
    stored yet when the read was answered. A later read shows them summarized.
    """

    first_seq: int
    last_seq: int
    count: int
    tokens: int

    @property
    def note(self) -> str:
        """A line saying what is left out, for the model (``Context.tokens`` counts it)."""
        return OMITTED_NOTE.format(first=self.first_seq, last=self.last_seq, count=self.count, tokens=self.tokens)


#: What a model is told of the episodes a context left out (see :attr:`Omitted.note`).
OMITTED_NOTE = (
    "[memengine: episodes {first}..{last} ({count}, about {tokens} tokens) are left out here: "
    "not shown, to stay within the token ceiling, and not in the summary yet (the summarizer is behind)]"
)


@attrs.frozen
class Context:
    """A session's memory as the agent should see it.

    ``summary`` covers every live episode with ``seq <= summarized_through``
    (``None`` and ``0`` when nothing is summarized yet); ``episodes`` holds every
    live episode after that, in order. Together they cover the session with no
    gap and no overlap. Episodes with ``seq <= evicted_through`` have left the
    window and are waiting for their summary; they stay visible raw until it is
    stored, within the session's token ceiling
    (``SessionConfig.max_context_tokens``, by default twice ``max_tokens``):
    past it, the oldest of them are left out and ``omitted`` says which
    (:class:`Omitted`), so the summary, ``omitted`` and ``episodes`` still
    cover the session with no gap and no overlap; ``omitted`` is ``None``
    when nothing is left out. ``tokens`` counts the summary, the episodes
    returned and, when something is left out, ``omitted.note``, by the
    session's tokenizer (``SessionConfig.tokenizer``, else an offline
    estimate), so a caller can budget the rest of its prompt. With
    ``SessionConfig.tool_clipping``, an old tool result among ``episodes`` is
    shown clipped, with a marker naming its seq, and counted so (see
    :mod:`memengine.clipping`); the store keeps it whole. With
    ``SessionConfig.segment_summaries``, a delete of an old episode leaves
    the range of episodes summarized with it to be summarized again:
    ``resummarizing`` lists those ranges ``(first_seq, last_seq)``, and until
    then the summary shows their live episodes in their place, as they were
    said (one ``role: content`` line each between two marker lines; past
    16,000 characters in all, or where they would pass the token ceiling, it
    says which it leaves out), so the summary,
    ``omitted`` and ``episodes`` still cover the session with no gap and no
    overlap. ``context(wait_for_summary=True)`` waits for them too.
    """

    session_id: str
    summary: str | None
    summarized_through: int
    _episodes: tuple[Episode, ...] = attrs.field(alias="episodes")
    evicted_through: int
    tokens: int = 0
    omitted: Omitted | None = None
    resummarizing: tuple[tuple[int, int], ...] = ()
    # The copies of the episodes this object hands out, made when first asked for (see episodes).
    _copies: list[tuple[Episode, ...]] = attrs.field(init=False, factory=list, eq=False, repr=False)

    @property
    def episodes(self) -> tuple[Episode, ...]:
        """The raw episodes, oldest first: this context's own copies (editing them changes nothing else).

        Copied on first access, not per read: a read whose caller only looks at
        ``tokens`` or the summary costs nothing per episode. The session never
        changes the episodes it copies from (they are frozen, and no caller
        is ever handed their metadata), so a late copy is the same as an early one.
        """
        if not self._copies:
            self._copies.append(handed_out(self._episodes))
        return self._copies[0]

    def handed_out(self) -> Context:
        """This context as one caller gets it: with copies of its own (several callers may get one read)."""
        return attrs.evolve(self)

    def _rendered(self) -> Rendered:
        """What rendering reads of this context, its episodes not copied first.

        Every rendering builds what it returns anew (a stored message or item
        as a JSON copy, the rest new dicts of strings), so copying the
        episodes first would copy each of them twice per rendering.
        """
        return Rendered(self.summary, self._episodes, self.omitted)

    def to_openai_chat(self) -> list[dict[str, Any]]:
        """OpenAI Chat Completions ``messages``: the summary as the first ``system`` message, then the episodes.

        A valid request prefix: every tool result follows its call. See :mod:`memengine.rendering`.
        """
        return rendering.to_openai_chat(self._rendered())

    def to_openai_responses(self) -> list[dict[str, Any]]:
        """OpenAI Responses ``input`` items: the summary as the first ``system`` message, then the episodes.

        A valid request prefix: every ``function_call_output`` follows its call. See :mod:`memengine.rendering`.
        """
        return rendering.to_openai_responses(self._rendered())

    def to_anthropic(self) -> dict[str, Any]:
        """Anthropic Messages arguments ``{"system": ..., "messages": [...]}``, the summary in ``system``.

        ``client.messages.create(model=..., max_tokens=..., **context.to_anthropic())``
        after appending the new user turn to ``messages``. A valid request
        prefix: every ``tool_result`` is in the user message right after its
        ``tool_use``. See :mod:`memengine.rendering`.
        """
        return rendering.to_anthropic(self._rendered())


@attrs.frozen
class Rendered:
    """What rendering reads of a context (``rendering.Renderable``), its episodes as the session holds them."""

    summary: str | None
    episodes: tuple[Episode, ...]
    omitted: Omitted | None


def handed_out(episodes: tuple[Episode, ...]) -> tuple[Episode, ...]:
    """Copies of ``episodes`` sharing nothing mutable with them: what a caller of ``add`` or ``context`` gets.

    Episodes are frozen, but their metadata is a dict (of dicts and lists):
    a caller editing what it was handed must not edit the session's own
    episodes, which later reads show. Metadata holds only JSON values, so the
    deep copy is a plain walk (a few microseconds for a usual episode).
    """
    return tuple(
        [
            stored_episode(
                episode.role,
                episode.content,
                episode.id,
                episode.created_at,
                _json_copy(episode.metadata),
                episode.seq,  # type: ignore[arg-type]
            )
            for episode in episodes
        ]
    )


def _json_copy(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {key: _json_copy(item) for key, item in value.items()} if value else {}
    if kind is list:
        return [_json_copy(item) for item in value]
    return value  # str, int, float, bool, None: immutable
