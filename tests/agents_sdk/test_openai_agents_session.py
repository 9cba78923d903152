"""MemEngineSession as an agent's memory: what Runner.run sends the model, and what the session keeps."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from agents import Agent, Runner, SQLiteSession, function_tool
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from memengine import SessionConfig, open_engine
from memengine.integrations.openai_agents import ITEM_IN_CONTENT_KEY, SUMMARY_PREFIX, MemEngineSession
from memengine.tool_calls import CALLS_KEY, RESULT_OF_KEY
from tests.fakes import GatedSummarizer, RecordingSink
from tests.test_rendering_properties import containers

pytestmark = pytest.mark.anyio

BIG = SessionConfig(max_episodes=10_000, max_chars=10_000_000)

# One of every item shape a session sees, and two it has never heard of.
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "And this picture?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
        ],
    },
    {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "The user wants the weather."}],
        "encrypted_content": "gAAAA...",
    },
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Lisbon"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24\u00b0C"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "output": [{"type": "input_text", "text": "a list output"}],
    },
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "It is sunny in Lisbon. \u2600\ufe0f", "annotations": [], "logprobs": []},
            {"type": "refusal", "refusal": "I won't describe that picture."},
        ],
    },
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"},
    {"type": "future_item", "nested": {"a": [1, 2.5, None, True], "b": {}}, "empty": []},
    {"role": "developer", "content": "   "},  # no readable text at all
]


def weather_tool_calls_paired(items: list[Any]) -> None:
    """Fail unless every function call in ``items`` has its output and every output its call."""
    calls = [item.get("call_id") for item in items if isinstance(item, dict) and item.get("type") == "function_call"]
    outputs = [
        item.get("call_id") for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert sorted(calls) == sorted(outputs), f"orphaned tool calls or outputs in {items}"
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            assert calls.index(item["call_id"]) >= 0


async def test_it_is_a_session_of_the_sdk(tmp_path: Path) -> None:
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "alice", session_settings={"limit": 3})
        assert isinstance(session, Session)
        assert session.session_id == "alice"
        assert session.session_settings == SessionSettings(limit=3)
        assert MemEngineSession(engine, "bob").session_settings == SessionSettings()


async def test_every_item_comes_back_json_equal_in_order(tmp_path: Path) -> None:
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        await MemEngineSession(engine, "s").add_items(ITEMS)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:  # and from the store, after a restart
        # All but the output whose call was never added: the model would refuse it.
        assert await MemEngineSession(engine, "s").get_items() == [i for i in ITEMS if i.get("call_id") != "call_2"]
        contents = [episode.content for episode in (await engine.session("s").context()).episodes]
    # The summarizer and recall read the items' words, not their JSON.
    assert contents[:5] == [
        "What is the weather in Lisbon?",
        "And this picture?",
        "The user wants the weather.",
        'weather({"city": "Lisbon"})',
        "sunny, 24\u00b0C",
    ]


async def test_an_item_too_large_for_metadata_is_kept_whole_and_still_paired(tmp_path: Path) -> None:
    config = SessionConfig(max_episodes=10_000, max_chars=10_000_000, max_metadata_bytes=1024)
    call = {"type": "function_call", "id": "fc_9", "call_id": "call_9", "name": "fetch", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_9", "output": "page text " * 2000}
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([call, output])
        assert await session.get_items() == [call, output]
        stored = (await engine.session("s").context()).episodes
    assert stored[1].metadata == {RESULT_OF_KEY: ["call_9"], ITEM_IN_CONTENT_KEY: True}
    assert json.loads(stored[1].content) == output
    assert stored[0].metadata[CALLS_KEY] == ["call_9"]


async def test_items_added_again_in_a_later_call_are_stored_again_as_the_sdk_sessions_do(tmp_path: Path) -> None:
    # The SDK's sessions store what each add_items is given; so does this one, items with ids included.
    turn = [ITEMS[2], ITEMS[6], ITEMS[7], {"role": "user", "content": "hello"}]
    sdk_session = SQLiteSession("s", tmp_path / "sdk.db")
    await sdk_session.add_items(turn)
    await sdk_session.add_items(turn)
    sdk_items = await sdk_session.get_items()
    sdk_session.close()
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(turn)
        await session.add_items(turn)
        stored = await session.get_items()
    assert stored == sdk_items == turn + turn
    assert [list(item) for item in stored[:4]] == [list(item) for item in turn]  # keys in their order


async def test_a_model_that_answers_twice_the_same_has_both_answers_in_the_history(tmp_path: Path) -> None:
    # The SDK's own test model gives every message the id "scripted-message": two same answers, one id.
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        for _ in range(2):
            model.enqueue([assistant_message("OK")])
            await Runner.run(agent, "Say OK", session=session)
        model.enqueue([assistant_message("done")])
        await Runner.run(agent, "Anything else?", session=session)
    sent = [item.get("role") for item in model.calls[-1].input]
    assert sent == ["user", "assistant", "user", "assistant", "user"]


async def test_different_items_that_share_an_id_are_all_kept(tmp_path: Path) -> None:
    # Chat Completions models give every item the SDK's placeholder id; test models repeat theirs.
    placeholder = [
        {"type": "message", "id": "__fake_id__", "role": "assistant", "content": [{"type": "output_text", "text": t}]}
        for t in ("yes", "yes", "no")
    ]
    repeated = [{"type": "message", "id": "1", "role": "assistant", "content": t} for t in ("a", "b")]
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(placeholder + repeated)
        assert await session.get_items() == placeholder + repeated


async def test_items_that_are_not_json_are_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        with pytest.raises(ValueError, match="JSON"):
            await session.add_items([{"role": "user", "content": "ok"}, {"role": "user", "content": float("nan")}])
        with pytest.raises(TypeError):
            await session.add_items([{"role": "user", "content": "ok"}, "not a dict"])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            await session.add_items({"role": "user", "content": "a dict, not a list"})  # type: ignore[arg-type]
        assert await session.get_items() == []


async def test_an_item_that_is_not_json_serializable_raises_type_error_as_the_sdk_sessions_do(tmp_path: Path) -> None:
    # The SDK's own tests expect TypeError (what json.dumps raises): the SDK's SQLiteSession, side by side.
    unserializable = {"role": "user", "content": object()}
    sdk_session = SQLiteSession("s", tmp_path / "sdk.db")
    with pytest.raises(TypeError):
        await sdk_session.add_items([unserializable])  # type: ignore[list-item]
    sdk_session.close()
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        with pytest.raises(TypeError, match="JSON"):
            await session.add_items([{"role": "user", "content": "ok"}, unserializable])  # type: ignore[list-item]
        assert await session.get_items() == []
        # The session stays usable after the failure.
        await session.add_items([{"role": "user", "content": "after failure"}])
        assert await session.get_items() == [{"role": "user", "content": "after failure"}]


REFUSED_THOUGH_THE_SDK_ACCEPTS = {
    # What the SDK's sessions store without a word, and why MemEngineSession refuses it (module docstring).
    "an empty session id": ("", [{"role": "user", "content": "hi"}], ValueError),
    "NaN": ("s", [{"role": "user", "content": "x", "score": float("nan")}], ValueError),
    "infinity": ("s", [{"role": "user", "content": "x", "score": float("inf")}], ValueError),
    "an item that is not a dict": ("s", ["just a string"], TypeError),
    "a dict for the list of items": ("s", {"role": "user", "content": "hi"}, TypeError),
    # Half of a UTF-16 pair on its own (a bad decode, a string cut mid-emoji): not Unicode text either store keeps.
    "a lone surrogate in the text": ("s", [{"role": "user", "content": "cut \ud83d here"}], ValueError),
    "a lone surrogate deep in an item": (
        "s",
        [{"type": "function_call", "name": "f", "arguments": '{"city": "\udc00"}', "call_id": "c1"}],
        ValueError,
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_THOUGH_THE_SDK_ACCEPTS))
async def test_what_the_sdk_sessions_accept_and_memengine_refuses(tmp_path: Path, case: str) -> None:
    session_id, items, error = REFUSED_THOUGH_THE_SDK_ACCEPTS[case]
    sdk_session = SQLiteSession(session_id, tmp_path / "sdk.db")
    await sdk_session.add_items(items)  # stored without a word
    assert await sdk_session.get_items() != []
    sdk_session.close()
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        with pytest.raises(error) as refused:
            session = MemEngineSession(engine, session_id)
            await session.add_items(items)
        assert await MemEngineSession(engine, "s").get_items() == []
    if "surrogate" in case:  # said in the session's words, not the codec's
        assert type(refused.value) is ValueError and "surrogate" in str(refused.value), refused.value


async def test_a_multi_turn_conversation_reaches_the_model_in_order(tmp_path: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "alice")
        for turn in range(1, 4):
            model.enqueue([assistant_message(f"answer {turn}", item_id=f"msg_{turn}")])
            result = await Runner.run(agent, f"question {turn}", session=session)
            assert result.final_output == f"answer {turn}"
        texts = [_text(item) for item in model.calls[-1].input]
        assert texts == ["question 1", "answer 1", "question 2", "answer 2", "question 3"]
        assert [_text(item) for item in await session.get_items()] == [*texts, "answer 3"]


async def test_twelve_tool_turns_in_a_small_window_never_orphan_a_call_and_bring_the_summary(tmp_path: Path) -> None:
    lookups: list[str] = []

    @function_tool
    def lookup(city: str) -> str:
        """The weather in a city."""
        lookups.append(city)
        return f"sunny in {city}"

    model = ScriptedModel()
    agent = Agent(name="assistant", model=model, tools=[lookup])
    # evict_to=1.0: every add evicts just what overflows, so the window's edge passes every position in a turn.
    config = SessionConfig(max_episodes=6, max_chars=100_000, evict_to=1.0)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "alice")
        for turn in range(1, 13):
            if turn == 12:  # make the summary of everything evicted so far certain before the last turn
                summary = (await engine.session("alice").context(wait_for_summary=True)).summary
            model.enqueue([function_call("lookup", {"city": f"city{turn}"}, call_id=f"call_{turn}")])
            model.enqueue([assistant_message(f"It is sunny in city{turn}.", item_id=f"msg_{turn}")])
            result = await Runner.run(agent, f"Weather in city{turn}?", session=session)
            assert result.final_output == f"It is sunny in city{turn}."

    assert lookups == [f"city{turn}" for turn in range(1, 13)]
    assert len(model.calls) == 24
    for call in model.calls:
        weather_tool_calls_paired(list(call.input))
    last_input = list(model.calls[-1].input)
    # Everything evicted was summarized before turn 12: the summary, the window, this turn's input, call and output.
    assert len(last_input) <= 1 + 6 + 3
    assert summary is not None
    assert last_input[0] == {"role": "system", "content": SUMMARY_PREFIX + summary}
    assert "city1" in summary
    assert [item.get("type") for item in last_input[-2:]] == ["function_call", "function_call_output"]
    assert last_input[-1]["output"] == "sunny in city12"


async def test_the_conversation_survives_a_restart_between_turns(tmp_path: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        model.enqueue([assistant_message("Nice to meet you, Ana.", item_id="msg_1")])
        await Runner.run(agent, "I am Ana.", session=MemEngineSession(engine, "ana"))
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        model.enqueue([assistant_message("You are Ana.", item_id="msg_2")])
        await Runner.run(agent, "Who am I?", session=MemEngineSession(engine, "ana"))
    assert [_text(item) for item in model.calls[-1].input] == ["I am Ana.", "Nice to meet you, Ana.", "Who am I?"]


async def test_pop_item_is_durable_and_concurrent_pops_take_different_items(tmp_path: Path) -> None:
    items = [{"role": "user", "content": f"message {n}"} for n in range(5)]
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(items)
        assert await session.pop_item() == items[4]
        popped = await asyncio.gather(session.pop_item(), session.pop_item())
        assert sorted(_text(item) for item in popped) == ["message 2", "message 3"]
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        assert await session.get_items() == items[:2]
        assert await session.pop_item() == items[1]
        assert await session.pop_item() == items[0]
        assert await session.pop_item() is None


async def test_a_popped_turn_is_not_sent_to_the_model(tmp_path: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        model.enqueue([assistant_message("Paris.", item_id="msg_1")])
        await Runner.run(agent, "Capital of France?", session=session)
        assert _text(await session.pop_item()) == "Paris."
        assert _text(await session.pop_item()) == "Capital of France?"
        model.enqueue([assistant_message("Rome.", item_id="msg_2")])
        await Runner.run(agent, "Capital of Italy?", session=session)
    assert [_text(item) for item in model.calls[-1].input] == ["Capital of Italy?"]


async def test_clear_session_leaves_no_summary_no_recall_hit_and_no_retain_batch(tmp_path: Path) -> None:
    sink = RecordingSink()
    config = SessionConfig(max_episodes=4, max_chars=100_000, retain_every=1000)
    async with open_engine(tmp_path / "m.db", config=config, retain_sink=sink) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([{"role": "user", "content": f"zanzibar fact {n}"} for n in range(10)])
        await engine.session("s").context(wait_for_summary=True)
        assert (await session.get_items())[0]["role"] == "system"  # a summary exists before the clear
        await session.clear_session()
        assert await session.get_items() == []
        assert await engine.recall("zanzibar", session_id="s") == []
        await session.add_items([{"role": "user", "content": "after the clear"}])
    assert sink.delivered_contents() == ["after the clear"]
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        assert await MemEngineSession(engine, "s").get_items() == [{"role": "user", "content": "after the clear"}]


async def test_limit_returns_the_latest_raw_items_without_the_summary(tmp_path: Path) -> None:
    items = [{"role": "user", "content": f"fact number {n} about owls."} for n in range(10)]
    config = SessionConfig(max_episodes=4, max_chars=100_000)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(items)
        await engine.session("s").context(wait_for_summary=True)
        everything = await session.get_items()
        assert everything[0]["role"] == "system" and everything[0]["content"].startswith(SUMMARY_PREFIX)
        raw = everything[1:]
        assert raw == items[-len(raw) :]
        assert await session.get_items(limit=2) == items[-2:]
        assert await session.get_items(limit=0) == []
        assert await MemEngineSession(engine, "s", session_settings=SessionSettings(limit=1)).get_items() == items[-1:]


async def test_25_agents_at_once_each_remember_their_own_conversation(tmp_path: Path) -> None:
    models = [ScriptedModel() for _ in range(25)]

    async def converse(n: int, engine: Any) -> None:
        agent = Agent(name=f"agent {n}", model=models[n])
        session = MemEngineSession(engine, f"user-{n}")
        for turn in (1, 2):
            models[n].enqueue([assistant_message(f"reply {turn} to {n}", item_id=f"msg_{n}_{turn}")])
            await Runner.run(agent, f"turn {turn} from {n}", session=session)

    async with open_engine(tmp_path / "m.db", config=BIG) as engine, anyio.create_task_group() as tasks:
        for n in range(25):
            tasks.start_soon(converse, n, engine)
    for n, model in enumerate(models):
        assert [_text(item) for item in model.calls[-1].input] == [
            f"turn 1 from {n}",
            f"reply 1 to {n}",
            f"turn 2 from {n}",
        ]


async def test_two_runs_on_one_session_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)
    model.enqueue([assistant_message("reply", item_id="msg_a")])
    model.enqueue([assistant_message("reply", item_id="msg_b")])
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "shared")
        await asyncio.gather(Runner.run(agent, "first", session=session), Runner.run(agent, "second", session=session))
        stored = await session.get_items()
    assert sorted(_text(item) for item in stored) == ["first", "reply", "reply", "second"]
    assert sorted(item.get("id", "") for item in stored) == ["", "", "msg_a", "msg_b"]


async def test_an_add_cancelled_while_waiting_for_its_answer_is_still_stored(tmp_path: Path) -> None:
    items = [{"role": "user", "content": "kept"}]
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        task = asyncio.ensure_future(session.add_items(items))
        await asyncio.sleep(0)  # the add has been sent and waits for its answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        later = {"role": "user", "content": "later"}
        await session.add_items([later])  # stored after the cancelled add, so that one is stored by now
        assert await session.get_items() == [*items, later]


async def test_runner_run_sync_works_with_the_engine_behind_a_portal(tmp_path: Path) -> None:
    # Runner.run_sync runs its own event loop; the engine runs in a thread of its own.
    model = ScriptedModel()
    agent = Agent(name="assistant", model=model)

    def main() -> None:
        with (
            anyio.from_thread.start_blocking_portal("asyncio") as portal,
            portal.wrap_async_context_manager(open_engine(tmp_path / "m.db", config=BIG)) as engine,
        ):
            session = MemEngineSession(engine, "sync", portal=portal)
            for turn in (1, 2):
                model.enqueue([assistant_message(f"reply {turn}", item_id=f"msg_{turn}")])
                loop = asyncio.new_event_loop()
                asyncio.set_event_loop(loop)
                try:
                    Runner.run_sync(agent, f"turn {turn}", session=session)
                finally:
                    asyncio.set_event_loop(None)
                    loop.close()

    await anyio.to_thread.run_sync(main)
    assert [_text(item) for item in model.calls[-1].input] == ["turn 1", "reply 1", "turn 2"]


def _text(item: Any) -> str:
    content = item.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return content


def test_import_memengine_does_not_import_the_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, memengine; assert 'agents' not in sys.modules, 'memengine imported the SDK'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_get_items_leaves_out_an_output_whose_call_is_gone(tmp_path: Path) -> None:
    # The call was popped (the run was retried); its output still came. The output left the window at
    # once and shows raw until its summary is stored: the summarizer is held, so it stays shown.
    summarizer = GatedSummarizer()
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    question = {"role": "user", "content": "Weather?"}
    async with open_engine(tmp_path / "m.db", summarizer=summarizer, config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([question, call])
        assert await session.pop_item() == call
        await session.add_items([output, {"role": "user", "content": "Thanks."}])
        await summarizer.wait_until_called()
        shown = (await engine.session("s").context()).episodes
        assert output in [episode.metadata.get("openai_agents.item") for episode in shown]  # still shown raw
        assert await session.get_items() == [question, {"role": "user", "content": "Thanks."}]
        assert await session.get_items(limit=1) == [{"role": "user", "content": "Thanks."}]
        summarizer.release()


async def test_get_items_returns_fresh_copies(tmp_path: Path) -> None:
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(ITEMS[:5])
        items = await session.get_items()
        expected = json.loads(json.dumps(items))
        items[0]["content"] = "edited"
        items[1]["content"][0]["text"] = "edited"
        items.append({"role": "user", "content": "appended"})
        assert await session.get_items() == expected
        (await session.get_items(limit=2))[0]["output"] = "edited"
        assert await session.get_items() == expected
        popped = await session.pop_item()
        assert popped == expected[-1]
        popped["output"] = "edited"
        await session.add_items([ITEMS[4]])
        assert await session.get_items() == expected


@pytest.mark.parametrize("limit", [None, 3])
async def test_get_items_shares_no_dict_or_list_with_what_the_session_holds(tmp_path: Path, limit: int | None) -> None:
    """Not one container of what get_items returns is the session's own, for every item shape, large items too.

    (Rendered from the session's episodes without copying them first: what the rendering returns must be built anew.)
    """
    config = SessionConfig(max_episodes=10_000, max_chars=10_000_000, max_metadata_bytes=400)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(ITEMS)  # a few are larger than 400 bytes: kept as JSON in the content
        items = await session.get_items(limit)
        assert items
        held = engine._actors["s"]._window.raw  # the session's own episodes
        own = {id(container) for episode in held for container in containers(episode.metadata)}
        assert not [container for container in containers(items) if id(container) in own]


async def test_get_items_leaves_out_the_reasoning_before_a_call_it_leaves_out(tmp_path: Path) -> None:
    # A reasoning model's turn (reasoning, then its call); the call's output was deleted and the
    # conversation went on. The call is left out, and its reasoning with it: the Responses API refuses
    # a reasoning item without the item that followed it ("provided without its required following item").
    question = {"role": "user", "content": "Weather?"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    answer = {"role": "user", "content": "Never mind."}
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([question, reasoning, call])
        assert await session.get_items() == [question, reasoning, call]  # its output may still come
        await session.add_items([output, answer])
        assert await session.get_items() == [question, reasoning, call, output, answer]
        assert await engine.session("s").delete_episodes([4]) == 1  # the output
        assert await session.get_items() == [question, answer]


async def test_items_edited_after_add_items_change_nothing_stored_or_read(tmp_path: Path) -> None:
    items = json.loads(json.dumps([*ITEMS[:5], ITEMS[6]]))
    expected = json.loads(json.dumps(items))
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(items)
        items[0]["content"] = "edited"
        items[1]["content"][0]["text"] = "edited"
        items[5]["content"].append({"type": "output_text", "text": "appended"})
        assert await session.get_items() == expected
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        assert await MemEngineSession(engine, "s").get_items() == expected


@pytest.mark.parametrize("over", [0, 1])
async def test_an_item_exactly_at_the_metadata_limit_stays_in_metadata_one_byte_more_goes_to_content(
    tmp_path: Path, over: int
) -> None:
    limit = 1024
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": ""}
    links_and_item = {CALLS_KEY: ["call_1"], "openai_agents.item": call}
    call["arguments"] = "\u00e9" * ((limit - len(json.dumps(links_and_item, ensure_ascii=False).encode())) // 2)
    if len(json.dumps(links_and_item, ensure_ascii=False).encode()) < limit:
        call["arguments"] += "a"
    call["arguments"] += "a" * over
    assert len(json.dumps(links_and_item, ensure_ascii=False).encode()) == limit + over
    config = SessionConfig(max_episodes=10_000, max_chars=10_000_000, max_metadata_bytes=limit)
    async with open_engine(tmp_path / "m.db", config=config) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items([call])
        assert await session.get_items() == [call]
        (stored,) = (await engine.session("s").context()).episodes
    if over:
        assert stored.metadata == {CALLS_KEY: ["call_1"], ITEM_IN_CONTENT_KEY: True}
        assert json.loads(stored.content) == call
    else:
        assert stored.metadata == links_and_item


async def test_the_stored_metadata_of_every_item_is_its_metadatas_own_json(tmp_path: Path) -> None:
    """What the store keeps for an item is exactly the JSON of the episode's metadata (made once, on the loop).

    The adapter writes each item's JSON once and hands the store the metadata's
    text built around it; it must be the text ``encode_json`` makes of that
    metadata, byte for byte, and load back to it: the item, its tool links.
    """
    import sqlite3

    from memengine.episode import encode_json
    from memengine.integrations.openai_agents import ITEM_KEY

    unicode = {"role": "user", "content": "naïve café — 你好, Привет 🌍", "note": {"ключ": ["é", 1e-07, 10**20]}}
    large = {"type": "function_call_output", "call_id": "call_9", "output": "x" * 20_000}  # goes to the content
    items = [*ITEMS, unicode, large]
    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        session = MemEngineSession(engine, "s")
        await session.add_items(items[:3])
        await session.add_items(items[3:])
        held = (await engine.session("s").context()).episodes
    with sqlite3.connect(tmp_path / "m.db") as conn:
        stored = [row[0] for row in conn.execute("SELECT metadata FROM episodes ORDER BY seq")]
    assert len(stored) == len(items) == len(held)
    for text, episode, item in zip(stored, held, items, strict=True):
        assert text == encode_json(episode.metadata)
        metadata = json.loads(text)
        if item is large:
            assert metadata.get(ITEM_IN_CONTENT_KEY) is True and json.loads(episode.content) == item
        else:
            assert metadata[ITEM_KEY] == item
    assert json.loads(stored[3])[CALLS_KEY] == ["call_1"]  # (ITEMS[3] is the call, ITEMS[4] its output)
    assert json.loads(stored[4])[RESULT_OF_KEY] == ["call_1"]


async def test_adds_of_the_adapter_and_plain_adds_stored_by_one_commit_keep_each_ones_metadata(tmp_path: Path) -> None:
    """Adds queued behind one in flight go to the store as one append (add_batch.py), some with their JSON made."""
    import sqlite3

    from memengine import Episode
    from memengine.episode import encode_json

    async with open_engine(tmp_path / "m.db", config=BIG) as engine:
        adapter, plain = MemEngineSession(engine, "s"), engine.session("s")
        await plain.context()  # activated: the adds below only queue behind each other
        commits: list[str] = []
        engine.store._conn.set_trace_callback(lambda s: commits.append(s) if s == "COMMIT" else None)  # type: ignore[attr-defined]
        async with anyio.create_task_group() as writers:
            for n in range(24):
                if n % 2:
                    writers.start_soon(plain.add, [Episode("user", f"plain {n}", metadata={"n": n, "ü": ["ß"]})])
                else:
                    writers.start_soon(adapter.add_items, [{"role": "user", "content": f"item {n}", "n": n}])
        engine.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    assert len(commits) < 24  # some adds shared a commit
    with sqlite3.connect(tmp_path / "m.db") as conn:
        rows = conn.execute("SELECT content, metadata FROM episodes ORDER BY seq").fetchall()
    assert len(rows) == 24
    for content, text in rows:
        metadata = json.loads(text)
        assert text == encode_json(metadata)
        if content.startswith("plain"):
            assert metadata == {"n": int(content.split()[1]), "ü": ["ß"]}
        else:
            assert metadata["openai_agents.item"] == {"role": "user", "content": content, "n": int(content.split()[1])}
