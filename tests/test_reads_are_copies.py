"""What a session hands out is the caller's own: editing it changes nothing the session reads later."""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import GatedSummarizer

pytestmark = pytest.mark.anyio


def tool_call() -> Episode:
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lisbon"}'}}
    return Episode("assistant", "checking", metadata={"role": "assistant", "tool_calls": [call], "tags": ["a"]})


async def test_editing_what_context_returned_changes_no_later_read(db_path) -> None:
    async with open_engine(db_path, config=SessionConfig(max_episodes=50)) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "hello"), tool_call()])
        first = await session.context()
        expected = [(e.seq, e.content, e.metadata) for e in (await engine.session("s").context()).episodes]
        plain, called = first.episodes
        plain.metadata["injected"] = True  # an empty metadata dict, filled in
        called.metadata["tags"].append("b")  # a list inside
        called.metadata["tool_calls"][0]["function"]["name"] = "other"  # a dict inside a list
        del called.metadata["role"]
        again = await session.context()
    assert [(e.seq, e.content, e.metadata) for e in again.episodes] == expected
    assert expected[1][2]["tool_calls"][0]["function"]["name"] == "weather"


async def test_editing_what_add_returned_or_was_given_changes_no_later_read(db_path) -> None:
    async with open_engine(db_path, config=SessionConfig(max_episodes=50)) as engine:
        session = engine.session("s")
        given = [Episode("user", "hello"), tool_call()]
        stored = await session.add(given)
        for episode in (*given, *stored):
            episode.metadata["injected"] = True
        stored[1].metadata["tags"].append("b")
        context = await session.context()
    assert [e.metadata for e in context.episodes] == [{}, tool_call().metadata]


async def test_readers_answered_together_each_get_their_own_copy(db_path) -> None:
    summarizer = GatedSummarizer()
    async with open_engine(db_path, summarizer=summarizer, config=SessionConfig(max_episodes=2)) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "zero"), Episode("user", "one"), Episode("user", "two")])
        await summarizer.wait_until_called()
        contexts = []

        async def read() -> None:
            contexts.append(await session.context(wait_for_summary=True))

        async with anyio.create_task_group() as readers:
            for _ in range(2):  # both wait for the same summary: one read of the session answers them
                readers.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            summarizer.release()
        contexts[0].episodes[-1].metadata["injected"] = True
    assert contexts[1].episodes[-1].metadata == {}


async def test_a_summarizer_editing_its_batch_changes_no_later_read(db_path) -> None:
    class Meddling:
        def __init__(self) -> None:
            self.edited = anyio.Event()
            self.release = anyio.Event()

        async def summarize(self, previous, episodes) -> str:
            for episode in episodes:
                episode.metadata["summarized"] = True
            self.edited.set()
            await self.release.wait()
            return "summary"

    summarizer = Meddling()
    async with open_engine(db_path, summarizer=summarizer, config=SessionConfig(max_episodes=2)) as engine:
        session = engine.session("s")
        await session.add([Episode("user", f"turn {n}", metadata={"n": n}) for n in range(4)])
        await summarizer.edited.wait()
        context = await session.context()  # the evicted episodes are still shown raw
        summarizer.release.set()
    assert context.evicted_through > 0
    assert [episode.metadata for episode in context.episodes] == [{"n": n} for n in range(4)]
