"""Each episode's tokens are counted once, when it is added (or loaded), never by a read;
a large content is counted in a worker thread, never on the event loop all sessions share."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.tokens import OFF_LOOP_CHARS

from .fakes import RecordingSummarizer

pytestmark = pytest.mark.anyio

CHECK = "memengine checks its tokenizer"  # what the engine counts once at open


class CountingTokenizer:
    """Counts words; records each text it counted and whether it ran on the event loop's thread."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.on_loop_thread: dict[str, bool] = {}
        self.loop_thread = threading.get_ident()

    def __call__(self, text: str) -> int:
        if text != CHECK:
            self.calls[text] += 1
            self.on_loop_thread[text] = threading.get_ident() == self.loop_thread
        return len(text.split())


async def test_episodes_are_counted_at_add_and_reads_count_nothing(store_url) -> None:
    tokenizer = CountingTokenizer()
    config = SessionConfig(max_episodes=100, tokenizer=tokenizer)  # no token bound: nothing needs a count to add
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        texts = [f"turn {n} says {n} things" for n in range(1, 6)]
        for text in texts:
            await session.add([Episode("user", text)])
        assert tokenizer.calls == Counter(texts)  # counted when added, before any read
        for _ in range(3):
            context = await session.context()
            assert context.tokens == 5 * 5
        assert tokenizer.calls == Counter(texts)  # the reads counted nothing
        await session.delete_episodes([2])
        context = await session.context()
        assert context.tokens == 4 * 5
        assert tokenizer.calls == Counter(texts)  # the episodes a delete kept are not counted again


async def test_a_large_content_is_counted_once_off_the_event_loop(store_url) -> None:
    tokenizer = CountingTokenizer()
    big = "output line\n" * (400_000 // 12)  # a 400,000-character tool output
    assert len(big) >= OFF_LOOP_CHARS
    config = SessionConfig(max_episodes=100, max_chars=10**7, max_tokens=10**6, tokenizer=tokenizer)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "run the tool")])
        await session.add([Episode("tool", big), Episode("assistant", "done")])
        context = await session.context()
        assert context.tokens == 3 + 2 * len(big) // 12 + 1
        assert tokenizer.calls[big] == 1
        assert tokenizer.on_loop_thread[big] is False
    # Loaded again by a new engine: counted again, once, off the loop as well.
    tokenizer.calls.clear()
    tokenizer.on_loop_thread.clear()
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        context = await engine.session("s").context()
        assert context.tokens == 3 + 2 * len(big) // 12 + 1
        assert tokenizer.calls[big] == 1
        assert tokenizer.on_loop_thread[big] is False


async def test_a_large_content_a_delete_brings_back_from_a_summary_is_counted_off_the_event_loop(store_url) -> None:
    # Deleting a summarized episode deletes the summaries through it: the episodes they covered are
    # raw again and are counted again, a large one in a worker thread as at add and at activation.
    tokenizer = CountingTokenizer()
    big = "output line\n" * (400_000 // 12)
    config = SessionConfig(max_episodes=2, evict_to=0.5, max_chars=10**7, tokenizer=tokenizer)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "run the tool")])
        await session.add([Episode("tool", big)])
        for n in range(3):
            await session.add([Episode("user", f"turn {n}")])
        context = await session.context(wait_for_summary=True)
        assert context.summary is not None and all(episode.content != big for episode in context.episodes)
        assert tokenizer.on_loop_thread[big] is False
        await session.delete_episodes([1])
        context = await session.context()
        assert context.summary is None and [episode.seq for episode in context.episodes] == [2, 3, 4, 5]
        assert context.tokens == 2 * len(big) // 12 + 3 * 2
        assert tokenizer.calls[big] == 2  # at add, and once more now that no summary covers it
        assert tokenizer.on_loop_thread[big] is False
