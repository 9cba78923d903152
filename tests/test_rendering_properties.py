"""Every rendering is a request its provider accepts, whatever the history: a property test.

Random histories mix the three provider shapes (OpenAI Chat messages, OpenAI
Responses items, Anthropic content blocks) and memengine's own keys, with
call ids unique or reused every turn (``call_0``), results that come late,
calls and results deleted, clears, evictions and summaries that lag. Each
rendering is checked by a validator written from the providers' documented
rules, not from memengine's code:

- OpenAI Chat Completions: an assistant message with ``tool_calls`` must be
  followed by a ``tool`` message for each of its calls before any other
  message; a ``tool`` message answers a call of that assistant message.
- OpenAI Responses: a ``function_call_output`` answers an earlier
  ``function_call`` of its ``call_id``; a ``function_call`` is answered
  before the next message.
- Anthropic Messages: roles alternate; ``tool_use`` blocks are in an
  assistant message and the next message (a user message) holds a
  ``tool_result`` for each of them, before any other block; a ``tool_result``
  answers a ``tool_use`` of the message right before it.

A rendering may end with calls not answered yet (their results are what the
caller sends next); nothing else may follow them. Every call is shown as it
was made (its name and arguments), and no text of the history is lost.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memengine import Context, Episode, SessionConfig, open_engine
from memengine.episode import with_seq
from memengine.tool_calls import answering, calling

from .fakes import fold

# Where an episode keeps its provider message: Chat at the top level of the metadata, or under "message",
# "item" or "raw"; Responses items under "item" or at the top level (beside the application's own keys).
SHAPES = ("chat", "chat-message", "chat-item", "chat-raw", "responses", "responses-top", "anthropic", "plain")
CHAT_KEYS = {"chat-message": "message", "chat-item": "item", "chat-raw": "raw"}


def kept(shape: str, message: dict[str, Any]) -> dict[str, Any]:
    """The metadata of an episode that keeps ``message`` the way ``shape`` says."""
    if shape in CHAT_KEYS:
        return {CHAT_KEYS[shape]: message}
    if shape == "responses":
        return {"item": message}
    if shape == "responses-top":
        return {**message, "app.trace": "t-1"}
    return message


# -- validators, from the providers' documented rules --------------------------------------------


def check_chat(messages: list[dict[str, Any]], calls_made: dict[str, set[tuple[str, str]]]) -> None:
    pending: list[str] = []  # calls of the last assistant message with tool_calls, not answered yet
    for index, message in enumerate(messages):
        role = message["role"]
        assert role in {"system", "developer", "user", "assistant", "tool"}, message
        if role == "tool":
            assert message["tool_call_id"] in pending, f"a tool message without its call at {index}: {messages}"
            pending.remove(message["tool_call_id"])
            assert isinstance(message["content"], str)
            continue
        assert not pending, f"calls {pending} not answered before message {index}: {messages}"
        if message.get("tool_calls"):
            assert role == "assistant"
            ids = [call["id"] for call in message["tool_calls"]]
            assert len(ids) == len(set(ids)), f"one call id twice in one message: {message}"
            for call in message["tool_calls"]:
                function = call["function"]
                assert (function["name"], function["arguments"]) in calls_made[call["id"]], (
                    f"a call not as made: {call}"
                )
                json.loads(function["arguments"])
            pending = ids
        else:
            assert isinstance(message["content"], str) and message["content"], f"an empty message: {message}"


ITEM_FIELDS = {
    "function_call": {"type", "id", "call_id", "name", "arguments", "status"},
    "function_call_output": {"type", "id", "call_id", "output", "status"},
}


def check_responses(items: list[dict[str, Any]], calls_made: dict[str, set[tuple[str, str]]]) -> None:
    pending: list[str] = []
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind in ("function_call", "function_call_output"):
            assert set(item) <= ITEM_FIELDS[kind], f"a field the API does not take: {item}"
        if kind == "function_call":
            assert (item["name"], item["arguments"]) in calls_made[item["call_id"]], f"a call not as made: {item}"
            pending.append(item["call_id"])
        elif kind == "function_call_output":
            assert item["call_id"] in pending, f"an output without its call at {index}: {items}"
            pending.remove(item["call_id"])
        else:
            assert "role" in item and kind in (None, "message"), item
            assert not pending, f"calls {pending} not answered before item {index}: {items}"


def check_anthropic(request: dict[str, Any], calls_made: dict[str, set[tuple[str, str]]]) -> None:
    assert set(request) <= {"system", "messages"}
    messages = request["messages"]
    for index, message in enumerate(messages):
        role, blocks = message["role"], message["content"]
        assert role in {"user", "assistant"} and blocks, f"an empty message or a wrong role: {message}"
        if index:
            assert role != messages[index - 1]["role"], f"roles do not alternate at {index}: {messages}"
        kinds = [block["type"] for block in blocks]
        for block in blocks:
            if block["type"] == "text":
                assert block["text"].strip()
            elif block["type"] == "tool_use":
                assert role == "assistant"
                made = calls_made[block["id"]]
                assert any(block["name"] == name and block["input"] == json.loads(args) for name, args in made), block
        uses = [block["id"] for block in blocks if block["type"] == "tool_use"]
        assert len(uses) == len(set(uses))
        if "tool_result" in kinds:
            assert role == "user"
            first_other = next((n for n, kind in enumerate(kinds) if kind != "tool_result"), len(kinds))
            assert "tool_result" not in kinds[first_other:], f"a tool_result after other blocks: {message}"
            before = messages[index - 1] if index else {"content": []}
            used = {block["id"] for block in before["content"] if block["type"] == "tool_use"}
            answered = [block["tool_use_id"] for block in blocks if block["type"] == "tool_result"]
            assert set(answered) <= used and len(answered) == len(set(answered)), f"an orphan result: {messages}"
        if uses and index < len(messages) - 1:
            following = messages[index + 1]["content"]
            answered = {block.get("tool_use_id") for block in following if block["type"] == "tool_result"}
            # The last message may be results, some still to come: the caller's next user turn holds them.
            waiting = index + 2 == len(messages) and all(block["type"] == "tool_result" for block in following)
            assert set(uses) <= answered or waiting, f"tool_use {uses} not answered in the next message: {messages}"


def check_everywhere(context: Context, calls_made: dict[str, set[tuple[str, str]]], texts: set[str]) -> None:
    chat = context.to_openai_chat()
    check_chat(chat, calls_made)
    responses = context.to_openai_responses()
    check_responses(responses, calls_made)
    anthropic = context.to_anthropic()
    check_anthropic(anthropic, calls_made)
    # Rendered from the context's episodes uncopied: not one dict or list of a rendering may be one of theirs.
    held = {id(container) for episode in context._episodes for container in containers(episode.metadata)}
    for rendering in (chat, responses, anthropic):
        assert not [container for container in containers(rendering) if id(container) in held], rendering
    shown = {message["content"] for message in chat if isinstance(message.get("content"), str)}
    for episode in context.episodes:
        if episode.content in texts:
            assert episode.content in shown, f"text {episode.content!r} was lost: {chat}"


def containers(value: Any) -> list[Any]:
    """Every dict and list inside ``value`` (itself included)."""
    found: list[Any] = []
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            found.append(item)
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            if isinstance(item, list):
                found.append(item)
            pending.extend(item)
    return found


# -- histories ------------------------------------------------------------------------------------


class History:
    """Builds episodes of every shape; remembers each call as it was made, and the plain texts."""

    def __init__(self, reused_ids: bool) -> None:
        self.reused_ids = reused_ids
        self.count = 0
        self.open: list[tuple[str, str]] = []  # (call id, shape) of calls not answered yet, oldest first
        self.calls_made: dict[str, set[tuple[str, str]]] = {}
        self.texts: set[str] = set()

    def text(self, role: str) -> Episode:
        self.count += 1
        content = f"{role} says {self.count}"
        self.texts.add(content)
        return Episode(role, content)

    def calls(self, shape: str, how_many: int, with_text: bool) -> list[Episode]:
        self.count += 1
        ids = [f"call_{n}" if self.reused_ids else f"c{self.count}_{n}" for n in range(how_many)]
        name, arguments = f"tool{self.count % 3}", json.dumps({"turn": self.count})
        for call_id in ids:
            self.calls_made.setdefault(call_id, set()).add((name, arguments))
            self.open.append((call_id, shape))
        text = f"assistant calls {self.count}" if with_text else None
        if shape.startswith("chat"):
            message = {
                "role": "assistant",
                "content": text,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}} for i in ids
                ],
            }
            return [Episode("assistant", text, metadata=kept(shape, message))]  # type: ignore[arg-type]
        if shape.startswith("responses"):
            items = [{"type": "function_call", "call_id": i, "name": name, "arguments": arguments} for i in ids]
            texts = [Episode("assistant", text)] if text else []
            return texts + [Episode("assistant", None, metadata=kept(shape, item)) for item in items]  # type: ignore[arg-type]
        if shape == "anthropic":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
            blocks += [{"type": "tool_use", "id": i, "name": name, "input": json.loads(arguments)} for i in ids]
            return [Episode("assistant", text, metadata={"message": {"role": "assistant", "content": blocks}})]  # type: ignore[arg-type]
        # plain: memengine's own keys; the renderers know the call by its id only
        for call_id in ids:
            self.calls_made[call_id].add(("tool", "{}"))
        return [Episode("assistant", text or "calling", metadata=calling(ids))]

    def result(self, pick: int) -> list[Episode]:
        if not self.open:
            return []
        call_id, shape = self.open.pop(pick % len(self.open))
        output = f"output of {call_id}"
        if shape.startswith("chat"):
            message = {"role": "tool", "tool_call_id": call_id, "content": output}
            return [Episode("tool", output, metadata=kept(shape, message))]
        if shape.startswith("responses"):
            item = {"type": "function_call_output", "call_id": call_id, "output": output}
            return [Episode("tool", output, metadata=kept(shape, item))]
        if shape == "anthropic":
            block = {"type": "tool_result", "tool_use_id": call_id, "content": output}
            return [Episode("user", output, metadata={"message": {"role": "user", "content": [block]}})]
        return [Episode("tool", output, metadata=answering(call_id))]


turn = st.one_of(
    st.tuples(st.just("user"), st.just(0), st.just(False)),
    st.tuples(st.just("assistant"), st.just(0), st.just(False)),
    st.tuples(st.sampled_from(SHAPES), st.integers(1, 3), st.booleans()),  # calls
    st.tuples(st.just("result"), st.integers(0, 5), st.just(False)),
    st.tuples(st.just("result"), st.integers(0, 5), st.just(False)),
)


def episodes_of(history: History, turns: list[tuple[str, int, bool]]) -> list[Episode]:
    episodes: list[Episode] = []
    for kind, number, flag in turns:
        if kind in ("user", "assistant"):
            episodes.append(history.text(kind))
        elif kind == "result":
            episodes.extend(history.result(number))
        else:
            episodes.extend(history.calls(kind, number, flag))
    return episodes


@settings(max_examples=400, deadline=None)
@given(
    reused_ids=st.booleans(),
    turns=st.lists(turn, max_size=25),
    deleted=st.sets(st.integers(0, 60), max_size=6),
    summarized=st.integers(0, 10),
    summary=st.booleans(),
)
def test_every_rendering_of_any_history_is_a_valid_request(reused_ids, turns, deleted, summarized, summary) -> None:
    history = History(reused_ids)
    episodes = [with_seq(episode, seq) for seq, episode in enumerate(episodes_of(history, turns), 1)]
    # Deleted episodes leave gaps; a summary (however far it lags) covers a prefix, wherever it cuts.
    live = [episode for index, episode in enumerate(episodes) if index not in deleted][summarized:]
    context = Context("s", "the story so far" if summary else None, 0, tuple(live), 0)
    check_everywhere(context, history.calls_made, history.texts)


# -- through the engine: both stores, both libraries ---------------------------------------------


class LaggingSummarizer:
    """Holds every call until :meth:`release` (then the calls waiting go); at the end, lets all through."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.done = False

    async def summarize(self, previous: str | None, episodes) -> str:
        if not self.done:
            await self.gate.wait()
        return fold(previous, episodes)

    def release(self, *, forever: bool = False) -> None:
        self.done = self.done or forever
        self.gate.set()
        self.gate = anyio.Event()


