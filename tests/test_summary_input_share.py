"""A summary that outgrows the summarizer's input bound never crowds the episodes out of a call.

The episodes of a batch have at least half of ``summarize_input_max_chars``
(and ``summarize_input_max_tokens``); a previous summary longer than what they
leave is cut for that call, with a marker saying so (the summarizer should then
write a shorter one), never the episodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .fakes import fold

pytestmark = pytest.mark.anyio

CAP = 2_000


def words(text: str) -> int:
    return len(text.split())


class GrowingSummarizer:
    """Answers with the previous summary plus every episode (a summary that only grows); records each call."""

    def __init__(self) -> None:
        self.inputs: list[tuple[str | None, list[Episode]]] = []
        self.outputs: list[str] = []

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.inputs.append((previous, list(episodes)))
        await anyio.lowlevel.checkpoint()
        self.outputs.append(fold(previous, episodes))
        return self.outputs[-1]


def turn(n: int) -> Episode:
    return Episode("user" if n % 2 else "assistant", f"turn {n:03d}: " + "some words of the conversation " * 2)


@pytest.mark.parametrize("bound", ["chars", "tokens"])
async def test_a_long_session_gives_the_summarizer_whole_episodes_once_the_summary_outgrows_the_bound(
    store_url, bound
) -> None:
    if bound == "chars":
        config = SessionConfig(max_episodes=6, summarize_input_max_chars=CAP)
        size = len
    else:
        config = SessionConfig(max_episodes=6, tokenizer=words, summarize_input_max_tokens=CAP // 6)
        size = words
    cap = CAP if bound == "chars" else CAP // 6
    summarizer = GrowingSummarizer()
    script = [turn(n) for n in range(1, 201)]
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        for episode in script:
            await session.add([episode])
            context = await session.context(wait_for_summary=True)  # a chat at human pace
    summarized = [episode.content for _, episodes in summarizer.inputs for episode in episodes]
    # Every evicted episode reached the summarizer whole, once, in order: nothing was cut from them ...
    assert summarized == [episode.content for episode in script[: context.summarized_through]]
    assert context.summarized_through >= 190
    # ... in calls that each cover a chunk (about half the window), not one episode per turn,
    assert len(summarizer.inputs) <= len(script) // 2
    cuts = 0
    for (previous, episodes), summary_before in zip(summarizer.inputs[1:], summarizer.outputs, strict=False):
        # ... within the bound, the previous summary included,
        assert size(previous or "") + sum(size(e.content) for e in episodes) <= cap
        # ... and a previous summary too long to go with them whole was cut, saying so in the text it is given.
        if previous != summary_before:
            cuts += 1
            assert "of the previous summary" in previous and size(previous) < size(summary_before)
    assert cuts > 0  # the summary did outgrow what the episodes left (a summarizer that never condenses)
