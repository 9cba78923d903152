"""Context rendering: each provider's request shape, a valid prefix, the summary where the provider wants it."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from memengine import Context, Episode, SessionConfig, open_engine
from memengine.rendering import SUMMARY_PREFIX
from memengine.tool_calls import answering, calling

from .fakes import RecordingSummarizer


def context(*episodes: Episode, summary: str | None = None) -> Context:
    return Context("s", summary, 3 if summary else 0, tuple(episodes), 0)


def assert_valid_chat(messages: list[dict[str, Any]]) -> None:
    """OpenAI Chat: tool messages answer the assistant message right before them, and every earlier call is answered."""
    open_calls: list[str] = []
    for index, message in enumerate(messages):
        assert message["role"] in {"system", "developer", "user", "assistant", "tool"}
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, f"orphaned tool message at {index}: {messages}"
            open_calls.remove(message["tool_call_id"])
            continue
        assert not open_calls, f"calls {open_calls} unanswered before message {index}: {messages}"
        if message["role"] == "assistant" and message.get("tool_calls"):
            open_calls = [call["id"] for call in message["tool_calls"]]
            for call in message["tool_calls"]:
                json.loads(call["function"]["arguments"])
        else:
            assert isinstance(message["content"], str) and message["content"]


def assert_valid_responses(items: list[dict[str, Any]]) -> None:
    called: set[str] = set()
    answered: set[str] = set()
    for item in items:
        if item.get("type") == "function_call":
            called.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            assert item["call_id"] in called, f"orphaned output {item}"
            answered.add(item["call_id"])
        elif "role" in item:
            assert item["role"] in {"system", "developer", "user", "assistant"}
        else:
            assert isinstance(item.get("type"), str)  # another Responses item (reasoning, ...)
    for item, following in zip(items, [*items[1:], None], strict=True):
        if item.get("type") == "reasoning":
            # The API refuses a reasoning item without the item it preceded in the model's output (400).
            assert following is not None and following.get("type") != "reasoning", f"dangling reasoning in {items}"
    trailing = {item["call_id"] for item in items[-1:] if item.get("type") == "function_call"}
    assert called - answered <= trailing, f"unanswered calls in {items}"


def assert_valid_anthropic(request: dict[str, Any]) -> None:
    assert set(request) <= {"system", "messages"}
    messages = request["messages"]
    for index, message in enumerate(messages):
        assert message["role"] in {"user", "assistant"}
        assert message["content"], "an empty message"
        if index:
            assert message["role"] != messages[index - 1]["role"], "roles must alternate"
        kinds = [block["type"] for block in message["content"]]
        for block in message["content"]:
            if block["type"] == "text":
                assert block["text"].strip()
        if "tool_result" in kinds:
            assert message["role"] == "user"
            assert kinds == sorted(kinds, key=lambda kind: kind != "tool_result"), "tool results go first"
            previous = messages[index - 1]
            uses = {block["id"] for block in previous["content"] if block["type"] == "tool_use"}
            for block in message["content"]:
                if block["type"] == "tool_result":
                    assert block["tool_use_id"] in uses, f"orphaned tool_result in {messages}"
        if "tool_use" in kinds and index < len(messages) - 1:
            answered = {b.get("tool_use_id") for b in messages[index + 1]["content"] if b["type"] == "tool_result"}
            assert {b["id"] for b in message["content"] if b["type"] == "tool_use"} <= answered


def assert_valid_everywhere(ctx: Context) -> None:
    assert_valid_chat(ctx.to_openai_chat())
    assert_valid_responses(ctx.to_openai_responses())
    assert_valid_anthropic(ctx.to_anthropic())


AGENT_ITEMS = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Lisbon"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
]


def agent_episodes() -> list[Episode]:
    return [
        Episode(item.get("role") or item["type"], "x", metadata={"openai_agents.item": item, **_links(item)})
        for item in AGENT_ITEMS
    ]


def _links(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type") == "function_call":
        return calling([item["call_id"]])
    if item.get("type") == "function_call_output":
        return answering(item["call_id"])
    return {}


def test_the_summary_is_system_level_text_for_every_provider() -> None:
    ctx = context(Episode("user", "hi"), summary="Ana lives in Lisbon.")
    system = {"role": "system", "content": SUMMARY_PREFIX + "Ana lives in Lisbon."}
    assert ctx.to_openai_chat() == [system, {"role": "user", "content": "hi"}]
    assert ctx.to_openai_responses() == [system, {"role": "user", "content": "hi"}]
    assert ctx.to_anthropic() == {
        "system": SUMMARY_PREFIX + "Ana lives in Lisbon.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_without_a_summary_there_is_no_system_text() -> None:
    ctx = context(Episode("user", "hi"), Episode("assistant", "hello"))
    assert ctx.to_openai_chat() == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert "system" not in ctx.to_anthropic()
    assert context().to_openai_chat() == [] and context().to_anthropic() == {"messages": []}


def test_agents_sdk_items_go_to_responses_as_they_are_and_to_others_converted() -> None:
    ctx = context(*agent_episodes())
    assert ctx.to_openai_responses() == AGENT_ITEMS
    assert ctx.to_openai_chat() == [
        {"role": "user", "content": "Weather in Lisbon?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    assert ctx.to_anthropic() == {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Lisbon?"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Lisbon"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]},
        ]
    }
    assert_valid_everywhere(ctx)


def test_chat_messages_pass_through_to_chat_and_convert_elsewhere() -> None:
    call = {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "b", "arguments": '{"n": 1}'}},
        ],
    }
    results = [{"role": "tool", "tool_call_id": cid, "content": f"result {cid}"} for cid in ("c1", "c2")]
    ctx = context(
        Episode("user", "go"),
        Episode("assistant", "Let me check.", metadata={"message": call}),
        *(Episode("tool", r["content"], metadata={"message": r}) for r in results),
    )
    assert ctx.to_openai_chat() == [{"role": "user", "content": "go"}, call, *results]
    assert [i.get("type") for i in ctx.to_openai_responses()] == [
        None,
        None,
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    anthropic = ctx.to_anthropic()["messages"]
    assert [block["type"] for block in anthropic[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert [block["tool_use_id"] for block in anthropic[2]["content"]] == ["c1", "c2"]
    assert_valid_everywhere(ctx)


def test_anthropic_messages_pass_through_to_anthropic_and_convert_elsewhere() -> None:
    use = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "tu1", "name": "f", "input": {}}],
    }
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": "42"}]}
    ctx = context(
        Episode("user", "What is it?"),
        Episode("assistant", "Checking.", metadata={"message": use}),
        Episode("user", "42", metadata={"message": result}),
        Episode("user", "Thanks"),
    )
    assert ctx.to_anthropic()["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is it?"}]},
        use,
        {"role": "user", "content": [result["content"][0], {"type": "text", "text": "Thanks"}]},
    ]
    assert ctx.to_openai_chat()[2] == {"role": "tool", "tool_call_id": "tu1", "content": "42"}
    assert_valid_everywhere(ctx)


def test_plain_episodes_linked_by_memengine_keys_keep_their_pairing() -> None:
    ctx = context(
        Episode("assistant", "calling the calendar", metadata=calling(["k1"])),
        Episode("tool", "free at 10", metadata=answering("k1")),
        Episode("critic", "looks fine"),
        Episode("system", "be brief"),
    )
    chat = ctx.to_openai_chat()
    assert chat[0]["tool_calls"][0]["id"] == "k1" and chat[1] == {
        "role": "tool",
        "tool_call_id": "k1",
        "content": "free at 10",
    }
    assert chat[2] == {"role": "user", "content": "looks fine"}
    assert ctx.to_anthropic()["system"] == "be brief"
    assert_valid_everywhere(ctx)


def test_a_result_whose_call_cannot_be_rendered_is_left_out() -> None:
    # A call of a type no provider shape here can carry is kept for Responses; a result never appears alone.
    ctx = context(
        Episode("user", "x", metadata={"item": {"type": "function_call_output", "call_id": "gone", "output": "o"}}),
        Episode("user", "next"),
    )
    assert ctx.to_openai_chat() == [{"role": "user", "content": "next"}]
    assert ctx.to_openai_responses() == [{"role": "user", "content": "next"}]
    assert ctx.to_anthropic()["messages"] == [{"role": "user", "content": [{"type": "text", "text": "next"}]}]


@pytest.mark.anyio
async def test_every_read_of_a_tool_heavy_session_renders_to_a_valid_request(tmp_path) -> None:
    config = SessionConfig(max_episodes=5, max_chars=100_000)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = engine.session("s")
        for turn in range(12):
            calls = [f"t{turn}c{n}" for n in range(turn % 3 + 1)]
            call_message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls
                ],
            }
            await session.add(
                [
                    Episode("user", f"question {turn}"),
                    Episode("assistant", "calling", metadata={"message": call_message}),
                    *(
                        Episode(
                            "tool",
                            f"out {c}",
                            metadata={"message": {"role": "tool", "tool_call_id": c, "content": f"out {c}"}},
                        )
                        for c in calls
                    ),
                    Episode("assistant", f"answer {turn}"),
                ]
            )
            assert_valid_everywhere(await session.context())
        ctx = await session.context(wait_for_summary=True)
        assert ctx.summary is not None
        assert ctx.to_openai_chat()[0] == {"role": "system", "content": SUMMARY_PREFIX + ctx.summary}
        assert_valid_everywhere(ctx)


WEATHER_CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'}}


@pytest.mark.parametrize("where", ["top level", "message", "raw"])
def test_a_chat_message_in_metadata_renders_with_its_real_name_and_arguments(where: str) -> None:
    # The README's own example: the message at the top level of the metadata.
    call = {"role": "assistant", "tool_calls": [WEATHER_CALL]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}
    if where != "top level":
        call, result = {where: {**call, "content": "checking the weather"}}, {where: result}
    ctx = context(
        Episode("user", "Weather in Lisbon?"),
        Episode("assistant", "checking the weather", metadata=call),
        Episode("tool", '{"temp": 21}', metadata=result),
    )
    chat = ctx.to_openai_chat()
    assert chat[1] == {"role": "assistant", "content": "checking the weather", "tool_calls": [WEATHER_CALL]}
    assert chat[2] == {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}
    calls = [item for item in ctx.to_openai_responses() if item.get("type") == "function_call"]
    assert calls == [
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Lisbon"}'}
    ]
    uses = [b for m in ctx.to_anthropic()["messages"] for b in m["content"] if b["type"] == "tool_use"]
    assert uses == [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Lisbon"}}]
    assert_valid_everywhere(ctx)


def test_top_level_responses_items_and_anthropic_blocks_render_with_their_real_names() -> None:
    item = {"type": "function_call", "call_id": "c9", "name": "lookup", "arguments": '{"q": 1}'}
    output = {"type": "function_call_output", "call_id": "c9", "output": "found"}
    ctx = context(
        Episode("user", "find it"),
        Episode("assistant", "lookup", metadata={**item, "source": "my-agent"}),
        Episode("tool", "found", metadata=output),
    )
    assert ctx.to_openai_responses()[1:] == [item, output]
    assert ctx.to_openai_chat()[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": 1}'}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "x"}}]}
    answer = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "hit"}]}
    ctx = context(
        Episode("user", "search x"),
        Episode("assistant", "search", metadata=use),
        Episode("user", "hit", metadata=answer),
    )
    assert ctx.to_anthropic()["messages"][1:] == [use, answer]
    assert ctx.to_openai_chat()[1]["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}
    assert_valid_everywhere(ctx)


def chat_call(call_id: str, text: str = "") -> Episode:
    call = {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": '{"n": 1}'}}
    return Episode("assistant", text or f"calling {call_id}", metadata={"role": "assistant", "tool_calls": [call]})


def chat_result(call_id: str, output: str = "") -> Episode:
    output = output or f"result of {call_id}"
    return Episode("tool", output, metadata={"role": "tool", "tool_call_id": call_id})


def rendered_calls(ctx: Context) -> list[str]:
    return [call["id"] for message in ctx.to_openai_chat() for call in message.get("tool_calls", [])]


def test_a_call_whose_result_was_deleted_is_left_out_once_other_turns_follow() -> None:
    # Its result was deleted (or never came): the call is not shown followed by other turns.
    ctx = context(
        Episode("user", "Weather?"),
        chat_call("c1", "Let me check."),
        Episode("user", "Never mind."),
        Episode("assistant", "OK."),
    )
    assert rendered_calls(ctx) == []
    assert ctx.to_openai_chat()[1] == {"role": "assistant", "content": "Let me check."}
    assert not [item for item in ctx.to_openai_responses() if item.get("type") == "function_call"]
    assert_valid_everywhere(ctx)
    # While nothing follows it, the call is the request's last turn: its result is what comes next.
    waiting = context(Episode("user", "Weather?"), chat_call("c1"))
    assert rendered_calls(waiting) == ["c1"]
    assert_valid_everywhere(waiting)


def test_a_late_result_is_rendered_right_after_its_call() -> None:
    ctx = context(
        Episode("user", "Weather?"),
        chat_call("c1"),
        Episode("user", "Hurry up."),
        chat_result("c1", "sunny"),
        Episode("assistant", "Sunny."),
    )
    chat = ctx.to_openai_chat()
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "user", "assistant"]
    assert chat[2] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    anthropic = ctx.to_anthropic()["messages"]
    assert anthropic[2]["content"][0] == {"type": "tool_result", "tool_use_id": "c1", "content": "sunny"}
    assert anthropic[2]["content"][1] == {"type": "text", "text": "Hurry up."}
    responses = ctx.to_openai_responses()
    assert [item.get("type") for item in responses][2:4] == ["function_call", "function_call_output"]
    assert_valid_everywhere(ctx)


def test_reused_call_ids_pair_with_the_nearest_open_call() -> None:
    # A model that numbers calls per turn: call_0 every turn.
    ctx = context(
        Episode("user", "one"),
        chat_call("call_0"),
        chat_result("call_0", "first"),
        Episode("user", "two"),
        chat_call("call_0"),  # its result is late
        Episode("user", "three"),
        chat_result("call_0", "second"),
    )
    chat = ctx.to_openai_chat()
    assert [(m["role"], m.get("content")) for m in chat if m["role"] in ("tool", "user")] == [
        ("user", "one"),
        ("tool", "first"),
        ("user", "two"),
        ("tool", "second"),
        ("user", "three"),
    ]
    assert_valid_everywhere(ctx)
    # The first call_0 lost its result: the second one's result is not taken for it.
    ctx = context(
        Episode("user", "one"),
        chat_call("call_0"),
        Episode("user", "two"),
        chat_call("call_0"),
        chat_result("call_0", "second"),
    )
    assert rendered_calls(ctx) == ["call_0"]
    assert ctx.to_openai_chat()[-2:] == [
        {"role": "assistant", "content": "calling call_0", "tool_calls": ctx.to_openai_chat()[-2]["tool_calls"]},
        {"role": "tool", "tool_call_id": "call_0", "content": "second"},
    ]
    assert_valid_everywhere(ctx)


def test_a_message_renders_by_its_own_shape_whichever_key_holds_it() -> None:
    chat_message = {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]}
    item = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Lisbon"}'}
    for call in ({"item": chat_message}, {"message": item}):
        ctx = context(
            Episode("user", "Weather?"),
            Episode("assistant", None, metadata=call),  # type: ignore[arg-type]
            chat_result("call_1", "sunny"),
        )
        assert ctx.to_openai_chat()[1]["tool_calls"] == [WEATHER_CALL]
        assert ctx.to_openai_chat()[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        assert_valid_everywhere(ctx)


def test_a_reasoning_item_is_left_out_with_the_call_it_preceded() -> None:
    # A reasoning model's turn: reasoning, then its call. The call's output was deleted and the
    # conversation went on, so the call is left out; the reasoning before it must go with it: the
    # Responses API refuses a reasoning item without its following item.
    episodes = agent_episodes()
    del episodes[3]  # the function_call_output
    ctx = context(*episodes)
    items = ctx.to_openai_responses()
    assert [item.get("type") or item["role"] for item in items] == ["user", "message"]
    assert_valid_everywhere(ctx)
    # Kept while the call is the last turn (its output may still come), and when it is answered.
    waiting = context(*agent_episodes()[:3])
    assert [item.get("type") or item["role"] for item in waiting.to_openai_responses()] == [
        "user",
        "reasoning",
        "function_call",
    ]
    assert len(context(*agent_episodes()).to_openai_responses()) == len(AGENT_ITEMS)


def reasoning_turn(turn: int) -> list[Episode]:
    """A reasoning model's turn as MemEngineSession stores it: question, reasoning, call, output, answer."""
    call_id = f"call_{turn}"
    items = [
        {"role": "user", "content": f"question {turn}"},
        {"type": "reasoning", "id": f"rs_{turn}", "summary": []},
        {"type": "function_call", "id": f"fc_{turn}", "call_id": call_id, "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": f"out {turn}"},
        {"type": "reasoning", "id": f"rs_{turn}b", "summary": []},
        {"type": "message", "id": f"msg_{turn}", "role": "assistant", "content": f"answer {turn}"},
    ]
    return [
        Episode(
            item.get("role") or item["type"], f"item {turn}.{n}", metadata={"openai_agents.item": item, **_links(item)}
        )
        for n, item in enumerate(items)
    ]


