"""The raw window: which live episodes are shown raw, and which await a summary.

Pure state, no I/O. ``raw`` holds the live episodes after the summary, in
order; the first ``evicted`` of them have left the window and wait for their
summary. Three rules decide where the window starts:

- **Budgets, in chunks.** The window holds at most ``max_episodes``
  episodes, ``max_chars`` characters and ``max_tokens`` tokens (whichever
  binds first). When an episode makes it overflow, the oldest episodes are
  evicted until what stays fits ``evict_to`` (a fraction) of every budget: one
  summarizer call then covers a chunk, not one episode per turn.
- **Tool calls stay whole.** A tool call and all its results are evicted
  together (see :mod:`memengine.tool_calls`): the window never holds a result
  without its call, so it is always a valid prefix of a provider request. A
  call still waiting for a result is not evicted (the result will follow it),
  unless the window has grown past twice a budget meanwhile. A result whose
  call is not in the window (evicted, deleted or never added) is evicted, with
  everything before it.
- **Boundaries are kept.** Once evicted, an episode stays evicted: the
  boundary is stored (``evicted_through``), and a session loaded again shows
  the window it had.

Each episode's size (characters, tokens) and tool links are computed once,
when it enters; without a token bound, its tokens are counted only when a
read first reports them (still once). Appending costs time proportional to what it evicts, not to
the window or the history.
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
from collections.abc import Callable, Iterable, Sequence

import attrs

from ..config import SessionConfig
from ..episode import Episode
from ..tokens import Tokenizer, checked, estimate_tokens
from ..tool_calls import NO_LINKS, ToolLinks, tool_links

log = logging.getLogger("memengine.session")

_seq_of = operator.attrgetter("seq")


def tokenizer_of(config: SessionConfig, session_id: str) -> Tokenizer:
    """The session's token counter: the configured one, or the offline estimate.

    A configured tokenizer that fails on some text (it was checked when the
    engine opened) does not fail the add, which is stored by then: that text is
    estimated instead, and the failure logged once per session.
    """
    if config.tokenizer is None:
        return estimate_tokens
    count = checked(config.tokenizer)
    failed = False

    def tokens(text: str) -> int:
        nonlocal failed
        try:
            return count(text)
        except Exception as exc:
            if not failed:
                failed = True
                log.warning(
                    "session %r: SessionConfig.tokenizer failed (%r); estimating instead for the text it fails on",
                    session_id,
                    exc,
                )
            return estimate_tokens(text)

    return tokens


@attrs.frozen
class Budget:
    """Bounds on a run of episodes (``tokens`` ``None``: not bounded by tokens)."""

    episodes: int
    chars: int
    tokens: int | None = None

    def holds(self, episodes: int, chars: int, tokens: int) -> bool:
        return episodes <= self.episodes and chars <= self.chars and (self.tokens is None or tokens <= self.tokens)

    def scaled(self, fraction: float) -> Budget:
        """The low-water mark: ``fraction`` of each bound (at least one episode)."""
        return Budget(
            max(1, int(self.episodes * fraction)),
            int(self.chars * fraction),
            None if self.tokens is None else int(self.tokens * fraction),
        )


class RawWindow:
    """The live episodes after the summary, split into evicted and windowed."""

    __slots__ = (
        "_base",
        "_budget",
        "_call_at",
        "_count_tokens",
        "_counted",
        "_counted_total",
        "_eager_tokens",
        "_links",
        "_low_water",
        "_result_at",
        "_sizes",
        "_uncounted",
        "_window_chars",
        "_window_tokens",
        "evicted",
        "raw",
    )

    def __init__(
        self, budget: Budget, evict_to: float, count_tokens: Tokenizer, *, eager_tokens: bool | None = None
    ) -> None:
        self._budget = budget
        # Counted as episodes enter only when a bound needs them; else when first read.
        self._eager_tokens = budget.tokens is not None if eager_tokens is None else eager_tokens
        self._counted: list[int | None] = []
        # Their sum, and how many at the end are not counted yet (always a suffix): a read costs
        # what entered since the last one, not the whole window.
        self._counted_total = 0
        self._uncounted = 0
        self._low_water = budget.scaled(evict_to)
        self._count_tokens = count_tokens
        self.raw: list[Episode] = []
        self.evicted = 0
        self._sizes: list[tuple[int, int]] = []  # (characters, tokens) of each raw episode
        self._links: list[ToolLinks] = []
        self._base = 0  # position of raw[0]; positions never change while an episode is raw
        self._call_at: dict[str, int] = {}  # call id -> position of the episode making it
        self._result_at: dict[str, int] = {}  # call id -> position of its (last) result
        self._window_chars = 0
        self._window_tokens = 0

    # -- changes -------------------------------------------------------------

    def reset(self, episodes: Iterable[Episode], evicted_through: int = 0) -> None:
        """Start over from the live episodes after the summary (activation, clear, delete).

        Those up to ``evicted_through`` (the stored boundary) stay evicted;
        then the rules are applied to the rest, as if it had just arrived.
        """
        self.raw, self._sizes, self._links, self._counted = [], [], [], []
        self._counted_total = self._uncounted = 0
        self._call_at, self._result_at = {}, {}
        self._base = self.evicted = self._window_chars = self._window_tokens = 0
        for episode in episodes:
            self._enter(episode)
        kept = 0
        while kept < len(self.raw) and self.raw[kept].seq <= evicted_through:  # type: ignore[operator]
            kept += 1
        must = kept
        for index in range(kept, len(self.raw)):
            if self._orphaned(index, must):
                must = index + 1
        self._evict(must, must)  # the stored boundary first: it was decided already
        if not self._fits(self._budget):
            self._evict(self._chunk_start())

    def append(self, episodes: Iterable[Episode]) -> None:
        """Add new episodes at the end, one at a time, evicting by the rules above."""
        for episode in episodes:
            links = self._enter(episode)
            index = len(self.raw) - 1
            must = index + 1 if links.results and self._orphaned(index, self.evicted) else 0
            if not self._fits(self._budget):
                self._evict(self._chunk_start(), must)
            elif must:
                self._evict(must, must)

    def drop_through(self, seq: int) -> int:
        """Forget the episodes now covered by a summary through ``seq``; return how many."""
        raw = self.raw
        covered = bisect.bisect_right(raw, seq, 0, self.evicted, key=_seq_of)  # raw is in seq order
        limit = self._base + covered  # positions below it leave the window's bookkeeping
        for links in self._links[:covered] if self._call_at or self._result_at else ():
            # An id may be used again by a later episode (ids numbered per turn): only entries
            # pointing at a dropped episode go, so the later call keeps its group whole.
            for call_id in links.calls:
                if self._call_at.get(call_id, limit) < limit:
                    del self._call_at[call_id]
            for call_id in links.results:
                if self._result_at.get(call_id, limit) < limit:
                    del self._result_at[call_id]
        del raw[:covered]
        del self._sizes[:covered]
        dropped = self._counted[:covered]
        uncounted = dropped.count(None)
        self._uncounted -= uncounted
        if uncounted < covered:
            self._counted_total -= sum([tokens for tokens in dropped if tokens is not None])
        del self._counted[:covered]
        del self._links[:covered]
        self._base += covered
        self.evicted -= covered
        return covered

    # -- what it holds --------------------------------------------------------

    @property
    def pending(self) -> list[Episode]:
        """Evicted episodes waiting for their summary, oldest first."""
        return self.raw[: self.evicted]

    @property
    def evicted_through(self) -> int | None:
        """Seq of the newest evicted episode, or ``None`` when none waits."""
        return self.raw[self.evicted - 1].seq if self.evicted else None

    @property
    def window(self) -> list[Episode]:
        """The episodes in the window (after the evicted ones)."""
        return self.raw[self.evicted :]

    @property
    def tokens(self) -> int:
        """Tokens of every raw episode, evicted ones included (each counted once)."""
        counted = self._counted
        for index in range(len(counted) - self._uncounted, len(counted)):
            tokens = self._count_tokens(self.raw[index].content)
            counted[index] = tokens
            self._counted_total += tokens
        self._uncounted = 0
        return self._counted_total

    def newest_within(self, tokens: int) -> tuple[int, int]:
        """Where a view of at most ``tokens`` tokens starts, and its tokens: the newest raw episodes that fit.

        The start never separates a result from its call (it moves on past
        the group instead), so the view is still a valid request prefix.
        """
        total = self.tokens  # (counts every raw episode not counted yet: each is counted once)
        if total <= tokens:
            return 0, total
        counted: list[int] = self._counted  # type: ignore[assignment]
        start = len(counted)
        shown = 0
        while start and shown + counted[start - 1] <= tokens:
            start -= 1
            shown += counted[start]
        safe = self._group_closure(0, start)
        if safe > start:
            shown -= sum(counted[start:safe])
        return safe, shown

    def sizes(self, count: int) -> list[tuple[int, int]]:
        """Characters and tokens of ``raw[:count]``."""
        return self._sizes[:count]

    def batch_end(self, limit: int, fits: Callable[[int, int, int], bool]) -> int:
        """How many pending episodes the next summary batch takes: a group-safe cut.

        At most ``limit`` episodes, while ``fits(episodes, chars, tokens)``
        holds; never between a tool call and its results (a summary through
        the cut must not leave a result raw without its call). At least the
        first episode, or the first whole tool group when the cut would split it.
        """
        end = 0
        chars = tokens = 0
        last = min(limit, self.evicted)
        sizes = self._sizes
        while end < last:
            more_chars, more_tokens = sizes[end]
            if end and not fits(end + 1, chars + more_chars, tokens + more_tokens):
                break
            chars += more_chars
            tokens += more_tokens
            end += 1
        if end == 0:
            return 0
        safe = self._safe_cut_at_or_before(end)
        if safe == 0:
            safe = self._group_closure(0, end)  # one group larger than a batch: it goes whole
        return min(safe, self.evicted)

    # -- internals ------------------------------------------------------------

    def _enter(self, episode: Episode) -> ToolLinks:
        chars = len(episode.content)
        tokens = self._count_tokens(episode.content) if self._eager_tokens else 0  # 0: no bound needs it yet
        links = tool_links(episode.metadata) if episode.metadata else NO_LINKS  # most episodes have none
        position = self._base + len(self.raw)
        self.raw.append(episode)
        self._sizes.append((chars, tokens))
        if self._eager_tokens:
            self._counted.append(tokens)
            self._counted_total += tokens
        else:
            self._counted.append(None)
            self._uncounted += 1
        self._links.append(links)
        for call_id in links.calls:
            self._call_at[call_id] = position
        for call_id in links.results:
            self._result_at[call_id] = position
        self._window_chars += chars
        self._window_tokens += tokens
        return links

    def _fits(self, budget: Budget) -> bool:
        return budget.holds(len(self.raw) - self.evicted, self._window_chars, self._window_tokens)

    def _chunk_start(self) -> int:
        """Where the window starts once evicted down to the low-water mark."""
        index = self.evicted
        end = len(self.raw)
        count = end - index
        chars, tokens = self._window_chars, self._window_tokens
        low = self._low_water
        max_tokens = math.inf if low.tokens is None else low.tokens  # (Budget.holds, unrolled: once per episode)
        sizes = self._sizes
        while index < end and (count > low.episodes or chars > low.chars or tokens > max_tokens):
            more_chars, more_tokens = sizes[index]
            chars -= more_chars
            tokens -= more_tokens
            count -= 1
            index += 1
        return index

    def _orphaned(self, index: int, window_start: int) -> bool:
        """Whether ``raw[index]`` answers a call that is not in the window starting at ``window_start``."""
        for call_id in self._links[index].results:
            call = self._call_at.get(call_id)
            if call is None or call - self._base < window_start:
                return True
        return False

    def _evict(self, target: int, must: int = 0) -> None:
        """Start the window at ``target`` (for a budget) and at least ``must`` (for a result without its call).

        The start moves forward to where no tool group is cut in two; for a
        budget, not past a call still waiting for its result (see the module
        docstring). It never moves backwards.
        """
        start = self._group_closure(self.evicted, max(target, must))
        pinned = self._oldest_open_call(self.evicted, start)
        if pinned is not None and not self._far_over_budget():
            # A call waiting for its result stays (with everything after it): start before its group.
            start = max(self._safe_cut_at_or_before(pinned), self._group_closure(self.evicted, must))
        if start <= self.evicted:
            return
        for chars, tokens in self._sizes[self.evicted : start]:
            self._window_chars -= chars
            self._window_tokens -= tokens
        self.evicted = start

    def _group_closure(self, lower: int, target: int) -> int:
        """The first index at or after ``target`` where no tool group of ``raw[lower:]`` is cut in two."""
        if not self._call_at:
            return min(target, len(self.raw))  # no tool call in the raw window: no group to keep whole
        index = lower
        end = target
        while index < end:
            for call_id in self._links[index].calls:
                result = self._result_at.get(call_id)
                if result is not None and result - self._base >= end:
                    end = result - self._base + 1
            index += 1
        return min(end, len(self.raw))

    def _safe_cut_at_or_before(self, cut: int) -> int:
        """The last index at or before ``cut`` that cuts no tool group in two (0 if none)."""
        if not self._call_at:
            return cut  # no tool call in the raw window
        while cut > 0:
            crossing = None
            for index in range(cut):
                for call_id in self._links[index].calls:
                    result = self._result_at.get(call_id)
                    if (result is None and index >= self.evicted) or (
                        result is not None and result - self._base >= cut
                    ):
                        crossing = index if crossing is None else min(crossing, index)
            if crossing is None:
                return cut
            cut = crossing
        return 0

    def _oldest_open_call(self, lower: int, upper: int) -> int | None:
        """Index of the first episode in ``raw[lower:upper]`` with a call no result answered yet."""
        if not self._call_at:
            return None  # no tool call in the raw window
        for index in range(lower, upper):
            if any(call_id not in self._result_at for call_id in self._links[index].calls):
                return index
        return None

    def _far_over_budget(self) -> bool:
        """Past twice a budget: a call that never got its result no longer holds the window."""
        budget = self._budget
        doubled = Budget(budget.episodes * 2, budget.chars * 2, None if budget.tokens is None else budget.tokens * 2)
        return not self._fits(doubled)


def window_of(
    episodes: Sequence[Episode], budget: Budget, evict_to: float, count_tokens: Tokenizer, evicted_through: int = 0
) -> RawWindow:
    """A window holding ``episodes`` (a convenience for tests and tools)."""
    window = RawWindow(budget, evict_to, count_tokens)
    window.reset(episodes, evicted_through)
    return window
