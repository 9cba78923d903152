"""Old tool outputs, clipped in the view: micro-compaction without an LLM call.

Tool outputs (file contents, search results, logs) are most of an agent's
tokens, and they stop mattering a few turns later. With
``SessionConfig(tool_clipping=ToolClipping())``, a session *shows* each tool
result that is older than the newest ``keep_turns`` episodes and longer than
``over_chars`` characters as its first ``head_chars`` and last ``tail_chars``
characters around a marker saying what was left out and where the whole output
is::

    [… 3,912 characters clipped; full output: seq 42 …]

Only the view changes. The episode is stored whole, so :meth:`Engine.recall
<memengine.Engine.recall>`, :meth:`Engine.export <memengine.Engine.export>`
and the retain sink see the full output, and the summarizer is given it whole
too (see :class:`ToolClipping`). What ``context()`` returns is the clipped
episode, its content and the provider's own message or item in its metadata
alike, so every rendering (:mod:`memengine.rendering`) shows the clipped output
in place of the full one, still right after the call it answers (a clip keeps
every tool call id). The window counts a clipped episode at its clipped size:
clipping delays eviction, and with it the summarizer's LLM call.

Which text is clipped: the episode's content, and in its metadata the output
of a tool result in a provider's shape (an OpenAI Chat ``role: "tool"``
message's ``content``, an OpenAI Responses ``*_output`` item's ``output``, an
Anthropic ``tool_result`` block's ``content``), under the keys
:mod:`memengine.rendering` reads (the top level, ``"message"``, ``"item"``,
``"raw"``, the Agents SDK adapter's key). A list of parts is clipped part by
part, text parts only. Text holding an image or file (a base64 data URL) and
outputs that are not text (a JSON object in place of a string) are shown
whole. Cuts never split a character: they fall on code points (never inside a
surrogate pair), not before a combining mark, a variation selector or a
zero-width joiner nor after a joiner, and at a line end when one is near.

Whether an episode is clipped depends only on the live episodes and the
setting (its place among them, its size), never on history: a delete, a clear
or a reload shows the same view the same episodes would give.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import attrs

from .attachments import metadata_tokens
from .episode import Episode, stored_episode
from .episode_shapes import AGENTS_ITEM_IN_CONTENT_KEY, AGENTS_ITEM_KEY, json_copy
from .tokens import Tokenizer
from .tool_calls import tool_links

__all__ = ["CLIP_MARKER", "ToolClipping", "clip_episode"]

#: The marker put where a clipped output's middle was (``clipped``: characters left out).
CLIP_MARKER = "[… {clipped:,} characters clipped; full output: seq {seq} …]"

_DATA_URL = ";base64,"  # (an image or file in the text: not clipped, see the module docstring)
_ZERO_WIDTH_JOINER = "\u200d"
# Where a message or item may sit in an episode's metadata (as memengine.rendering reads it).
_NESTED_KEYS = ("message", "item", "raw", AGENTS_ITEM_KEY)
_OUTPUT_ITEMS = frozenset({"tool_search_output", "program_output"})  # besides every "*_call_output"


def _at_least_one(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"ToolClipping.{attribute.name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"ToolClipping.{attribute.name} must be at least 1, got {value}")


@attrs.frozen(kw_only=True)
class ToolClipping:
    """Which tool results a session shows clipped, and how much of each it keeps.

    A tool result (an episode that answers a tool call, see
    :mod:`memengine.tool_calls`) older than the newest ``keep_turns`` episodes
    of the session, whose output is longer than ``over_chars`` characters
    (exactly ``over_chars`` is shown whole), is shown as its first
    ``head_chars`` and last ``tail_chars`` characters around
    :data:`CLIP_MARKER`. ``head_chars + tail_chars`` must be less than
    ``over_chars``.

    The defaults are conservative: the newest 6 episodes (about three
    call-and-result exchanges) are never touched, and only outputs over 2,000
    characters (about 500 tokens) are clipped, keeping their first 600 and last
    400 characters (a file's header and imports, a log's last lines and its
    error). A 4 KB output then costs about a quarter of its tokens.

    The summarizer reads full outputs: the summary is the only place an
    evicted output lives on in the context, and a summary of clipped outputs
    would lose what the middle held for good (a recall by seq brings the text
    back, but only if the agent knows to ask). That costs summarizer input
    tokens, not calls: clipping delays eviction, so it makes fewer calls, not more.
    """

    keep_turns: int = attrs.field(default=6, validator=_at_least_one)
    over_chars: int = attrs.field(default=2000, validator=_at_least_one)
    head_chars: int = attrs.field(default=600, validator=_at_least_one)
    tail_chars: int = attrs.field(default=400, validator=_at_least_one)

    def __attrs_post_init__(self) -> None:
        if self.head_chars + self.tail_chars >= self.over_chars:
            raise ValueError(
                f"ToolClipping: head_chars + tail_chars ({self.head_chars} + {self.tail_chars}) must be less than "
                f"over_chars ({self.over_chars}): clipping must leave something out"
            )


def clip_episode(episode: Episode, clipping: ToolClipping) -> Episode | None:
    """The episode as the view shows it once old, or ``None`` when nothing of it is clipped.

    Only a stored episode (with a seq) that answers a tool call is clipped.
    The copy shares nothing mutable with ``episode``, which is left whole.
    """
    seq = episode.seq
    if seq is None or not episode.metadata or not tool_links(episode.metadata).results:
        return None
    content = episode.content
    if episode.metadata.get(AGENTS_ITEM_IN_CONTENT_KEY):
        content = _clipped_item_json(content, seq, clipping)  # (the item itself, as JSON: clipped inside)
    else:
        content = _clipped(content, seq, clipping)
    metadata = json_copy(episode.metadata)
    changed = _clip_message(metadata, seq, clipping)
    for key in _NESTED_KEYS:
        nested = metadata.get(key)
        if isinstance(nested, dict):
            changed = _clip_message(nested, seq, clipping) or changed
    if content is episode.content and not changed:
        return None
    return stored_episode(episode.role, content, episode.id, episode.created_at, metadata, seq)


def clipped_tokens(episode: Episode, count_tokens: Tokenizer) -> int:
    """Tokens of a clipped episode, as the window counts an episode (its content and its attachments)."""
    tokens = count_tokens(episode.content)
    if episode.metadata:
        tokens += metadata_tokens(episode.metadata)
    return tokens


def _clip_message(message: dict[str, Any], seq: int, clipping: ToolClipping) -> bool:
    """Clip, in place, the output of the tool result ``message`` is (a message, an item or a block list)."""
    changed = False
    if isinstance(message.get("tool_call_id"), str) and "content" in message:  # an OpenAI Chat tool message
        changed = _clip_field(message, "content", seq, clipping)
    kind = message.get("type")
    if isinstance(kind, str) and (kind.endswith("_call_output") or kind in _OUTPUT_ITEMS) and "output" in message:
        changed = _clip_field(message, "output", seq, clipping) or changed  # an OpenAI Responses output item
    blocks = message.get("content")
    if isinstance(blocks, list):  # Anthropic content blocks
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result" and "content" in block:
                changed = _clip_field(block, "content", seq, clipping) or changed
    return changed


def _clip_field(holder: dict[str, Any], key: str, seq: int, clipping: ToolClipping) -> bool:
    """Clip ``holder[key]``, a text or a list of parts (text parts clipped one by one); True if it changed."""
    value = holder[key]
    if isinstance(value, str):
        clipped = _clipped(value, seq, clipping)
        holder[key] = clipped
        return clipped is not value
    if not isinstance(value, list):
        return False  # not text: shown whole
    changed = False
    for part in value:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            clipped = _clipped(part["text"], seq, clipping)
            if clipped is not part["text"]:
                part["text"] = clipped
                changed = True
    return changed


def _clipped_item_json(content: str, seq: int, clipping: ToolClipping) -> str:
    try:
        item = json.loads(content)
    except ValueError:
        return content
    if not isinstance(item, dict) or not _clip_message(item, seq, clipping):
        return content
    return json.dumps(item, ensure_ascii=False)


def _clipped(text: str, seq: int, clipping: ToolClipping) -> str:
    """``text`` clipped, or ``text`` itself (the same object) when it is not clipped."""
    if len(text) <= clipping.over_chars or _DATA_URL in text:
        return text
    head_end = _head_end(text, clipping.head_chars)
    tail_start = _tail_start(text, len(text) - clipping.tail_chars, head_end)
    marker = CLIP_MARKER.format(clipped=tail_start - head_end, seq=seq)
    clipped = f"{text[:head_end]}\n{marker}\n{text[tail_start:]}"
    return clipped if len(clipped) < len(text) else text


def _head_end(text: str, cut: int) -> int:
    """Where the head ends: at a line end in its last half if there is one (without it), never inside a character."""
    line_end = text.rfind("\n", cut // 2, cut + 1)
    if line_end >= 0:
        cut = line_end  # (the line end itself goes: the marker starts on a line of its own)
    while cut > 0 and _joined(text, cut):
        cut -= 1
    return cut


def _tail_start(text: str, cut: int, lowest: int) -> int:
    """Where the tail starts: after a line end in its first half if there is one, never inside a character."""
    line_end = text.find("\n", cut - 1, cut + (len(text) - cut) // 2)
    if line_end >= 0:
        cut = line_end + 1
    while cut < len(text) and _joined(text, cut):
        cut += 1
    return max(cut, lowest)


def _joined(text: str, index: int) -> bool:
    """Whether a cut before ``text[index]`` would split one character as the reader sees it."""
    after, before = text[index], text[index - 1]
    return (
        before == _ZERO_WIDTH_JOINER
        or after == _ZERO_WIDTH_JOINER
        or "\udc00" <= after <= "\udfff"  # the second half of a surrogate pair
        or "\ufe00" <= after <= "\ufe0f"  # a variation selector
        or (before == "\r" and after == "\n")
        or unicodedata.category(after) in ("Mn", "Mc", "Me")  # a combining mark
    )