step = st.one_of(
    st.tuples(st.just("add"), st.lists(turn, min_size=1, max_size=4)),
    st.tuples(st.just("add"), st.lists(turn, min_size=1, max_size=4)),
    st.tuples(st.just("add"), st.lists(turn, min_size=1, max_size=4)),
    st.tuples(st.just("delete"), st.lists(st.integers(0, 30), min_size=1, max_size=2)),
    st.tuples(st.just("summarize"), st.just([])),
    st.tuples(st.just("clear"), st.just([])),
)


async def run_script(url: str, reused_ids: bool, steps: list[tuple[str, list[Any]]]) -> None:
    summarizer = LaggingSummarizer()
    config = SessionConfig(max_episodes=5, max_chars=100_000, evict_to=0.5)
    history = History(reused_ids)
    async with open_engine(url, summarizer=summarizer, config=config) as engine:
        session = engine.session(f"s-{uuid.uuid4().hex[:8]}")
        try:
            for action, argument in steps:
                if action == "add":
                    episodes = episodes_of(history, argument)
                    if episodes:
                        await session.add(episodes)
                elif action == "delete":
                    shown = (await session.context()).episodes
                    seqs = [shown[n % len(shown)].seq for n in argument] if shown else []
                    if seqs:
                        await session.delete_episodes(seqs)
                elif action == "summarize":
                    summarizer.release()
                else:
                    await session.clear()
                check_everywhere(await session.context(), history.calls_made, history.texts)
        finally:
            summarizer.release(forever=True)  # nothing waits for it at exit


ENGINE_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@ENGINE_SETTINGS
@given(reused_ids=st.booleans(), steps=st.lists(step, min_size=1, max_size=14))
def test_every_read_of_a_session_renders_to_valid_requests(store_url, backend, reused_ids, steps) -> None:
    url = store_url
    if not url.startswith("postgresql://"):
        url = str(Path(tempfile.mkdtemp(dir=Path(store_url).parent)) / "m.db")  # a fresh file per example
    run: Callable[[], Any] = lambda: run_script(url, reused_ids, steps)  # noqa: E731
    anyio.run(run, backend=backend)
