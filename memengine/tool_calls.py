"""Tool calls and their results: which episodes must stay together in the window.

A provider refuses a conversation in which a tool result appears without the
tool call it answers (OpenAI answers 400; Anthropic likewise refuses a
``tool_result`` whose ``tool_use`` is not in the request). So the raw window
never separates them. The rule the window applies: **a tool call and all its
results are evicted together.** The episode that makes a call and every
episode that answers it form one group; the window evicts a group only as a
whole, so it never holds a result whose call it has dropped. A result answers
the nearest earlier call with its id that no result answered yet (ids may be
reused from turn to turn, ``call_0`` every turn), else the newest call with
its id (a second result). A link whose other side never arrives is harmless:
a call that no episode answers is simply a group of one.

:func:`tool_links` reads those links from an episode's metadata. It never
raises, whatever JSON the metadata holds: a value of the wrong shape (an id
that is not a str, or is blank) is ignored. Ids come out in the order they
appear, each once. The same episode may both make calls and answer calls,
even the same call (an Anthropic server tool's use and its result in one
message): it is then a group on its own for that id.

What is recognised
==================

First-class keys, at the top level of the metadata only. Build them with
:func:`calling` and :func:`answering` when an episode's metadata is not one of
the provider shapes below:

- ``CALLS_KEY`` (``"memengine.tool_calls"``): the ids this episode calls, a
  list of str (a single str is accepted too);
- ``RESULT_OF_KEY`` (``"memengine.tool_result_of"``): the ids this episode
  answers, a str or a list of str.

Provider shapes, looked for in the metadata itself and, one level down, in the
dict under its ``"message"``, ``"item"`` or ``"raw"`` key (nothing deeper):

- OpenAI Chat Completions: an assistant message's ``tool_calls`` list; the
  ``id`` of each entry is a call. A ``tool_call_id`` (a ``role: "tool"``
  message; the role is not required) is a result. The legacy
  ``function_call`` field carries no id and links nothing.
- OpenAI Responses items, by ``type``:

  - calls, by ``call_id``: ``function_call``, ``custom_tool_call``,
    ``computer_call``, ``local_shell_call``, ``shell_call``,
    ``apply_patch_call``, ``tool_search_call`` and ``program``: the types the
    client answers with an output item of its own;
  - results, by ``call_id``: every type ending in ``_call_output``, and
    ``tool_search_output`` and ``program_output``. A
    ``local_shell_call_output`` without a ``call_id`` names its call by
    ``id``, as the API documents it;
  - ``mcp_approval_request`` is a call by its ``id``;
    ``mcp_approval_response`` answers it by ``approval_request_id``;
  - other ``*_call`` items (``mcp_call``, ``web_search_call``,
    ``file_search_call``, ``image_generation_call``, ``code_interpreter_call``,
    ...) carry their own output, have no output item, and link nothing.

- Anthropic Messages content blocks, in the ``content`` list (or the dict
  itself, if it is a block):

  - calls, by ``id``: ``tool_use``, ``server_tool_use``, ``mcp_tool_use``;
  - results, by ``tool_use_id``: ``tool_result`` and every type ending in
    ``_tool_result`` (``web_search_tool_result``, ``mcp_tool_result``,
    ``code_execution_tool_result``, ...). A server tool's use and result are
    usually in one assistant message, which then calls and answers the same
    id; they are linked anyway, because a paused turn (``pause_turn``) or a
    programmatic tool call can split them across messages.

- A call made from inside another call also answers the outer call, so it
  joins that call's group: an OpenAI item whose ``caller`` is
  ``{"type": "program", "caller_id": ...}`` and an Anthropic block whose
  ``caller`` has a ``tool_id`` (code execution calling a client tool).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import attrs

__all__ = ["CALLS_KEY", "NO_LINKS", "RESULT_OF_KEY", "ToolLinks", "answering", "calling", "tool_links"]

#: Metadata key: the ids of the tool calls an episode makes (a list of str).
CALLS_KEY = "memengine.tool_calls"
#: Metadata key: the ids of the tool calls an episode answers (a str or a list of str).
RESULT_OF_KEY = "memengine.tool_result_of"


@attrs.frozen
class ToolLinks:
    """The tool call ids an episode ``calls`` and the ids it is a result of (``results``).

    Both in order of appearance, without duplicates. True when either is non-empty.
    """

    calls: tuple[str, ...] = ()
    results: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.calls or self.results)


#: The links of an episode that neither makes nor answers a tool call.
NO_LINKS = ToolLinks()

# Responses items the client answers with a separate output item, so the pair can be split.
_RESPONSES_CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "tool_search_call",
        "program",
    }
)
# Besides every "*_call_output".
_RESPONSES_RESULTS = frozenset({"tool_search_output", "program_output"})
_ANTHROPIC_CALLS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_NESTED_KEYS = ("message", "item", "raw")
# Every top-level key a link can come from: metadata with none of them is dismissed in one C-level pass.
_LINK_KEYS = frozenset({CALLS_KEY, RESULT_OF_KEY, "tool_calls", "tool_call_id", "type", "content", *_NESTED_KEYS})


def tool_links(metadata: Mapping[str, Any]) -> ToolLinks:
    """The tool call ids an episode with this ``metadata`` calls and answers.

    Never raises, whatever JSON the metadata holds; anything not of a recognised
    shape links nothing (see the module docstring for the shapes). Objects
    inside the metadata are looked at only if they are dicts, as they always
    are in an episode's (JSON) metadata. Cheap when the metadata holds no tool
    shapes: a few dict lookups.
    """
    if not isinstance(metadata, dict) and not isinstance(metadata, Mapping):
        return NO_LINKS
    if _LINK_KEYS.isdisjoint(metadata):
        return NO_LINKS
    calls: list[str] = []
    results: list[str] = []
    _add_ids(calls, metadata.get(CALLS_KEY))
    _add_ids(results, metadata.get(RESULT_OF_KEY))
    _scan_message(metadata, calls, results)
    for key in _NESTED_KEYS:
        nested = metadata.get(key)
        if isinstance(nested, dict):
            _scan_message(nested, calls, results)
    if not calls and not results:
        return NO_LINKS
    return ToolLinks(tuple(dict.fromkeys(calls)), tuple(dict.fromkeys(results)))


def calling(call_ids: Iterable[str]) -> dict[str, Any]:
    """The metadata fragment ``{CALLS_KEY: [...]}`` for an episode that makes these tool calls.

    Merge it into the episode's metadata: ``metadata={**calling(["call_1"]), ...}``.
    ``TypeError`` if ``call_ids`` is a str or holds a non-str; ``ValueError``
    if it is empty, or an id is blank or repeated.
    """
    if isinstance(call_ids, str | bytes):
        raise TypeError(f"calling() takes an iterable of call ids, not a single {type(call_ids).__name__}")
    return {CALLS_KEY: _checked_ids("calling()", call_ids)}


def answering(*call_ids: str) -> dict[str, Any]:
    """The metadata fragment ``{RESULT_OF_KEY: [...]}`` for an episode that answers these tool calls.

    Merge it into the episode's metadata: ``metadata={**answering("call_1"), ...}``.
    ``TypeError`` if an id is not a str; ``ValueError`` if none is given, or an
    id is blank or repeated.
    """
    return {RESULT_OF_KEY: _checked_ids("answering()", call_ids)}


def _checked_ids(what: str, call_ids: Iterable[object]) -> list[str]:
    checked: list[str] = []
    for call_id in call_ids:
        if not isinstance(call_id, str):
            raise TypeError(f"{what}: a call id must be a str, not {type(call_id).__name__}")
        if not call_id.strip():
            raise ValueError(f"{what}: a call id must be a non-blank string")
        if call_id in checked:
            raise ValueError(f"{what}: call id {call_id!r} is given more than once")
        checked.append(call_id)
    if not checked:
        raise ValueError(f"{what} needs at least one call id")
    return checked


def _is_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


def _add_ids(into: list[str], value: object) -> None:
    if isinstance(value, str):
        if _is_id(value):
            into.append(value)
    elif isinstance(value, list):
        into.extend(call_id for call_id in value if _is_id(call_id))


def _scan_message(message: Mapping[str, Any], calls: list[str], results: list[str]) -> None:
    """A chat message, a Responses item or a content block, and its content blocks."""
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for tool_call in tool_calls:
            if isinstance(tool_call, dict) and _is_id(call_id := tool_call.get("id")):
                calls.append(call_id)
    if _is_id(call_id := message.get("tool_call_id")):
        results.append(call_id)
    _scan_typed(message, calls, results)
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                _scan_typed(block, calls, results)


def _scan_typed(item: Mapping[str, Any], calls: list[str], results: list[str]) -> None:
    """A Responses item or an Anthropic content block, by its ``type``."""
    kind = item.get("type")
    if not isinstance(kind, str):
        return
    if kind in _RESPONSES_CALLS:
        into, call_id = calls, item.get("call_id")
    elif kind.endswith("_call_output") or kind in _RESPONSES_RESULTS:
        into, call_id = results, item.get("call_id")
        if kind == "local_shell_call_output" and not _is_id(call_id):
            call_id = item.get("id")  # the API's own shape names the call by "id"
    elif kind in _ANTHROPIC_CALLS:
        into, call_id = calls, item.get("id")
    elif kind == "tool_result" or kind.endswith("_tool_result"):
        into, call_id = results, item.get("tool_use_id")
    elif kind == "mcp_approval_request":
        into, call_id = calls, item.get("id")
    elif kind == "mcp_approval_response":
        into, call_id = results, item.get("approval_request_id")
    else:
        return
    if _is_id(call_id):
        into.append(call_id)
    caller = item.get("caller")
    if isinstance(caller, dict):
        # A call made by another call (a program, code execution) belongs to that call's group.
        outer = caller.get("caller_id", caller.get("tool_id"))
        if _is_id(outer):
            results.append(outer)
