"""A :class:`~memengine.Context` as the messages of a model request, for each common provider.

:meth:`Context.to_openai_chat`, :meth:`Context.to_openai_responses` and
:meth:`Context.to_anthropic` call the functions here. Each returns a valid
request prefix: the summary as the system-level text the provider expects
(first ``system`` message for OpenAI, the top-level ``system`` parameter for
Anthropic), then the episodes in order, every tool result right after the
call it answers. Append the new user turn and send.

Tool calls and results, whatever edits the session saw:

- a result answers the nearest earlier call with its id that is still
  unanswered, so ids reused from turn to turn (``call_0`` every turn) pair
  each result with its own call;
- a result stored after other turns (a late result) is rendered right after
  its call, before those turns;
- a call with no result (its result was deleted, or has not arrived) is left
  out as soon as another turn follows it: providers refuse a call followed by
  anything but its result. While it is the last turn it is kept, since its
  result may still come: a rendering may then end with calls, and the next
  message you append must be their results;
- a result without its call (deleted, summarized, or a second result of one
  call) is left out.

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
- a message or item that carries tool calls or results is read by its own
  shape whichever of these keys holds it (a Chat message under ``"item"``, a
  Responses item under ``"message"``);
- else its ``role`` and ``content``, with the tool call ids of
  :data:`~memengine.tool_calls.CALLS_KEY` / :data:`~memengine.tool_calls.RESULT_OF_KEY`
  if it has them (a call known by its id only is rendered as a call of a tool
  named ``"tool"`` with no arguments, the episode's content as text).

An episode already in the target provider's shape is passed on as it is;
otherwise it is converted: its text, its tool calls (name and arguments) and
its tool results (as text). What a provider cannot express (reasoning items,
images for another provider, server-side tools) is left out. An episode
split by the rules above (a late result moved, a call left out) is converted
even for its own provider. Roles other than ``user``,
``assistant``, ``system`` and ``developer`` become ``user`` for OpenAI; for
Anthropic, ``system`` and ``developer`` episodes join the ``system`` text,
after the summary.

Reading each episode's shape is in episode_shapes.py; pairing the calls
with their results, and writing each provider's request, is here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .episode_shapes import (
    AGENTS_ITEM_IN_CONTENT_KEY,
    AGENTS_ITEM_KEY,
    OPENAI_ROLES,
    Call,
    Part,
    Result,
    Shape,
    Text,
    json_copy,
    read_shape,
)

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


def _system_text(context: Renderable) -> str | None:
    """The summary's system-level text, and the note on what a ceiling left out (``Context.omitted``).

    ``Context.tokens`` counts that note: a rendering without it would send the
    model a conversation with a silent hole between the summary and the episodes.
    """
    parts = [] if context.summary is None else [SUMMARY_PREFIX + context.summary]
    omitted = getattr(context, "omitted", None)  # a Context has it; other renderables may not
    if omitted is not None:
        parts.append(omitted.note)
    return "\n\n".join(parts) if parts else None


#: How the summary's system-level text begins.
SUMMARY_PREFIX = "Summary of the conversation so far:\n"


def to_openai_chat(context: Renderable) -> list[dict[str, Any]]:
    """OpenAI Chat Completions ``messages``: the summary as the first ``system`` message, then the episodes."""
    messages: list[dict[str, Any]] = []
    system = _system_text(context)
    if system is not None:
        messages.append({"role": "system", "content": system})
    for piece in _plan(context.episodes):
        native = piece.native("chat")
        if native is not None:
            _append_chat(messages, native)
            continue
        for part in piece.parts:
            if isinstance(part, Text):
                if part.text:
                    role = part.role if part.role in OPENAI_ROLES else "user"
                    messages.append({"role": role, "content": part.text})
            elif isinstance(part, Call):
                tool_call = {
                    "id": part.call_id,
                    "type": "function",
                    "function": {"name": part.name, "arguments": part.arguments},
                }
                _append_chat(
                    messages, {"role": "assistant", "content": None, "tool_calls": [tool_call]}, converted=True
                )
            else:
                messages.append({"role": "tool", "tool_call_id": part.call_id, "content": part.output})
    return messages


def _append_chat(messages: list[dict[str, Any]], message: dict[str, Any], *, converted: bool = False) -> None:
    """The calls of one turn go in one assistant message: a message with ``tool_calls`` must be answered next.

    A converted call joins the assistant message before it (its text, or its
    calls); a provider's own message only joins the calls before it.
    """
    last = messages[-1] if messages else None
    calls = message.get("tool_calls")
    if (
        not calls
        or message.get("role") != "assistant"
        or last is None
        or last.get("role") != "assistant"
        or not (converted or last.get("tool_calls"))
    ):
        messages.append(message)
        return
    last.setdefault("tool_calls", []).extend(calls)
    text = message.get("content")
    if isinstance(text, str) and text:
        last["content"] = f"{last['content']}\n{text}" if isinstance(last.get("content"), str) else text


def to_openai_responses(context: Renderable) -> list[dict[str, Any]]:
    """OpenAI Responses ``input`` items: the summary as the first ``system`` message, then the episodes."""
    items: list[dict[str, Any]] = []
    system_text = _system_text(context)
    if system_text is not None:
        items.append({"role": "system", "content": system_text})
    for piece in _plan(context.episodes):
        native = piece.native("responses")
        if native is not None:
            items.append(native)
            continue
        for part in piece.parts:
            if isinstance(part, Text):
                if part.text:
                    role = part.role if part.role in OPENAI_ROLES else "user"
                    items.append({"role": role, "content": part.text})
            elif isinstance(part, Call):
                items.append(
                    {"type": "function_call", "call_id": part.call_id, "name": part.name, "arguments": part.arguments}
                )
            else:
                items.append({"type": "function_call_output", "call_id": part.call_id, "output": part.output})
    return _without_dangling_reasoning(items)


def _without_dangling_reasoning(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` without a reasoning item that no model output follows (its own was deleted, or popped).

    The API refuses a reasoning item without the item that followed it in
    the model's output; here it would be followed by a user's message, a
    tool's output, or nothing.
    """
    if not any(item.get("type") == "reasoning" for item in items):
        return items
    kept = []
    for item, following in zip(items, [*items[1:], None], strict=True):
        if item.get("type") == "reasoning" and (
            following is None
            or following.get("role") in ("user", "system", "developer")
            or str(following.get("type", "")).endswith("_output")
        ):
            continue
        kept.append(item)
    return kept


