"""Segment summaries (``SessionConfig.segment_summaries``): a delete of an old episode costs a few calls.

The summarized past is a tree of summaries (store/segments.py): a leaf per
batch, folds above. A delete erases the leaf that held the episode and the
folds above it, in its own transaction; the read meanwhile gets every other
summary and, in the leaf's place, its live episodes as they were said (its
range listed in ``Context.resummarizing``); the child makes the leaf again
and the folds above it. Checked on both stores
and both async libraries, on what reads return and on the rows stored.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime

import anyio
import attrs
import pytest

from memengine import Episode, SessionConfig, SummaryError, open_engine
from memengine.episode import stored_episode
from memengine.store.open import open_store
from memengine.store.segments import HOLE_COMPACT, HOLE_LEFT_OUT, HOLE_OPENS, HOLE_SHOWN_CHARS, PART_SEPARATOR
from memengine.summarizer.actor import SummarizerActor

from .fakes import covered, fold

pytestmark = pytest.mark.anyio

# Batches of 4 episodes: a session of 64 summarized episodes has 16 leaves, 4 levels of folds above them.
CONFIG = SessionConfig(
    max_episodes=4, evict_to=1.0, summarize_batch_max=4, segment_summaries=True, passivate_after=None
)


class CountingSummarizer:
    """Answers with :func:`fold` (the summary lists what it covers); counts leaf calls and folds apart."""

    def __init__(self) -> None:
        self.leaves: list[tuple[int, ...]] = []
        self.folds = 0

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.leaves.append(tuple(episode.seq for episode in episodes))  # type: ignore[misc]
        return fold(previous, episodes)

    async def fold(self, summaries: Sequence[str]) -> str:
        self.folds += 1
        return "|".join(summaries)

    @property
    def calls(self) -> int:
        return len(self.leaves) + self.folds


def texts(count: int, start: int = 1) -> list[Episode]:
    return [Episode("user", f"turn {n}") for n in range(start, start + count)]


async def fill(session, count: int, start: int = 1) -> None:
    """Add ``count`` episodes four at a time (each add evicts a batch of four), and wait for their summary."""
    episodes = texts(count, start)
    for first in range(0, count, 4):
        await session.add(episodes[first : first + 4])
    await session.context(wait_for_summary=True)


async def test_a_segmented_summary_covers_the_past_in_a_few_parts(store_url, rows) -> None:
    summarizer = CountingSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 68)
        await wait_until_folded(session)
        context = await session.context()
    # 64 summarized in 16 leaves, each on its own; 15 folds make one root over them.
    assert context.summarized_through == 64
    assert covered(context.summary) == [f"turn {n}" for n in range(1, 65)]
    assert [e.content for e in context.episodes] == [f"turn {n}" for n in range(65, 69)]
    assert all(len(seqs) == 4 for seqs in summarizer.leaves) and len(summarizer.leaves) == 16
    assert summarizer.folds == 15
    assert context.resummarizing == ()
    assert rows.query("SELECT count(*) FROM summary_segments WHERE level = 0") == [(16,)]
    assert rows.query("SELECT count(*) FROM summaries") == [(1,)]  # only the newest: no fallback history


async def test_a_delete_of_the_first_episode_costs_a_leaf_and_the_folds_above_it(store_url, rows) -> None:
    summarizer = CountingSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 68)
        await wait_until_folded(session)
        before = summarizer.calls
        assert await session.delete_episodes([1]) == 1
        context = await session.context(wait_for_summary=True)
        await wait_until_folded(session)
        after = await session.context()
        calls = summarizer.calls - before
    # One leaf again (seqs 2..4) and the four folds above it: log2(16) + 1 calls, not 16 + 15.
    assert summarizer.leaves[-1] == (2, 3, 4)
    assert calls == 1 + 4
    expected = [f"turn {n}" for n in range(2, 65)]
    assert covered(context.summary) == expected and covered(after.summary) == expected
    assert after.resummarizing == () and after.summary.count(PART_SEPARATOR) == 0  # one root again
    assert not _holds_anywhere(rows, "turn 1|") and not _holds_anywhere(rows, "turn 1")


async def test_while_a_leaf_is_made_again_the_read_gets_every_other_summary(store_url, rows) -> None:
    summarizer = GatedFolds()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        summarizer.open = True
        await fill(session, 68)
        await wait_until_folded(session)
        summarizer.open = False
        assert await session.delete_episodes([30]) == 1
        # In the delete's own transaction: the leaf of 29..32 lost its text, and every fold above it;
        # its live episodes are shown in its place, as they were said, until it is made again.
        context = await session.context()
        assert context.resummarizing == ((29, 32),)
        assert (await engine.stats()).summary_holes == 1  # (and its gauge: the same figure)
        assert engine._gauge_figures()["memengine.summary.holes"] == 1  # type: ignore[index]
        assert HOLE_OPENS.format(first=29, last=32) + "\nuser: turn 29\nuser: turn 31\n" in context.summary
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 65) if n != 30]
        assert [e.seq for e in context.episodes] == [65, 66, 67, 68]  # the window: nothing of the past raw
        assert "turn 30" not in " ".join(row[0] for row in rows.query("SELECT summary FROM summaries"))
        assert not _holds_anywhere(rows, "turn 30")
        summarizer.open = True
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.resummarizing == ()
        assert (await engine.stats()).summary_holes == 0
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 65) if n != 30]


async def test_a_backlog_never_makes_the_summary_a_part_per_batch(store_url) -> None:
    class Sequenced(CountingSummarizer):
        """Records the parts the composed summary has after each call: leaves add one, folds take one away."""

        def __init__(self) -> None:
            super().__init__()
            self.parts: list[int] = []

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            self.parts.append(len(self.leaves) + 1 - self.folds)
            return await super().summarize(previous, episodes)

        async def fold(self, summaries: Sequence[str]) -> str:
            self.parts.append(len(self.leaves) - self.folds - 1)
            return await super().fold(summaries)

    summarizer = Sequenced()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await session.add(texts(132))  # 128 evicted at once: a backlog of 32 batches
        await wait_until_folded(session)
        context = await session.context()
    assert covered(context.summary) == [f"turn {n}" for n in range(1, 129)]
    assert len(summarizer.leaves) == 32 and summarizer.folds == 31
    # Folds went between the leaves: never more than two parts beyond the folded shape (log2 of 32 leaves + 1).
    assert max(summarizer.parts) <= (32).bit_length() + 2


async def test_a_large_hole_is_shown_up_to_a_bound_and_the_rest_said(store_url) -> None:
    summarizer = GatedFolds()
    summarizer.open = True
    big = SessionConfig(max_episodes=4, max_chars=10**6, evict_to=1.0, summarize_batch_max=4, segment_summaries=True)
    async with open_engine(store_url, summarizer=summarizer, config=big) as engine:
        session = engine.session("s")
        await session.add([Episode("user", f"{n}:" + "x" * 6_000) for n in range(1, 9)])
        await wait_until_folded(session)
        summarizer.open = False
        await session.delete_episodes([1])
        context = await session.context()
        assert context.resummarizing == ((1, 4),)
        hole = context.summary.split(PART_SEPARATOR)[0]
        shown = [line for line in hole.split("\n") if line.startswith("user: ")]
        assert [line[6:8] for line in shown] == ["2:", "3:"]  # 12,000 characters, within 16,000
        assert HOLE_LEFT_OUT.format(first=4, last=4, count=1, chars=6_002) in hole
        assert len(hole) < HOLE_SHOWN_CHARS + 1_000
        summarizer.open = True
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.resummarizing == ()


async def test_over_the_ceiling_a_holes_episodes_are_said_left_out_before_the_window_is(store_url) -> None:
    class Terse(GatedFolds):
        """One-word summaries, so that only the hole's episodes can pass the ceiling."""

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            await super().summarize(previous, episodes)
            return f"s{episodes[0].seq}-{episodes[-1].seq}"

    def words(text: str) -> int:
        return len(text.split())

    # The ceiling: 200 words. The window holds 4 episodes of 31 words; the hole's 3 live ones take 93 more.
    config = attrs.evolve(CONFIG, max_tokens=100, max_chars=10**6, tokenizer=words, max_context_wait=0)
    summarizer = Terse()
    summarizer.open = True
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        for first in range(1, 21, 4):
            await session.add([Episode("user", f"turn{n} " + "w " * 30) for n in range(first, first + 4)])
        await wait_until_folded(session)
        summarizer.open = False
        await session.delete_episodes([2])
        window = [e.seq for e in (await session.context()).episodes]
        context = await session.context()
        ((first, last),) = context.resummarizing
        assert first <= 2 <= last and last > first + 1  # the hole holds live episodes besides seq 2
        # Shown whole, the hole's episodes would pass the ceiling: they are said left out, the window stays.
        assert HOLE_COMPACT.format(first=first, last=last) in context.summary
        assert not any(f"turn{n} " in context.summary for n in range(first, last + 1))
        assert [e.seq for e in context.episodes] == window and context.omitted is None
        assert context.tokens <= config.context_ceiling
        summarizer.open = True
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.resummarizing == () and "turn" not in context.summary


