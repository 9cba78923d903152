"""How an episode is read for rendering: the shape its metadata holds, as provider-neutral parts.

rendering.py turns a context's episodes into a provider's request; this
module reads each episode first (its module docstring lists the shapes, in
the order they are tried): an OpenAI Responses item, a Chat Completions or
Anthropic message, or plain text with the tool call ids of tool_calls.py,
each as its native form (if any) and its parts: text, tool calls and tool
results.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from .tool_calls import tool_links

if TYPE_CHECKING:
    from .episode import Episode

#: Episode metadata key under which the OpenAI Agents SDK adapter keeps an item.
AGENTS_ITEM_KEY = "openai_agents.item"
#: Episode metadata key: the adapter kept the item as the episode's content, as JSON.
AGENTS_ITEM_IN_CONTENT_KEY = "openai_agents.item_in_content"

OPENAI_ROLES = frozenset({"user", "assistant", "system", "developer"})
# The fields of a Chat Completions (or Anthropic) message, read from the top level of an episode's metadata.
_MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio", "function_call")
# The fields of the Responses items that make or answer tool calls (the same, for the top level).
_ITEM_FIELDS = (
    "type",
    "id",
    "call_id",
    "name",
    "arguments",
    "input",
    "output",
    "status",
    "action",
    "operation",
    "caller",
    "namespace",
    "pending_safety_checks",
    "acknowledged_safety_checks",
    "server_label",
    "approval_request_id",
    "approve",
    "reason",
)
_NESTED_KEYS = ("item", "message", "raw")
_ANTHROPIC_ONLY_BLOCKS = frozenset({"tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking"})


@attrs.frozen
class Text:
    role: str
    text: str


@attrs.frozen
class Call:
    call_id: str
    name: str
    arguments: str  # JSON text


@attrs.frozen
class Result:
    call_id: str
    output: str


Part = Text | Call | Result


@attrs.frozen
class Shape:
    """One episode, read: its native shape (if any) and its provider-neutral parts."""

    kind: str  # "responses", "chat", "anthropic" or "plain"
    native: dict[str, Any] | None
    parts: tuple[Part, ...]


def json_copy(value: Any) -> Any:
    """A copy of JSON data (dicts, lists, scalars) sharing nothing mutable: 3x faster than ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_copy(item) for item in value]
    return value


def read_shape(episode: Episode) -> Shape:
    metadata = episode.metadata
    item = _responses_item(episode)
    if item is not None:
        return Shape("responses", item, tuple(_responses_parts(item)))
    for key in _NESTED_KEYS:
        nested = metadata.get(key)
        if isinstance(nested, dict):
            shape = _native_shape(nested) or _nested_message(nested, key)
            if shape is not None:
                return shape
    shape = _native_shape(_top_level(episode))
    if shape is not None:
        return shape
    parts: list[Part] = [Text(episode.role, episode.content)]
    links = tool_links(metadata)
    if links.results:
        parts = [Result(call_id, episode.content) for call_id in links.results]
    parts.extend(Call(call_id, "tool", "{}") for call_id in links.calls)
    return Shape("plain", None, tuple(parts))


def _message_shape(message: dict[str, Any]) -> Shape:
    if _is_anthropic(message):
        return Shape("anthropic", message, tuple(_anthropic_parts(message)))
    return Shape("chat", message, tuple(_chat_parts(message)))


def _nested_message(nested: dict[str, Any], key: str) -> Shape | None:
    """A message or item without tool calls, under ``"item"`` (a Responses item) or ``"message"``."""
    if key == "item" and (isinstance(nested.get("type"), str) or isinstance(nested.get("role"), str)):
        return Shape("responses", nested, tuple(_responses_parts(nested)))
    if key == "message" and isinstance(nested.get("role"), str):
        return _message_shape(nested)
    return None


def _native_shape(candidate: dict[str, Any]) -> Shape | None:
    """A provider message or item that carries tool calls or results, by its own shape, else ``None``.

    Wherever it sits: a Chat message (``tool_calls``, ``tool_call_id``) is
    read as one even under ``"item"``, a Responses item (a ``type``) even
    under ``"message"``. At the top level of the metadata and under ``"raw"``,
    whose other keys may be anything, only a message or item that links a
    tool call is read as native, so ordinary metadata stays plain.
    """
    if not tool_links(candidate):
        return None
    if "tool_calls" in candidate or "tool_call_id" in candidate:
        return Shape("chat", candidate, tuple(_chat_parts(candidate))) if "role" in candidate else None
    if isinstance(candidate.get("role"), str) and "type" not in candidate:
        return _message_shape(candidate)
    if isinstance(candidate.get("type"), str):
        return Shape("responses", candidate, tuple(_responses_parts(candidate)))
    return None