def to_anthropic(context: Renderable) -> dict[str, Any]:
    """Anthropic Messages arguments ``{"system": ..., "messages": [...]}``: pass them as ``**kwargs``.

    ``system`` (left out when there is no system-level text) holds the
    summary, then the text of ``system`` and ``developer`` episodes.
    Consecutive episodes of one role form one message (the API would combine
    them anyway), and a tool result goes first in the user message after its
    call, as the API requires.
    """
    system: list[str] = []
    system_text = _system_text(context)
    if system_text is not None:
        system.append(system_text)
    messages: list[dict[str, Any]] = []

    def append(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        last = messages[-1] if messages else None
        results_first = role == "user" and any(block.get("type") == "tool_result" for block in blocks)
        if last is not None and last["role"] == role and not (results_first and _has_non_result(last)):
            last["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for piece in _plan(context.episodes):
        native = piece.native("anthropic")
        if native is not None:
            content = native.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            append(native["role"], blocks)
            continue
        for part in piece.parts:
            if isinstance(part, Text):
                if not part.text.strip():
                    continue
                if part.role in ("system", "developer"):
                    system.append(part.text)
                else:
                    append("assistant" if part.role == "assistant" else "user", [{"type": "text", "text": part.text}])
            elif isinstance(part, Call):
                append(
                    "assistant", [{"type": "tool_use", "id": part.call_id, "name": part.name, "input": _input(part)}]
                )
            else:
                append("user", [{"type": "tool_result", "tool_use_id": part.call_id, "content": part.output}])
    request: dict[str, Any] = {"messages": messages}
    if system:
        request["system"] = "\n\n".join(system)
    return request


@attrs.define
class _Piece:
    """What the plan renders at one point: some parts of one episode (``whole``: all of them)."""

    shape: Shape
    parts: list[Part]
    whole: bool

    def native(self, kind: str) -> dict[str, Any] | None:
        """A copy of the episode's own message or item, if it is in ``kind``'s shape and rendered whole."""
        if self.whole and self.shape.kind == kind and self.shape.native is not None:
            return json_copy(self.shape.native)
        return None


def _plan(episodes: tuple[Episode, ...]) -> list[_Piece]:
    """The episodes' parts in the order a provider accepts, each result right after its call.

    Results are paired with calls by position: a result answers the nearest
    earlier call with its id that no result answered yet (ids may be reused,
    ``call_0`` every turn); a result that finds none (its call is gone, or was
    answered already) is left out. An *exchange* is a run of calls (one
    episode's, or consecutive call-only episodes') and then their results;
    the next turn (text, or calls after results) closes it. Results that come
    later than that turn (late results) are moved up to close the exchange, so
    they follow their call. A call no result answers is left out once a turn
    closes its exchange: providers refuse a call followed by anything but its
    result. The calls of the last exchange are kept: their results may still come.
    """
    shapes = [read_shape(episode) for episode in episodes]
    call_of: dict[tuple[int, int], tuple[int, int]] = {}  # result (episode, part) -> the call it answers
    result_of: dict[tuple[int, int], tuple[int, int]] = {}  # and back
    open_calls: dict[str, list[tuple[int, int]]] = {}
    for index, shape in enumerate(shapes):
        for number, part in enumerate(shape.parts):
            if isinstance(part, Result) and (waiting := open_calls.get(part.call_id)):
                call = waiting.pop()
                call_of[index, number] = call
                result_of[call] = (index, number)
        for number, part in enumerate(shape.parts):
            if isinstance(part, Call):
                open_calls.setdefault(part.call_id, []).append((index, number))

    plan: list[_Piece] = []
    pieces_of_call: dict[tuple[int, int], _Piece] = {}
    exchange: list[tuple[int, int]] = []  # calls of the open exchange
    answering = False  # whether results of the open exchange were rendered yet
    done: set[tuple[int, int]] = set()  # results rendered already (moved up)

    def render(index: int, numbers: list[int]) -> _Piece:
        shape = shapes[index]
        piece = _Piece(shape, [shape.parts[n] for n in numbers], len(numbers) == len(shape.parts))
        plan.append(piece)
        for number in numbers:
            if isinstance(shape.parts[number], Call):
                pieces_of_call[index, number] = piece
            done.add((index, number))
        return piece

    def close(upto: int) -> None:
        """End the open exchange before episode ``upto``: its later results now, its unanswered calls left out."""
        later: dict[int, list[int]] = {}
        for call in exchange:
            result = result_of.get(call)
            if result is None:
                piece = pieces_of_call[call]
                piece.parts.remove(shapes[call[0]].parts[call[1]])
                piece.whole = False
                if not piece.parts:
                    _leave_out_reasoning_before(plan, piece)
            elif result not in done and result[0] >= upto:
                later.setdefault(result[0], []).append(result[1])
        for index in sorted(later):
            render(index, sorted(later[index]))

    for index, shape in enumerate(shapes):
        parts = shape.parts
        if not parts:
            render(index, [])  # an item only its own provider reads (reasoning, ...): it changes no exchange
            continue
        results = [n for n, part in enumerate(parts) if isinstance(part, Result) and (index, n) not in done]
        ours = [n for n in results if call_of.get((index, n)) in exchange]
        calls = [n for n, part in enumerate(parts) if isinstance(part, Call)]
        texts = any(isinstance(part, Text) and part.text.strip() for part in parts)
        if not calls and not texts:
            if ours:
                render(index, ours)
                answering = True
            elif not _results_in(parts):
                render(index, list(range(len(parts))))  # blank text: its own provider gets it as it is
            continue  # (results of no open exchange: their call is gone, or was answered)
        if calls and not results and not texts and not answering and exchange and not _reuses(shapes, exchange, parts):
            render(index, list(range(len(parts))))  # more calls of the same turn (parallel calls, one item each)
            exchange.extend((index, n) for n in calls)
            continue
        pending = [result_of[call] for call in exchange if call in result_of and result_of[call] not in done]
        if ours and len(ours) == len(results) == len(_results_in(parts)) and all(r[0] == index for r in pending):
            # It answers the open exchange in place, and no later result is owed: rendered whole.
            render(index, list(range(len(parts))))
        close(index)
        rest = [n for n in range(len(parts)) if (index, n) not in done and not isinstance(parts[n], Result)]
        if rest:
            render(index, rest)
        exchange = [(index, n) for n in calls]
        answering = False
    return plan


def _leave_out_reasoning_before(plan: list[_Piece], piece: _Piece) -> None:
    """Leave out a Responses reasoning item rendered right before ``piece``, which is left out.

    The API refuses a reasoning item without the item that followed it in the
    model's output (a 400, "provided without its required following item").
    """
    at = next(number for number, planned in enumerate(plan) if planned is piece)
    before = plan[at - 1] if at else None
    if before is not None and before.whole and not before.parts and before.shape.kind == "responses":
        native = before.shape.native
        if native is not None and native.get("type") == "reasoning":
            before.whole = False  # no parts, not whole: rendered as nothing


def _has_non_result(message: dict[str, Any]) -> bool:
    return any(block.get("type") != "tool_result" for block in message["content"])


def _input(call: Call) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return {"arguments": call.arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def _reuses(shapes: list[Shape], exchange: list[tuple[int, int]], parts: tuple[Part, ...]) -> bool:
    """Whether ``parts`` call an id the open exchange calls already (one message cannot hold it twice)."""
    open_ids = {shapes[index].parts[number].call_id for index, number in exchange}  # type: ignore[union-attr]
    return any(isinstance(part, Call) and part.call_id in open_ids for part in parts)


def _results_in(parts: tuple[Part, ...]) -> list[int]:
    return [number for number, part in enumerate(parts) if isinstance(part, Result)]