async def test_an_orphaned_session_with_a_hole_stays_found_until_it_is_made(store_url, rows) -> None:
    summarizer = GatedFolds()
    summarizer.open = True
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 20)
        await wait_until_folded(session)
        summarizer.open = False
        await session.delete_episodes([2])
        await summarizer.wait_started()
    # As a process that died leaves it: the lease held by an owner that is gone, and expired.
    rows.query("UPDATE session_leases SET owner = 'a-dead-process', expires_at = 0")
    async with open_store(store_url, owner="the sweeping process") as store:
        assert await store.sessions_needing_summary(4, 10**9, orphaned_only=True) == ["s"]
        assert await store.release_orphans(4, 10**9, retaining=False) == 0  # work is left: not released
        assert await store.sessions_needing_summary(4, 10**9, orphaned_only=True) == ["s"]


async def test_every_call_keeps_within_the_input_bound_merges_and_repairs_too(store_url) -> None:
    class Verbose(CountingSummarizer):
        """Writes summaries longer than half the bound; records each call's input in characters."""

        def __init__(self) -> None:
            super().__init__()
            self.inputs: list[int] = []

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            self.inputs.append(len(previous or "") + sum(len(e.content) for e in episodes))
            await super().summarize(previous, episodes)
            return "s" * 300

        async def fold(self, summaries: Sequence[str]) -> str:
            self.inputs.append(sum(len(summary) for summary in summaries))
            await super().fold(summaries)
            return "f" * 300

    bound = attrs.evolve(CONFIG, max_chars=10**6, summarize_input_max_chars=400)
    summarizer = Verbose()
    async with open_engine(store_url, summarizer=summarizer, config=bound) as engine:
        session = engine.session("s")
        await session.add([Episode("user", f"{n}:" + "x" * 90) for n in range(1, 37)])
        await session.add([Episode("user", "a long one: " + "y" * 900)])  # alone over the bound: cut
        await session.add([Episode("user", f"{n}" + "z" * 90) for n in range(38, 42)])
        await wait_until_folded(session)
        await session.delete_episodes([3, 37])  # leaves made again: one of them holds the cut episode
        await session.context(wait_for_summary=True)
        await wait_until_folded(session)
    assert summarizer.folds >= 8
    assert max(summarizer.inputs) <= 400, summarizer.inputs


