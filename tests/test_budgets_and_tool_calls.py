"""The window as agents need it, through the engine on both stores: token budgets, tool calls
kept whole, chunked eviction, bounded summarizer input, and a reload that shows the same window."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.summarizer.actor import CUT_MARKER
from memengine.tool_calls import tool_links

from .fakes import FailingSummarizer, RecordingSummarizer, covered, fold

pytestmark = pytest.mark.anyio


def words(text: str) -> int:
    return len(text.split())


def valid_request(episodes: Sequence[Episode]) -> bool:
    """Every tool result comes after its call, and every call shown has all its results after it shown."""
    called: set[str] = set()
    for episode in episodes:
        links = tool_links(episode.metadata)
        if any(call_id not in called for call_id in links.results):
            return False
        called.update(links.calls)
    return True


def chat_call(*ids: str) -> Episode:
    calls = [{"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}} for i in ids]
    return Episode("assistant", f"calling {' '.join(ids)}", metadata={"role": "assistant", "tool_calls": calls})


def chat_result(call_id: str) -> Episode:
    return Episode("tool", f"result of {call_id}", metadata={"role": "tool", "tool_call_id": call_id})


async def test_a_token_budget_binds_and_context_reports_tokens(store_url) -> None:
    config = SessionConfig(max_episodes=100, max_chars=10**6, max_tokens=20, tokenizer=words, evict_to=0.5)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        for n in range(1, 6):
            await session.add([Episode("user", f"turn {n} has five words")])
        context = await session.context(wait_for_summary=True)
    # 25 tokens > 20: evicted down to at most 10 (half the budget): the last two turns stay raw.
    assert [e.seq for e in context.episodes] == [4, 5]
    assert covered(context.summary) == [f"turn {n} has five words" for n in (1, 2, 3)]
    assert context.tokens == words(context.summary) + 10


async def test_at_human_pace_one_summarizer_call_covers_a_chunk(store_url) -> None:
    summarizer = RecordingSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=SessionConfig(max_episodes=20)) as engine:
        session = engine.session("s")
        for n in range(1, 201):
            await session.add([Episode("user", f"turn {n}")])
            await session.context(wait_for_summary=True)  # as a chat UI does after each turn
    # 187 evicted episodes in 17 calls (one per eleven), not 180 calls.
    assert len(summarizer.calls) == 17
    assert sum(len(call) for call in summarizer.calls) == 187


async def test_tool_calls_and_results_stay_together(store_url) -> None:
    config = SessionConfig(max_episodes=3, evict_to=1.0)
    script = [
        Episode("user", "find both"),
        chat_call("a", "b"),
        chat_result("a"),
        chat_result("b"),
        Episode("assistant", "found both"),
        Episode("user", "thanks"),
        chat_call("c"),
        Episode("user", "still waiting for c"),
        Episode("user", "hello?"),
        chat_result("c"),
        Episode("assistant", "c is here"),
    ]
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        for episode in script:
            await session.add([episode])
            context = await session.context(wait_for_summary=True)
            assert valid_request(context.episodes), [e.content for e in context.episodes]
        # The call waiting for c held the window open (over budget) until c arrived.
        assert [e.content for e in context.episodes] == ["c is here"]
    assert covered(context.summary) == [e.content for e in script[:-1]]


async def test_a_reload_shows_the_same_window(store_url) -> None:
    config = SessionConfig(max_episodes=10)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        session = engine.session("s")
        for n in range(1, 15):
            await session.add([Episode("user", f"turn {n}")])
        before = await session.context(wait_for_summary=True)
    async with open_engine(store_url, summarizer=RecordingSummarizer(), config=config) as engine:
        after = await engine.session("s").context()
    assert [e.seq for e in before.episodes] == list(range(7, 15))  # evicted at 11 down to 5, then 3 more
    assert after == before


async def test_a_reload_keeps_the_boundary_of_episodes_still_waiting_for_their_summary(store_url) -> None:
    config = SessionConfig(max_episodes=10, summarize_retry_later=3600)
    async with open_engine(store_url, summarizer=FailingSummarizer(failures=10**6), config=config) as engine:
        session = engine.session("s")
        for n in range(1, 15):
            await session.add([Episode("user", f"turn {n}")])
        before = await session.context()
    async with open_engine(store_url, summarizer=FailingSummarizer(failures=10**6), config=config) as engine:
        after = await engine.session("s").context()
    # Turns 1-6 were evicted (and wait for a summary); 7-14 are the window. Recomputed from the
    # budget alone, a reload would evict 1-9 instead.
    assert before.evicted_through == after.evicted_through == 6
    assert after == before


class InputRecorder:
    def __init__(self) -> None:
        self.inputs: list[tuple[str | None, list[str]]] = []

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.inputs.append((previous, [e.content for e in episodes]))
        await anyio.lowlevel.checkpoint()
        return fold(previous, episodes)[-200:] or "-"


async def test_summarizer_input_is_bounded_and_large_episodes_are_cut_for_it_only(store_url, rows) -> None:
    config = SessionConfig(max_episodes=1, evict_to=1.0, summarize_input_max_chars=2_000, max_content_chars=10**6)
    summarizer = InputRecorder()
    huge = "x" * 50_000
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "a" * 900), Episode("user", "b" * 900), Episode("user", "c" * 900)])
        await session.add([Episode("user", huge), Episode("user", "last")])
        await session.context(wait_for_summary=True)
    for previous, contents in summarizer.inputs:
        assert len(previous or "") + sum(len(c) for c in contents) <= 2_000 + 200  # the marker may add a line
    cut = [c for _, contents in summarizer.inputs for c in contents if c.startswith("xxx")]
    assert len(cut) == 1 and len(cut[0]) < 2_200
    assert CUT_MARKER.format(total=50_000, shown=len(cut[0].split("\n")[0])).strip() in cut[0]
    assert rows.query("SELECT content FROM episodes WHERE seq = 4") == [(huge,)]  # stored whole


async def test_a_scraped_page_fits_by_default_and_is_found(store_url, rows) -> None:
    # 1,500,000 characters of distinct words: past what one PostgreSQL tsvector holds (1 MB).
    words_of_page = [f"w{n:06d}x" for n in range(166_000)]
    page = "start " + " ".join(words_of_page)
    async with open_engine(store_url, config=SessionConfig(max_chars=10**8)) as engine:
        (stored,) = await engine.session("s").add([Episode("tool", page)])
        found = await engine.recall("w000123x", session_id="s")
    assert stored.seq == 1 and len(page) > 1_400_000
    assert [hit.episode.seq for hit in found] == [1]
    assert rows.query("SELECT length(content) FROM episodes") == [(len(page),)]


async def test_a_tokenizer_that_cannot_count_is_refused_at_open(db_path) -> None:
    with pytest.raises(TypeError, match=r"SessionConfig\.tokenizer"):
        async with open_engine(db_path, config=SessionConfig(tokenizer=lambda text: "many")):
            pass
    with pytest.raises(TypeError, match="callable"):
        SessionConfig(tokenizer="cl100k")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="evict_to"):
        SessionConfig(evict_to=0)
