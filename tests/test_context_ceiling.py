"""A budget is a ceiling: what context() returns stays within its token ceiling whatever the summarizer's pace.

Episodes that left the window stay shown raw until their summary is stored;
while the summarizer lags, a read that would pass the ceiling (by default twice
``max_tokens``) waits up to ``max_context_wait`` for it, then shows the newest
episodes within the ceiling and says which it left out (``Context.omitted``):
the summary, the omitted range and the episodes still cover the session with
no gap and no overlap.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from trio.testing import MockClock

from memengine import Episode, SessionConfig, open_engine

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest):
    """Trio on a virtual clock (a summarizer's latency, a writer's pace and a read's wait cost no real time)."""
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0.01)})
    return "asyncio"


MAX_TOKENS = 600
CEILING = 2 * MAX_TOKENS  # the default: twice max_tokens
# Leases expire by the database's clock, renewals go by the event loop's (virtual under trio): long enough for both.
LEASES = {"lease_ttl": 3600.0, "lease_wait": 3700.0, "passivate_after": None}


def words(text: str) -> int:
    return len(text.split())


class LaggingSummarizer:
    """Takes ``latency`` seconds per call, and waits for ``gate`` first while one is set; a short summary."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.gate: anyio.Event | None = None
        self.calls = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        await anyio.sleep(self.latency)
        return f"the conversation up to episode {episodes[-1].seq}"


def turn(n: int) -> Episode:
    return Episode("user" if n % 2 else "assistant", f"turn {n} " + "and some more words of the conversation " * 4)


def check_within_ceiling(context, last_seq: int, contents: dict[int, str]) -> None:
    """Within the ceiling; summary, omitted range and episodes cover seqs 1..last_seq exactly once, in order."""
    assert context.tokens <= CEILING, f"a context of {context.tokens} tokens passed the ceiling of {CEILING}"
    note = 0 if context.omitted is None else words(context.omitted.note)
    assert context.tokens == words(context.summary or "") + note + sum(words(e.content) for e in context.episodes)
    following = context.summarized_through + 1
    omitted = context.omitted
    if omitted is not None:
        assert omitted.first_seq == following
        assert omitted.count == omitted.last_seq - omitted.first_seq + 1 > 0
        assert omitted.tokens == sum(words(contents[seq]) for seq in range(omitted.first_seq, omitted.last_seq + 1))
        assert f"{omitted.first_seq}..{omitted.last_seq}" in omitted.note
        following = omitted.last_seq + 1
    assert [e.seq for e in context.episodes] == list(range(following, last_seq + 1))
    assert all(e.content == contents[e.seq] for e in context.episodes)


async def test_a_lagging_summarizer_never_lets_a_context_pass_the_ceiling(store_url) -> None:
    summarizer = LaggingSummarizer(latency=0.2)
    summarizer.gate = anyio.Event()  # held for the first 100 turns: the evicted episodes pile up
    config = SessionConfig(
        max_episodes=1000, max_chars=10**7, max_tokens=MAX_TOKENS, tokenizer=words, max_context_wait=0.05, **LEASES
    )
    contents: dict[int, str] = {}
    over_ceiling_raw = 0
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        for n in range(1, 201):
            (stored,) = await session.add([turn(n)])
            contents[stored.seq] = stored.content
            context = await session.context()
            check_within_ceiling(context, stored.seq, contents)
            if context.omitted is not None:
                over_ceiling_raw += 1
            if n == 100:
                summarizer.gate.set()  # then it lags: 0.2 s a call against a turn every 0.01 s
                summarizer.gate = None
            await anyio.sleep(0.01)  # a paced writer
        # Without the ceiling, turn 100 showed its 100 turns raw (3,300 tokens): the ceiling kicked in ...
        assert over_ceiling_raw >= 50
        # ... and once the summarizer caught up, nothing is left out.
        context = await session.context(wait_for_summary=True)
        check_within_ceiling(context, 200, contents)
        assert context.omitted is None and context.summarized_through == context.evicted_through


async def test_a_read_waits_for_the_summarizer_rather_than_leave_episodes_out(db_path) -> None:
    summarizer = LaggingSummarizer(latency=0)
    summarizer.gate = anyio.Event()
    config = SessionConfig(max_episodes=1000, max_tokens=MAX_TOKENS, tokenizer=words, max_context_wait=10**6, **LEASES)
    async with open_engine(db_path, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        for n in range(1, 61):  # 60 turns of 33 words: the evicted ones push a context past the ceiling
            await session.add([turn(n)])
        contexts = []

        async def read() -> None:
            contexts.append(await session.context())

        async with anyio.create_task_group() as readers:
            readers.start_soon(read)
            await anyio.wait_all_tasks_blocked()  # the read is in, the summarizer held at its gate
            assert summarizer.calls == 1
            await session.add([turn(61)])  # writers do not wait, not even behind a waiting read
            assert contexts == []  # the read waits for the summary ...
            summarizer.gate.set()
    (context,) = contexts
    # ... and then shows everything, within the ceiling, nothing left out.
    assert context.omitted is None and context.tokens <= CEILING
    assert context.summary is not None and context.episodes[-1].seq == 61


async def test_a_summary_set_aside_answers_the_waiting_read_with_the_ceiling_view(db_path) -> None:
    class Failing:
        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            raise RuntimeError("model unavailable")

    config = SessionConfig(
        max_episodes=1000,
        max_tokens=MAX_TOKENS,
        tokenizer=words,
        max_context_wait=3600,
        summarize_attempts=1,
        summarize_set_aside_after=1,
        **LEASES,
    )
    async with open_engine(db_path, summarizer=Failing(), config=config) as engine:
        session = engine.session("s")
        contents = {}
        for n in range(1, 61):
            (stored,) = await session.add([turn(n)])
            contents[stored.seq] = stored.content
        with anyio.fail_after(600):  # well before max_context_wait: nothing to wait for once the batch is set aside
            context = await session.context()
    check_within_ceiling(context, 60, contents)
    assert context.omitted is not None and context.summary is None


async def test_a_summary_alone_past_the_ceiling_is_shown_whole_and_every_raw_episode_said_left_out(db_path) -> None:
    class Verbose:
        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            return "word " * 2 * CEILING  # a summary larger than the ceiling on its own

    config = SessionConfig(max_episodes=1000, max_tokens=MAX_TOKENS, tokenizer=words, **LEASES)
    contents = {}
    async with open_engine(db_path, summarizer=Verbose(), config=config) as engine:
        session = engine.session("s")
        for n in range(1, 31):
            (stored,) = await session.add([turn(n)])
            contents[stored.seq] = stored.content
        context = await session.context(wait_for_summary=True)
    # The one documented exception to the ceiling: the summary cannot be cut without losing what it covers.
    assert words(context.summary) == 2 * CEILING and context.episodes == ()
    assert context.omitted is not None and context.omitted.last_seq == 30
    assert context.tokens == 2 * CEILING + words(context.omitted.note)


def test_the_cut_for_the_ceiling_never_separates_a_tool_call_from_its_results() -> None:
    from memengine.episode import with_seq
    from memengine.session.window import Budget, window_of
    from memengine.tool_calls import answering, calling

    script = []
    for n in range(0, 60, 3):  # a call, its result, a reply: 3 words each
        script += [
            with_seq(Episode("assistant", "call number one", metadata=calling([f"c{n}"])), seq=n + 1),
            with_seq(Episode("tool", "result number one", metadata=answering(f"c{n}")), seq=n + 2),
            with_seq(Episode("assistant", "reply number one"), seq=n + 3),
        ]
    window = window_of(script, Budget(1000, 10**6, 1000), 0.5, words)
    for room in range(0, 3 * len(script) + 1):
        start, shown = window.newest_within(room)
        assert shown <= room and shown == 3 * (len(script) - start)
        assert start == len(script) or script[start].role != "tool"  # never a result shown without its call