async def test_a_leaf_whose_episodes_are_all_deleted_costs_no_call(store_url) -> None:
    summarizer = CountingSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 20)
        await wait_until_folded(session)
        leaves = len(summarizer.leaves)
        assert await session.delete_episodes([5, 6, 7, 8]) == 4
        context = await session.context(wait_for_summary=True)
        await wait_until_folded(session)
        assert len(summarizer.leaves) == leaves  # the empty leaf was made without the summarizer
        context = await session.context()
    assert covered(context.summary) == [f"turn {n}" for n in range(1, 17) if not 5 <= n <= 8]


async def test_holes_left_by_a_stopped_engine_are_made_after_a_restart(store_url) -> None:
    summarizer = GatedFolds()
    summarizer.open = True
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 36)
        await wait_until_folded(session)
        summarizer.open = False
        await session.delete_episodes([3, 17])
        await summarizer.wait_started()  # the leaf of 1..4 is being made when the engine stops
    summarizer = GatedFolds()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        await summarizer.wait_started()  # resumed at start, as pending summaries are: nobody asked for it
        session = engine.session("s")
        held = await session.context()
        assert held.resummarizing == ((1, 4), (17, 20))
        summarizer.open = True
        summarizer.release()
        context = await session.context(wait_for_summary=True)
        assert context.resummarizing == ()
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 33) if n not in (3, 17)]