def assert_calls_keep_their_reasoning(items: list[dict[str, Any]]) -> None:
    """Each call and answer is right after its reasoning item (its id's turn), and each reasoning item before it."""
    for before, item in itertools.pairwise(items):
        if item.get("type") in ("function_call", "message"):
            reasoning = item["id"].replace("fc_", "rs_").replace("msg_", "rs_") + (
                "b" if item["type"] == "message" else ""
            )
            assert before.get("id") == reasoning, f"{item['id']} without its reasoning: {items}"
        if before.get("type") == "reasoning":
            assert item.get("type") in ("function_call", "message"), f"{before['id']} without its item: {items}"
    assert items[0].get("type") not in ("function_call", "message"), f"{items[0]['id']} without its reasoning: {items}"


@pytest.mark.anyio
async def test_a_call_or_answer_is_never_shown_without_the_reasoning_item_before_it(store_url) -> None:
    # The Responses API refuses a function_call or message without the reasoning item that preceded it
    # (400, "provided without its required 'reasoning' item"), and a reasoning item without the item
    # after it: neither the window nor a summary parts them.
    for max_episodes in (2, 3, 4, 5, 6, 7):
        config = SessionConfig(max_episodes=max_episodes, evict_to=0.5, max_chars=100_000)
        session_id = f"s{max_episodes}"
        async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
            session = engine.session(session_id)
            for turn in range(6):
                for episode in reasoning_turn(turn):
                    await session.add([episode])
                    assert_calls_keep_their_reasoning((await session.context()).to_openai_responses())
                assert_calls_keep_their_reasoning((await session.context(wait_for_summary=True)).to_openai_responses())
        async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
            assert_calls_keep_their_reasoning((await engine.session(session_id).context()).to_openai_responses())


def test_a_reasoning_item_whose_following_item_was_deleted_is_left_out() -> None:
    # [question, reasoning, answer]: the answer was deleted (or popped) and a new question followed.
    # The reasoning item would be followed by a user message, which the API refuses (400, "provided
    # without its required following item"); nor may a request end with one.
    turn = reasoning_turn(0)
    question, reasoning, answer = turn[0], turn[4], turn[5]
    followed_by_user = context(question, reasoning, Episode("user", "Another question"))
    assert [item.get("type") or item["role"] for item in followed_by_user.to_openai_responses()] == ["user", "user"]
    assert_valid_everywhere(followed_by_user)
    assert [item.get("type") or item["role"] for item in context(question, reasoning).to_openai_responses()] == ["user"]
    kept = context(question, reasoning, answer).to_openai_responses()
    assert [item.get("type") or item["role"] for item in kept] == ["user", "reasoning", "message"]
