"""Tool calls after edits, through the engine on both stores: a deleted result, reused ids."""

from __future__ import annotations

import pytest

from memengine import Episode, SessionConfig, open_engine

from .test_rendering import assert_valid_everywhere, chat_call, chat_result

pytestmark = pytest.mark.anyio


def window_of(context) -> list[Episode]:
    return [episode for episode in context.episodes if episode.seq > context.evicted_through]


async def test_a_call_whose_result_was_deleted_neither_shows_nor_holds_the_window(store_url) -> None:
    config = SessionConfig(max_episodes=4, max_chars=10**6, evict_to=0.5)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        stored = await session.add(
            [Episode("user", "Weather?"), chat_call("c1"), chat_result("c1"), Episode("assistant", "Sunny.")]
        )
        assert await session.delete_episodes([stored[2].seq]) == 1
        context = await session.context()
        assert_valid_everywhere(context)
        for turn in range(6):
            await session.add([Episode("user", f"turn {turn}")])
            context = await session.context()
            assert len(window_of(context)) <= 4, "the call counts as waiting for its result again"
            assert_valid_everywhere(context)
    # Loaded again (a restart): the deleted result is still not waited for.
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        for turn in range(6, 12):
            await session.add([Episode("user", f"turn {turn}")])
            context = await session.context()
            assert len(window_of(context)) <= 4
            assert_valid_everywhere(context)


async def test_the_newest_episode_a_result_deleted_its_call_holds_no_window(store_url) -> None:
    config = SessionConfig(max_episodes=4, max_chars=10**6, evict_to=0.5)
    async with open_engine(store_url, config=config) as engine:
        session = engine.session("s")
        stored = await session.add([Episode("user", "Weather?"), chat_call("c1"), chat_result("c1")])
        assert await session.delete_episodes([stored[2].seq]) == 1
        for turn in range(6):
            await session.add([Episode("user", f"turn {turn}")])
            context = await session.context()
            assert len(window_of(context)) <= 4, "the call counts as waiting for its result again"
            assert_valid_everywhere(context)


CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'}}


async def test_a_message_that_is_only_a_tool_call_needs_no_text(store_url) -> None:
    # Providers send content: null with tool_calls; the episode takes it as it comes.
    message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    episodes = [
        Episode("user", "Weather in Lisbon?"),
        Episode("assistant", None, metadata=message),  # type: ignore[arg-type]
        Episode("assistant", "", metadata={"message": message}),
        Episode("tool", "sunny", metadata={"role": "tool", "tool_call_id": "call_1"}),
    ]
    async with open_engine(store_url) as engine:
        await engine.session("s").add(episodes[:2] + episodes[3:])
    async with open_engine(store_url) as engine:  # read back from the store
        context = await engine.session("s").context()
    assert [episode.content for episode in context.episodes] == ["Weather in Lisbon?", "", "sunny"]
    assert context.to_openai_chat()[1] == message
    assert_valid_everywhere(context)


def test_empty_content_is_still_refused_where_nothing_else_carries_the_message() -> None:
    with pytest.raises(TypeError, match=r"Episode\.content must be a str"):
        Episode("assistant", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Episode\.content must be a non-empty string"):
        Episode("assistant", "")
    with pytest.raises(ValueError, match=r"Episode\.content must be a non-empty string"):
        Episode("assistant", "  ", metadata={"role": "assistant", "note": "no tool call here"})
    with pytest.raises(TypeError, match=r"Episode\.content must be a str"):
        Episode("assistant", 42, metadata={"role": "assistant", "tool_calls": [CALL]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        Episode("assistant", "\x00", metadata={"role": "assistant", "tool_calls": [CALL]})