async def test_a_session_with_a_rolling_summary_stays_rolling_and_a_segmented_one_segmented(store_url, rows) -> None:
    rolling = attrs.evolve(CONFIG, segment_summaries=False)
    async with open_engine(store_url, summarizer=CountingSummarizer(), config=rolling) as engine:
        await fill(engine.session("old"), 12)
    async with open_engine(store_url, summarizer=CountingSummarizer(), config=CONFIG) as engine:
        await fill(engine.session("old"), 8, start=13)
        await fill(engine.session("new"), 12)
        await wait_until_folded(engine.session("new"))
        context = await engine.session("old").context(wait_for_summary=True)
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 17)]
    assert rows.query("SELECT DISTINCT session_id FROM summary_segments") == [("new",)]
    # Turned off again, a segmented session stays so: a delete still costs only its leaf.
    summarizer = CountingSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=rolling) as engine:
        session = engine.session("new")
        await session.delete_episodes([2])
        context = await session.context(wait_for_summary=True)
        assert covered(context.summary) == [f"turn {n}" for n in range(1, 9) if n != 2]
        assert summarizer.leaves == [(1, 3, 4)]


async def test_a_summarizer_without_fold_merges_through_summarize(store_url) -> None:
    class PlainSummarizer:
        def __init__(self) -> None:
            self.merges: list[tuple[str, ...]] = []

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            if episodes[0].role == "summary":
                self.merges.append(tuple(e.role for e in episodes))
            return fold(previous, episodes)

    summarizer = PlainSummarizer()
    async with open_engine(store_url, summarizer=summarizer, config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 12)
        await wait_until_folded(session)
        context = await session.context()
    assert summarizer.merges == [("summary",)]  # leaves 0 and 1 merged; leaf 2 waits for its sibling
    assert covered(context.summary) == [f"turn {n}" for n in range(1, 9)]


async def test_a_repair_set_aside_names_the_episodes_it_holds(store_url) -> None:
    class Failing(CountingSummarizer):
        failing = False

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            if self.failing:
                raise RuntimeError("model unavailable")
            return await super().summarize(previous, episodes)

    config = attrs.evolve(CONFIG, summarize_attempts=1, summarize_set_aside_after=1)
    summarizer = Failing()
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await fill(session, 20)
        await wait_until_folded(session)
        summarizer.failing = True
        await session.delete_episodes([6])
        with pytest.raises(SummaryError, match=r"episodes 5\.\.8 is set aside"):
            await session.context(wait_for_summary=True)
        (record,) = await engine.list_set_aside()
        assert (record.kind, record.first_seq, record.last_seq) == ("summary", 5, 8)
        summarizer.failing = False
        assert await engine.retry_set_aside("s") == 1
        context = await session.context(wait_for_summary=True)
    assert context.resummarizing == ()
    assert covered(context.summary) == [f"turn {n}" for n in range(1, 17) if n != 6]


async def test_clear_leaves_no_segment(store_url, rows) -> None:
    async with open_engine(store_url, summarizer=CountingSummarizer(), config=CONFIG) as engine:
        session = engine.session("s")
        await fill(session, 12)
        await session.clear()
        assert (await session.context()).summary is None
    assert rows.query("SELECT count(*) FROM summary_segments") == [(0,)]
    assert rows.query("SELECT count(*) FROM summaries") == [(0,)]


async def test_forget_erases_every_segment(store_url, rows) -> None:
    async with open_engine(store_url, summarizer=CountingSummarizer(), config=CONFIG) as engine:
        await fill(engine.session("u/s"), 12)
        report = await engine.forget(session_id="u/s")
        assert report.summaries >= 3
    assert rows.query("SELECT count(*) FROM summary_segments") == [(0,)]


