"""A :class:`~memengine.Context` as the messages of a model request, for each common provider.

:meth:`Context.to_openai_chat`, :meth:`Context.to_openai_responses` and
:meth:`Context.to_anthropic` call the functions here. Each returns a valid
request prefix: the summary as the system-level text the provider expects
(first ``system`` message for OpenAI, the top-level ``system`` parameter for
Anthropic), then the episodes in order, every tool result right after the
call it answers (the window never separates them; see
:mod:`memengine.tool_calls`). Append the new user turn and send.

An episode is read by the first shape its metadata holds:

- an OpenAI Responses item (under ``"item"``, or the key
  :mod:`memengine.integrations.openai_agents` writes);
- a provider message under ``"message"``: OpenAI Chat Completions
  (``tool_calls``, a ``role: "tool"`` answer) or Anthropic (content blocks
  ``tool_use`` / ``tool_result``);
- a message or item that makes or answers a tool call, under ``"raw"`` or at
  the top level of the metadata itself (as the README shows:
  ``metadata={"role": "assistant", "tool_calls": [call]}``). At the top level
  only the fields of a message or item are read (the application's own keys
  stay out of the request), and a message without ``content`` takes the
  episode's;
- else its ``role`` and ``content``, with the tool call ids of
  :data:`~memengine.tool_calls.CALLS_KEY` / :data:`~memengine.tool_calls.RESULT_OF_KEY`
  if it has them (a call known by its id only is rendered as a call of a tool
  named ``"tool"`` with no arguments, the episode's content as text).

An episode already in the target provider's shape is passed on as it is;
otherwise it is converted: its text, its tool calls (name and arguments) and
its tool results (as text). What a provider cannot express (reasoning items,
images for another provider, server-side tools) is left out, and a tool
result is never rendered without its call. Roles other than ``user``,
``assistant``, ``system`` and ``developer`` become ``user`` for OpenAI; for
Anthropic, ``system`` and ``developer`` episodes join the ``system`` text,
after the summary.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .tool_calls import tool_links

if TYPE_CHECKING:
    from .episode import Episode

__all__ = [
    "AGENTS_ITEM_IN_CONTENT_KEY",
    "AGENTS_ITEM_KEY",
    "SUMMARY_PREFIX",
    "to_anthropic",
    "to_openai_chat",
    "to_openai_responses",
]


class Renderable(Protocol):
    """What rendering reads of a :class:`~memengine.Context`: its summary and raw episodes.

    (A protocol rather than the class, since ``Context``'s methods call this module.)
    """

    @property
    def summary(self) -> str | None: ...

    @property
    def episodes(self) -> tuple[Episode, ...]: ...


#: How the summary's system-level text begins.
SUMMARY_PREFIX = "Summary of the conversation so far:\n"
#: Episode metadata key under which the OpenAI Agents SDK adapter keeps an item.
AGENTS_ITEM_KEY = "openai_agents.item"
#: Episode metadata key: the adapter kept the item as the episode's content, as JSON.
AGENTS_ITEM_IN_CONTENT_KEY = "openai_agents.item_in_content"

_OPENAI_ROLES = frozenset({"user", "assistant", "system", "developer"})
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
_ANTHROPIC_ONLY_BLOCKS = frozenset({"tool_use", "tool_result", "image", "document", "thinking", "redacted_thinking"})


@attrs.frozen
class _Text:
    role: str
    text: str


@attrs.frozen
class _Call:
    call_id: str
    name: str
    arguments: str  # JSON text


@attrs.frozen
class _Result:
    call_id: str
    output: str


_Part = _Text | _Call | _Result


@attrs.frozen
class _Shape:
    """One episode, read: its native shape (if any) and its provider-neutral parts."""

    kind: str  # "responses", "chat", "anthropic" or "plain"
    native: dict[str, Any] | None
    parts: tuple[_Part, ...]


def _passed_through(shape: _Shape, kind: str, called: set[str]) -> dict[str, Any] | None:
    """A copy of the episode's own item if it is already in ``kind``'s shape and answers only known calls.

    Its calls are then known (``called``); ``None`` means it is rendered from its parts.
    """
    if shape.kind != kind or shape.native is None or not _answers_known(shape, called):
        return None
    called.update(part.call_id for part in shape.parts if isinstance(part, _Call))
    return copy.deepcopy(shape.native)


def to_openai_chat(context: Renderable) -> list[dict[str, Any]]:
    """OpenAI Chat Completions ``messages``: the summary as the first ``system`` message, then the episodes."""
    messages: list[dict[str, Any]] = []
    if context.summary is not None:
        messages.append({"role": "system", "content": SUMMARY_PREFIX + context.summary})
    called: set[str] = set()
    for shape in _shapes(context.episodes):
        native = _passed_through(shape, "chat", called)
        if native is not None:
            messages.append(native)
            continue
        for part in shape.parts:
            if isinstance(part, _Text):
                if part.text:
                    role = part.role if part.role in _OPENAI_ROLES else "user"
                    messages.append({"role": role, "content": part.text})
            elif isinstance(part, _Call):
                tool_call = {
                    "id": part.call_id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": part.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last.get("role") == "assistant":
                    last.setdefault("tool_calls", []).append(tool_call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [tool_call]})
                called.add(part.call_id)
            elif part.call_id in called:
                messages.append({"role": "tool", "tool_call_id": part.call_id, "content": part.output})
    return messages


def to_openai_responses(context: Renderable) -> list[dict[str, Any]]:
    """OpenAI Responses ``input`` items: the summary as the first ``system`` message, then the episodes."""
    items: list[dict[str, Any]] = []
    if context.summary is not None:
        items.append({"role": "system", "content": SUMMARY_PREFIX + context.summary})
    called: set[str] = set()
    for shape in _shapes(context.episodes):
        native = _passed_through(shape, "responses", called)
        if native is not None:
            items.append(native)
            continue
        for part in shape.parts:
            if isinstance(part, _Text):
                if part.text:
                    role = part.role if part.role in _OPENAI_ROLES else "user"
                    items.append({"role": role, "content": part.text})
            elif isinstance(part, _Call):
                items.append(
                    {"type": "function_call", "call_id": part.call_id, "name": part.name, "arguments": part.arguments}
                )
                called.add(part.call_id)
            elif part.call_id in called:
                items.append({"type": "function_call_output", "call_id": part.call_id, "output": part.output})
    return items


def to_anthropic(context: Renderable) -> dict[str, Any]:
    """Anthropic Messages arguments ``{"system": ..., "messages": [...]}``: pass them as ``**kwargs``.

    ``system`` (left out when there is no system-level text) holds the
    summary, then the text of ``system`` and ``developer`` episodes.
    Consecutive episodes of one role form one message (the API would combine
    them anyway), and a tool result goes first in the user message after its
    call, as the API requires.
    """
    system: list[str] = []
    if context.summary is not None:
        system.append(SUMMARY_PREFIX + context.summary)
    messages: list[dict[str, Any]] = []
    called: set[str] = set()

    def append(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        last = messages[-1] if messages else None
        results_first = role == "user" and any(block.get("type") == "tool_result" for block in blocks)
        if last is not None and last["role"] == role and not (results_first and _has_non_result(last)):
            last["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for shape in _shapes(context.episodes):
        native = _passed_through(shape, "anthropic", called)
        if native is not None:
            content = native.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            append(native["role"], blocks)
            continue
        for part in shape.parts:
            if isinstance(part, _Text):
                if not part.text.strip():
                    continue
                if part.role in ("system", "developer"):
                    system.append(part.text)
                else:
                    append("assistant" if part.role == "assistant" else "user", [{"type": "text", "text": part.text}])
            elif isinstance(part, _Call):
                append(
                    "assistant", [{"type": "tool_use", "id": part.call_id, "name": part.name, "input": _input(part)}]
                )
                called.add(part.call_id)
            elif part.call_id in called:
                append("user", [{"type": "tool_result", "tool_use_id": part.call_id, "content": part.output}])
    request: dict[str, Any] = {"messages": messages}
    if system:
        request["system"] = "\n\n".join(system)
    return request


def _has_non_result(message: dict[str, Any]) -> bool:
    return any(block.get("type") != "tool_result" for block in message["content"])


def _input(call: _Call) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return {"arguments": call.arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _answers_known(shape: _Shape, called: set[str]) -> bool:
    """A native message may be passed on as it is only if every result in it answers a call already sent."""
    return all(part.call_id in called for part in shape.parts if isinstance(part, _Result))


def _shapes(episodes: tuple[Episode, ...]) -> list[_Shape]:
    return [_shape(episode) for episode in episodes]


def _shape(episode: Episode) -> _Shape:
    metadata = episode.metadata
    item = _responses_item(episode)
    if item is not None:
        return _Shape("responses", item, tuple(_responses_parts(item)))
    message = metadata.get("message")
    if isinstance(message, dict) and isinstance(message.get("role"), str):
        return _message_shape(message)
    raw = metadata.get("raw")
    if isinstance(raw, dict):
        shape = _native_shape(raw)
        if shape is not None:
            return shape
    shape = _native_shape(_top_level(episode))
    if shape is not None:
        return shape
    parts: list[_Part] = [_Text(episode.role, episode.content)]
    links = tool_links(metadata)
    if links.results:
        parts = [_Result(call_id, episode.content) for call_id in links.results]
    parts.extend(_Call(call_id, "tool", "{}") for call_id in links.calls)
    return _Shape("plain", None, tuple(parts))


def _message_shape(message: dict[str, Any]) -> _Shape:
    if _is_anthropic(message):
        return _Shape("anthropic", message, tuple(_anthropic_parts(message)))
    return _Shape("chat", message, tuple(_chat_parts(message)))


def _native_shape(candidate: dict[str, Any]) -> _Shape | None:
    """A provider message or item that carries tool calls or results, else ``None`` (read as plain).

    For the top level of the metadata and ``"raw"``, whose other keys may be anything: only a
    message or item that links a tool call is read as native, so ordinary metadata stays plain.
    """
    if not tool_links(candidate):
        return None
    if isinstance(candidate.get("role"), str) and "type" not in candidate:
        return _message_shape(candidate)
    if isinstance(candidate.get("type"), str):
        return _Shape("responses", candidate, tuple(_responses_parts(candidate)))
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
    if item is None:
        item = metadata.get("item")
    if isinstance(item, dict) and (isinstance(item.get("type"), str) or isinstance(item.get("role"), str)):
        return item
    return None


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


def _responses_parts(item: dict[str, Any]) -> list[_Part]:
    kind = item.get("type")
    if isinstance(item.get("role"), str) and kind in (None, "message"):
        return [_Text(item["role"], _text_of(item.get("content")))]
    links = tool_links({"item": item})
    if kind == "function_call" and links.calls:
        return [_Call(links.calls[0], str(item.get("name", "tool")), _arguments(item.get("arguments")))]
    if links.calls:
        rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        name = item.get("name")
        return [_Call(links.calls[0], name if isinstance(name, str) else str(kind), json.dumps(rest))]
    if links.results:
        return [_Result(call_id, _text_of(item.get("output"))) for call_id in links.results]
    return []  # reasoning and the like: nothing another provider (or a plain message) can carry


def _chat_parts(message: dict[str, Any]) -> list[_Part]:
    role = message["role"]
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        return [_Result(call_id, _text_of(message.get("content")))]
    parts: list[_Part] = [_Text(role, _text_of(message.get("content")))]
    for tool_call in message.get("tool_calls") or []:
        if isinstance(tool_call, dict) and isinstance(tool_call.get("id"), str):
            function = tool_call.get("function")
            if not isinstance(function, dict):
                function = {}
            parts.append(
                _Call(tool_call["id"], str(function.get("name", "tool")), _arguments(function.get("arguments")))
            )
    return parts


def _anthropic_parts(message: dict[str, Any]) -> list[_Part]:
    role = message["role"]
    parts: list[_Part] = []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(_Text(role, block["text"]))
        elif kind == "tool_use" and isinstance(block.get("id"), str):
            parts.append(_Call(block["id"], str(block.get("name", "tool")), json.dumps(block.get("input", {}))))
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            parts.append(_Result(block["tool_use_id"], _text_of(block.get("content"))))
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
