"""The OpenAI-compatible adapter, driven through a recording fake client."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import anyio
import pytest

from memengine import Episode, OpenAISummarizer, SessionConfig, open_engine

from .fakes import add_each, turns


class FakeChatClient:
    """Duck-types ``AsyncOpenAI().chat.completions.create`` and records each request."""

    def __init__(self, *answers: str | None) -> None:
        self.requests: list[dict] = []
        self._answers = list(answers)
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, **request):
        self.requests.append(request)
        answer = self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=answer))])


@pytest.mark.anyio
async def test_request_carries_previous_summary_and_turns() -> None:
    client = FakeChatClient("  Hannah moved to Lisbon.  ")
    summarizer = OpenAISummarizer("small-model", client=client, max_words=50)
    summary = await summarizer.summarize(
        "Hannah lives in Manchester.", [Episode("user", "I moved to Lisbon"), Episode("assistant", "Welcome!")]
    )
    assert summary == "Hannah moved to Lisbon."
    (request,) = client.requests
    assert request["model"] == "small-model"
    assert request["temperature"] == 0.0
    system, user = request["messages"]
    assert system["role"] == "system" and "50 words" in system["content"]
    assert user["role"] == "user"
    assert "Hannah lives in Manchester." in user["content"]
    assert "user: I moved to Lisbon\nassistant: Welcome!" in user["content"]


@pytest.mark.anyio
async def test_fold_asks_for_one_summary_of_consecutive_parts_oldest_first() -> None:
    client = FakeChatClient(" Hannah moved from Manchester to Lisbon. ")
    summarizer = OpenAISummarizer("m", client=client, max_words=60)
    merged = await summarizer.fold(["Hannah lives in Manchester.", "Hannah moved to Lisbon."])
    assert merged == "Hannah moved from Manchester to Lisbon."
    system, user = client.requests[0]["messages"]
    assert "60 words" in system["content"] and "keep the later" in system["content"]
    assert "Part 1:\nHannah lives in Manchester.\n\nPart 2:\nHannah moved to Lisbon." in user["content"]


@pytest.mark.anyio
async def test_a_segmented_session_merges_with_the_models_fold() -> None:
    client = FakeChatClient("a summary")
    config = SessionConfig(evict_to=1.0, max_episodes=2, summarize_batch_max=2, segment_summaries=True)
    async with open_engine(":memory:", summarizer=OpenAISummarizer("m", client=client), config=config) as engine:
        session = engine.session("s")
        for first in range(1, 9, 2):
            await session.add(turns(2, start=first))
        await session.context(wait_for_summary=True)
        with anyio.fail_after(60):  # the merge comes after the summaries a read waits for
            while not any("consecutive parts" in r["messages"][0]["content"] for r in client.requests):  # noqa: ASYNC110
                await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_first_summary_says_there_is_none_yet() -> None:
    client = FakeChatClient("x")
    await OpenAISummarizer("m", client=client).summarize(None, [Episode("user", "hi there")])
    assert "(none yet)" in client.requests[0]["messages"][1]["content"]


@pytest.mark.anyio
async def test_engine_stores_the_model_summary_and_retries_an_empty_answer(db_path, stored) -> None:
    client = FakeChatClient("", None, "The user counted turns one and two.")
    config = SessionConfig(evict_to=1.0, max_episodes=2, summarize_backoff=0.001, summarize_backoff_max=0.001)
    summarizer = OpenAISummarizer("m", client=client)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await add_each(session, turns(3))
        context = await session.context(wait_for_summary=True)
    assert context.summary == "The user counted turns one and two."
    assert len(client.requests) == 3  # two empty answers were refused, never stored
    assert stored.summaries("s") == [(1, "The user counted turns one and two.")]


def test_missing_openai_package_gives_a_clear_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ImportError, match=r"memengine\[openai\]"):
        OpenAISummarizer("m")


def test_model_is_required() -> None:
    with pytest.raises(ValueError):
        OpenAISummarizer("", client=FakeChatClient("x"))


@pytest.mark.anyio
async def test_instructions_keep_literal_braces_and_fill_in_max_words() -> None:
    client = FakeChatClient('{"facts": []}')
    instructions = 'Answer in JSON like {"facts": []}, at most {max_words} words; {unknown} stays as written.'
    summarizer = OpenAISummarizer("m", client=client, max_words=30, instructions=instructions)

    await summarizer.summarize(None, [Episode("user", "hi there")])

    system = client.requests[0]["messages"][0]["content"]
    assert system == 'Answer in JSON like {"facts": []}, at most 30 words; {unknown} stays as written.'