def _top_level(episode: Episode) -> dict[str, Any]:
    """The metadata as a provider message or item: memengine's own keys left out.

    A chat message keeps only the fields of a message (``role``, ``content``,
    ``tool_calls``, ...) and, when it has no ``content``, takes the episode's;
    an item, only the fields of a tool call's or result's item: the metadata
    may hold the application's own keys too, which a provider would refuse.
    """
    metadata = episode.metadata
    if isinstance(metadata.get("role"), str) and "type" not in metadata:
        message = {key: metadata[key] for key in _MESSAGE_FIELDS if key in metadata}
        if "content" not in message:
            message["content"] = episode.content or None
        return message
    return {key: metadata[key] for key in _ITEM_FIELDS if key in metadata}


def _responses_item(episode: Episode) -> dict[str, Any] | None:
    metadata = episode.metadata
    item = metadata.get(AGENTS_ITEM_KEY)
    if item is None and metadata.get(AGENTS_ITEM_IN_CONTENT_KEY):
        try:
            item = json.loads(episode.content)
        except ValueError:
            item = None
    if isinstance(item, dict) and (isinstance(item.get("type"), str) or isinstance(item.get("role"), str)):
        return item
    return None


def is_reasoning(episode: Episode) -> bool:
    """Whether ``episode`` holds a Responses ``reasoning`` item (as MemEngineSession keeps it, or under ``item``).

    The API takes a reasoning item only together with the item that followed
    it in the model's output, and refuses that item without it: the window
    keeps a reasoning item and the item after it together.
    """
    metadata = episode.metadata
    if not metadata or _REASONING_KEYS.isdisjoint(metadata):
        return False  # (the usual case: one C-level pass)
    for key in _REASONING_NESTED_KEYS:
        nested = metadata.get(key)
        if isinstance(nested, dict):
            return nested.get("type") == "reasoning"
    if metadata.get(AGENTS_ITEM_IN_CONTENT_KEY) and '"reasoning"' in episode.content:
        item = _responses_item(episode)  # a large item kept as JSON in the content
        return item is not None and item.get("type") == "reasoning"
    return metadata.get("type") == "reasoning"


_REASONING_NESTED_KEYS = (AGENTS_ITEM_KEY, "item", "raw")
_REASONING_KEYS = frozenset({*_REASONING_NESTED_KEYS, AGENTS_ITEM_IN_CONTENT_KEY, "type"})


def _is_anthropic(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if "tool_calls" in message or "tool_call_id" in message or not isinstance(content, list):
        return False
    return any(
        isinstance(block, dict)
        and isinstance(kind := block.get("type"), str)
        and (kind in _ANTHROPIC_ONLY_BLOCKS or kind.endswith("_tool_use") or kind.endswith("_tool_result"))
        for block in content
    )


def _responses_parts(item: dict[str, Any]) -> list[Part]:
    kind = item.get("type")
    if isinstance(item.get("role"), str) and kind in (None, "message"):
        return [Text(item["role"], _text_of(item.get("content")))]
    links = tool_links({"item": item})
    if kind == "function_call" and links.calls:
        return [Call(links.calls[0], str(item.get("name", "tool")), _arguments(item.get("arguments")))]
    if links.calls:
        rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        name = item.get("name")
        return [Call(links.calls[0], name if isinstance(name, str) else str(kind), json.dumps(rest))]
    if links.results:
        return [Result(call_id, _text_of(item.get("output"))) for call_id in links.results]
    return []  # reasoning and the like: nothing another provider (or a plain message) can carry


def _chat_parts(message: dict[str, Any]) -> list[Part]:
    role = message["role"]
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        return [Result(call_id, _text_of(message.get("content")))]
    parts: list[Part] = [Text(role, _text_of(message.get("content")))]
    for tool_call in message.get("tool_calls") or []:
        if isinstance(tool_call, dict) and isinstance(tool_call.get("id"), str):
            function = tool_call.get("function")
            if not isinstance(function, dict):
                function = {}
            parts.append(
                Call(tool_call["id"], str(function.get("name", "tool")), _arguments(function.get("arguments")))
            )
    return parts


def _anthropic_parts(message: dict[str, Any]) -> list[Part]:
    role = message["role"]
    parts: list[Part] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(Text(role, block["text"]))
        elif kind == "tool_use" and isinstance(block.get("id"), str):
            parts.append(Call(block["id"], str(block.get("name", "tool")), json.dumps(block.get("input", {}))))
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            parts.append(Result(block["tool_use_id"], _text_of(block.get("content"))))
    return parts


def _arguments(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {})


def _text_of(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    texts.append(text)
        return "\n".join(texts)
    if value is None:
        return ""
    return json.dumps(value)