class GatedFolds(CountingSummarizer):
    """Answers at once while ``open``; else every call waits for :meth:`release`."""

    def __init__(self) -> None:
        super().__init__()
        self.open = False
        self._gate = anyio.Event()
        self._started = anyio.Event()

    async def _maybe_wait(self) -> None:
        if self.open:
            return
        self._started.set()
        await self._gate.wait()

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        await self._maybe_wait()
        return await super().summarize(previous, episodes)

    async def fold(self, summaries: Sequence[str]) -> str:
        await self._maybe_wait()
        return await super().fold(summaries)

    def release(self) -> None:
        self._gate.set()

    async def wait_started(self) -> None:
        with anyio.fail_after(60):
            await self._started.wait()


async def wait_until_folded(session, patience: float = 60) -> None:
    """Until the summary is one part per set bit of the leaf count (every fold due is made), or fail."""
    with anyio.fail_after(patience):
        while True:
            context = await session.context(wait_for_summary=True)
            parts = (context.summary or "").split(PART_SEPARATOR)
            leaves = math.ceil(context.summarized_through / CONFIG.summarize_batch_max)
            if not context.resummarizing and len(parts) <= max(bin(leaves).count("1"), 1):
                return
            await anyio.sleep(0.01)


def _holds_anywhere(rows, text: str) -> bool:
    """Whether any summary or segment row holds ``text`` as a whole episode text (``turn 1`` not ``turn 10``)."""
    pattern = re.compile(re.escape(text) + r"(?![0-9])")
    stored = [row[0] for row in rows.query("SELECT summary FROM summaries")]
    stored += [row[0] for row in rows.query("SELECT summary FROM summary_segments WHERE summary IS NOT NULL")]
    return any(pattern.search(value) for value in stored)


async def test_a_repairs_calls_keep_within_the_token_bound_too() -> None:
    """The child's own shaping of a leaf repair and a merge, with a tokenizer (words): within both bounds."""

    def words(text: str) -> int:
        return len(text.split())

    class Recording:
        def __init__(self) -> None:
            self.calls: list[tuple[int, int]] = []

        async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
            texts = [previous or "", *(e.content for e in episodes)]
            self.calls.append((sum(len(t) for t in texts), sum(words(t) for t in texts)))
            return " ".join(["w"] * 41)  # 81 characters, 41 words: more than half of either bound

        async def fold(self, summaries: Sequence[str]) -> str:
            self.calls.append((sum(len(s) for s in summaries), sum(words(s) for s in summaries)))
            return "f"

    summarizer = Recording()
    config = SessionConfig(summarize_input_max_chars=300, summarize_input_max_tokens=50, summarize_attempts=1)
    child = SummarizerActor("s", summarizer, None, config, anyio.CapacityLimiter(1), lambda m: None, count_tokens=words)
    now = datetime.now(UTC)
    leaf = (
        stored_episode("user", " ".join(["a"] * 40), "i1", now, {}, 1),  # 40 words
        stored_episode("user", "b" * 6000, "i2", now, {}, 2),  # one word, 6,000 characters: cut
    )
    await child._summarize_leaf(leaf, [1])
    await child._fold((" ".join(["x"] * 100), " ".join(["y"] * 100)), [1])
    assert len(summarizer.calls) == 3
    assert all(chars <= 300 and tokens <= 50 for chars, tokens in summarizer.calls), summarizer.calls


async def test_a_summary_alone_over_the_ceiling_with_nothing_raw_is_returned_not_a_crash(store_url) -> None:
    """The ceiling's one exception with an empty window: every read raised IndexError (one rolling summary too)."""

    def words(text: str) -> int:
        return len(text.split())

    for segmented in (False, True):
        config = SessionConfig(max_tokens=2, tokenizer=words, evict_to=1.0, segment_summaries=segmented)
        with anyio.fail_after(60):  # (the crash left a waiting read waiting)
            async with open_engine(store_url, summarizer=CountingSummarizer(), config=config) as engine:
                session = engine.session(f"s{segmented}")
                await session.add([Episode("user", "one two three four five six")])  # over the window: evicted
                waited = await session.context(wait_for_summary=True)
                context = await session.context()
        for read in (waited, context):
            assert covered(read.summary) == ["one two three four five six"]
            assert read.episodes == () and read.omitted is None and read.tokens == 6  # the ceiling is 4
