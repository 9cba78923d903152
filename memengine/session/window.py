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
  everything before it. A result answers the nearest earlier call of its id
  still unanswered (ids may be reused, ``call_0`` every turn), else the
  newest call of its id (a second result). A call whose result was deleted
  waits no more: a seq missing after it (seqs are never reused) says that
  something after it was deleted, and it no longer holds the window. A
  Responses reasoning item and the item after it (a call, a message) are
  evicted together too: the API refuses either without the other.
- **Boundaries are kept.** Once evicted, an episode stays evicted: the
  boundary is stored (``evicted_through``), and a session loaded again shows
  the window it had.

Each episode's size (characters, tokens) and tool links are computed once,
when it enters, and kept with it: a read adds up nothing (the total is kept
as episodes enter and leave), and a reset (a delete, a clear) keeps the counts
of the episodes it keeps. A content of :data:`~memengine.tokens.OFF_LOOP_CHARS`
characters or more is counted before it enters, in a worker thread (the add's
caller counts it, or the activation, see :func:`~memengine.tokens.count_large`):
:meth:`RawWindow.expect` hands those counts in. Appending costs time
proportional to what it evicts, not to the window or the history, also while
a call waits for its result (the oldest waiting call is known without a scan).

**Old tool outputs are clipped** (with ``SessionConfig.tool_clipping``, see
:mod:`memengine.clipping`): ``raw`` holds each episode as the session shows
it, a tool result older than the newest ``keep_turns`` episodes clipped, and
the budgets count it at its clipped size, so clipping delays eviction. Each
append makes exactly one more episode "older than the newest N" (the episode
N back): it is clipped then, once, and the running totals take the
difference; a reset judges again from its live episodes (a delete can make an
old episode one of the newest again), reusing the clips it made. What the
summarizer reads, :attr:`RawWindow.pending` and :meth:`RawWindow.sizes`, is
the stored episode, whole.
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
from collections.abc import Callable, Iterable, Sequence

import attrs

from ..attachments import counting_attachments, metadata_tokens
from ..clipping import ToolClipping, clip_episode, clipped_tokens
from ..config import SessionConfig
from ..episode import Episode
from ..episode_shapes import is_reasoning
from ..tokens import Tokenizer, checked, estimate_tokens
from ..tool_calls import NO_LINKS, ToolLinks, tool_links

log = logging.getLogger("memengine.session")

_seq_of = operator.attrgetter("seq")


def tokenizer_of(config: SessionConfig, session_id: str) -> Tokenizer:
    """The session's token counter: the configured one, or the offline estimate.

    Either way an image, file or audio part in a content (a base64 data URL)
    counts as providers count it, not as its base64 text (see
    :mod:`memengine.attachments`). A configured tokenizer that fails on some text (it was checked when the
    engine opened) does not fail the add, which is stored by then: that text is
    estimated instead, and the failure logged once per session.
    """
    if config.tokenizer is None:
        return counting_attachments(estimate_tokens)
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

    return counting_attachments(tokens)


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
        "_answered_from",
        "_base",
        "_bonded",
        "_budget",
        "_clipping",
        "_count_tokens",
        "_doubled",
        "_expected",
        "_judged",
        "_last_seq",
        "_links",
        "_low_water",
        "_measured",
        "_newest_call",
        "_raw_tokens",
        "_reach",
        "_sizes",
        "_unanswered",
        "_unclipped",
        "_waiting",
        "_window_chars",
        "_window_tokens",
        "evicted",
        "raw",
    )

    def __init__(
        self, budget: Budget, evict_to: float, count_tokens: Tokenizer, clipping: ToolClipping | None = None
    ) -> None:
        self._budget = budget
        self._clipping = clipping
        # Clipped episodes: position -> the stored episode, whole, and its (characters, tokens).
        self._unclipped: dict[int, tuple[Episode, int, int]] = {}
        self._judged = 0  # raw[:_judged] were judged for clipping (older than the newest keep_turns)
        self._raw_tokens = 0  # tokens of every raw episode: what a read reports, kept up to date
        self._expected: dict[str, int] = {}  # counts made before the contents enter (see expect)
        self._measured: dict[str, tuple[Episode, int, ToolLinks]] = {}  # by episode id: see measure
        self._low_water = budget.scaled(evict_to)
        self._doubled = budget.scaled(2)  # past it, a call waiting for its result no longer holds the window
        self._count_tokens = count_tokens
        self.raw: list[Episode] = []
        self.evicted = 0
        self._sizes: list[tuple[int, int]] = []  # (characters, tokens) of each raw episode
        self._links: list[ToolLinks] = []
        self._base = 0  # position of raw[0]; positions never change while an episode is raw
        # Tool calls and results, paired by position (ids may be reused: call_0 every turn). A result
        # answers the newest unanswered call of its id, else (a second result) the newest call of its id.
        self._unanswered: dict[str, list[int]] = {}  # call id -> positions of its unanswered calls, oldest first
        self._newest_call: dict[str, int] = {}  # call id -> position of the newest call with it
        # Positions of episodes with calls waiting for a result, oldest first, and how many calls each:
        # the oldest one holds the window (found without a scan). A call whose result was deleted waits no more.
        self._waiting: dict[int, int] = {}
        self._reach: list[int] = []  # per raw episode: position of the last result of its calls (else its own)
        self._answered_from: list[int] = []  # per raw episode: oldest call its results answer (-1: a call not raw)
        self._last_seq: int | None = None
        self._bonded: set[int] = set()  # positions of reasoning items whose reach is the item after them
        self._window_chars = 0
        self._window_tokens = 0

    # -- changes -------------------------------------------------------------

    def reset(self, episodes: Iterable[Episode], evicted_through: int = 0, last_seq: int | None = None) -> None:
        """Start over from the live episodes after the summary (activation, clear, delete).

        Those up to ``evicted_through`` (the stored boundary) stay evicted;
        then the rules are applied to the rest, as if it had just arrived.
        ``last_seq`` is the highest seq the session assigned: seqs are never
        reused, so a seq missing after a call (up to ``last_seq``) is a deleted
        episode, and a call with no result before such a gap waits no more
        (its result may be what was deleted): it no longer holds the window.
        """
        # The episodes kept (a delete, a clear, an activation after passivation in the same process)
        # keep their counts: an episode is counted once.
        known = {(episode.seq, episode.id): tokens for episode, (_, tokens) in zip(self.raw, self._sizes, strict=True)}
        clips: dict[tuple[int | None, str], tuple[Episode, int, int]] = {}  # and the clips made: made once
        for position, (whole, _, tokens) in self._unclipped.items():
            clipped = self.raw[position - self._base]
            known[whole.seq, whole.id] = tokens
            clips[whole.seq, whole.id] = (clipped, *self._sizes[position - self._base])
        self._unclipped, self._judged = {}, 0
        self.raw, self._sizes, self._links = [], [], []
        self._reach, self._answered_from = [], []
        self._raw_tokens = 0
        self._unanswered, self._newest_call, self._waiting = {}, {}, {}
        self._bonded = set()
        self._base = self.evicted = self._window_chars = self._window_tokens = 0
        self._last_seq = None
        gap_before = 0  # index of the newest episode after a deleted one
        for episode in episodes:
            if self._last_seq is not None and episode.seq is not None and episode.seq > self._last_seq + 1:
                gap_before = len(self.raw)
            self._enter(episode, known.get((episode.seq, episode.id)))
        self._expected.clear()
        self._measured.clear()
        if self._clipping is not None:
            self._clip_older(self._clipping, clips)
        if last_seq is not None and self._last_seq is not None and last_seq > self._last_seq:
            gap_before = len(self.raw)
        if gap_before and self._waiting:
            self._waiting = {position: count for position, count in self._waiting.items() if position >= gap_before}
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

    def append(self, episodes: Iterable[Episode], *, last: bool = True) -> None:
        """Add new episodes at the end, one at a time, evicting by the rules above.

        ``last=False``: more of the same append follow (session/large_entry.py),
        so the counts expected for its contents are kept for them.
        """
        for episode in episodes:
            links = self._enter(episode, None)
            if self._clipping is not None:
                self._clip_older(self._clipping)  # before the budgets are checked: a clip may make room
            index = len(self.raw) - 1
            must = index + 1 if links.results and self._orphaned(index, self.evicted) else 0
            if not self._fits(self._budget):
                if not must and self._held_open():
                    continue  # a call waiting for its result holds the window where it is: nothing to scan
                self._evict(self._chunk_start(), must)
            elif must:
                self._evict(must, must)
        if last:
            self._expected.clear()
            self._measured.clear()

    def measure(self, episodes: Iterable[Episode]) -> None:
        """Count the tokens and find the tool links of episodes about to be appended, ahead of the append.

        The session calls it while their commit runs in the store's thread,
        so the work is done while the loop would otherwise wait for it; the
        next :meth:`append` (or :meth:`reset`) takes what it finds here for
        the episodes it enters, then forgets the rest. It takes a measure only
        for the very contents and metadata measured (the stored episode shares
        them with the one added): an id added twice with other contents, of
        which the store keeps the first, is measured again as it enters.
        """
        measured = self._measured
        for episode in episodes:
            measured[episode.id] = (episode, *self._measure(episode))

    def forget_measured(self) -> None:
        """Drop what :meth:`measure` found (its append failed, or stored nothing new)."""
        self._measured.clear()

    def expect(self, counts: dict[str, int]) -> None:
        """Token counts of contents about to enter (by the next append or reset), counted beforehand.

        The next :meth:`append` or :meth:`reset` takes them instead of counting
        those contents again, then forgets them; so do the next counts expected.
        """
        self._expected = counts

    def uncounted(self, episodes: Iterable[Episode]) -> list[str]:
        """The contents of ``episodes`` a :meth:`reset` to them would count (those it does not hold counted).

        A delete can bring back episodes a summary covered (it deletes the
        summaries through what it deletes): their large contents are to be
        counted off the event loop, as at activation, and handed in by :meth:`expect`.
        """
        held = {(episode.seq, episode.id) for episode in self.raw}
        return [episode.content for episode in episodes if (episode.seq, episode.id) not in held]

    def drop_through(self, seq: int) -> int:
        """Forget the episodes now covered by a summary through ``seq``; return how many."""
        raw = self.raw
        covered = bisect.bisect_right(raw, seq, 0, self.evicted, key=_seq_of)  # raw is in seq order
        limit = self._base + covered  # positions below it leave the window's bookkeeping
        for links in self._links[:covered] if self._newest_call else ():
            # An id may be used again by a later episode (ids numbered per turn): only entries
            # pointing at a dropped episode go, so the later call keeps its group whole.
            for call_id in links.calls:
                if self._newest_call.get(call_id, limit) < limit:
                    del self._newest_call[call_id]
                unanswered = self._unanswered.get(call_id)
                if unanswered and unanswered[0] < limit:
                    unanswered[:] = [position for position in unanswered if position >= limit]
                    if not unanswered:
                        del self._unanswered[call_id]
        for position in [position for position in self._waiting if position < limit] if self._waiting else ():
            del self._waiting[position]
        if self._bonded:
            self._bonded = {position for position in self._bonded if position >= limit}
        del self._reach[:covered]
        del self._answered_from[:covered]
        del raw[:covered]
        self._raw_tokens -= sum([tokens for _, tokens in self._sizes[:covered]])
        del self._sizes[:covered]
        del self._links[:covered]
        if self._unclipped:
            for position in [position for position in self._unclipped if position < limit]:
                del self._unclipped[position]
        self._judged = max(0, self._judged - covered)
        self._base += covered
        self.evicted -= covered
        return covered

    # -- what it holds --------------------------------------------------------

    @property
    def pending(self) -> list[Episode]:
        """Evicted episodes waiting for their summary, oldest first: as stored, never clipped."""
        pending = self.raw[: self.evicted]
        if self._unclipped:
            base, unclipped = self._base, self._unclipped
            for index in range(len(pending)):
                whole = unclipped.get(base + index)
                if whole is not None:
                    pending[index] = whole[0]
        return pending

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
        """Tokens of every raw episode as shown (clipped), evicted ones included (each counted once)."""
        return self._raw_tokens

    def newest_within(self, tokens: int) -> tuple[int, int]:
        """Where a view of at most ``tokens`` tokens starts, and its tokens: the newest raw episodes that fit.

        The start never separates a result from its call (it moves on past
        the group instead), so the view is still a valid request prefix.
        """
        total = self.tokens  # kept up to date as episodes enter and leave: nothing is counted here
        if total <= tokens:
            return 0, total
        sizes = self._sizes  # (characters, tokens) of each raw episode as shown
        start = len(sizes)
        shown = 0
        while start and shown + sizes[start - 1][1] <= tokens:
            start -= 1
            shown += sizes[start][1]
        safe = self._group_closure(0, start)
        if safe > start:
            shown -= sum(size[1] for size in sizes[start:safe])
        return safe, shown

    def sizes(self, count: int) -> list[tuple[int, int]]:
        """Characters and tokens of ``pending[:count]``: of the stored episodes, never clipped."""
        sizes = self._sizes[:count]
        if self._unclipped:
            base, unclipped = self._base, self._unclipped
            for index in range(len(sizes)):
                whole = unclipped.get(base + index)
                if whole is not None:
                    sizes[index] = whole[1:]
        return sizes

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
        sizes = self.sizes(last) if self._unclipped else self._sizes  # (the summarizer reads them whole)
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

    def _measure(self, episode: Episode, tokens: int | None = None) -> tuple[int, ToolLinks]:
        """The episode's tokens (``tokens``, if counted already) and tool links."""
        if tokens is None:
            expected = self._expected
            tokens = expected.get(episode.content) if expected else None
            if tokens is None:
                tokens = self._count_tokens(episode.content)
            if episode.metadata:  # an image kept in a provider's message there counts as one
                tokens += metadata_tokens(episode.metadata)
        return tokens, tool_links(episode.metadata) if episode.metadata else NO_LINKS  # most episodes have none

    def _enter(self, episode: Episode, tokens: int | None) -> ToolLinks:
        content = episode.content
        chars = len(content)
        measured = self._measured.pop(episode.id, None) if self._measured and tokens is None else None
        if measured is not None and measured[0].content is content and measured[0].metadata is episode.metadata:
            _, tokens, links = measured
        else:
            tokens, links = self._measure(episode, tokens)
        position = self._base + len(self.raw)
        self.raw.append(episode)
        self._sizes.append((chars, tokens))
        self._raw_tokens += tokens
        self._links.append(links)
        self._reach.append(position)
        self._answered_from.append(position)
        if episode.seq is not None:
            self._last_seq = episode.seq
        if len(self.raw) > 1 and is_reasoning(self.raw[-2]):
            # A reasoning item and the item after it go together: the API refuses either without the other.
            self._reach[-2] = max(self._reach[-2], position)
            self._bonded.add(position - 1)
        if links:
            self._pair(links, position)
        self._window_chars += chars
        self._window_tokens += tokens
        return links

    def _clip_older(
        self, clipping: ToolClipping, clips: dict[tuple[int | None, str], tuple[Episode, int, int]] | None = None
    ) -> None:
        """Clip the tool results that are now older than the newest ``keep_turns`` episodes (each judged once)."""
        end = len(self.raw) - clipping.keep_turns
        while self._judged < end:
            index = self._judged
            self._judged += 1
            if not self._links[index].results:
                continue
            whole = self.raw[index]
            made = clips.get((whole.seq, whole.id)) if clips else None
            if made is None:
                clipped = clip_episode(whole, clipping)
                if clipped is None:
                    continue
                made = (clipped, len(clipped.content), clipped_tokens(clipped, self._count_tokens))
            clipped, chars, tokens = made
            whole_chars, whole_tokens = self._sizes[index]
            self._unclipped[self._base + index] = (whole, whole_chars, whole_tokens)
            self.raw[index] = clipped
            self._sizes[index] = (chars, tokens)
            self._raw_tokens += tokens - whole_tokens
            if index >= self.evicted:
                self._window_chars += chars - whole_chars
                self._window_tokens += tokens - whole_tokens

    def _pair(self, links: ToolLinks, position: int) -> None:
        """Pair the results of the episode at ``position`` with their calls (its own calls first)."""
        for call_id in links.calls:
            self._unanswered.setdefault(call_id, []).append(position)
            self._newest_call[call_id] = position
            self._waiting[position] = self._waiting.get(position, 0) + 1
        answered_from = position
        for call_id in links.results:
            unanswered = self._unanswered.get(call_id)
            if unanswered:
                call = unanswered.pop()
                if not unanswered:
                    del self._unanswered[call_id]
                waiting = self._waiting.get(call)
                if waiting == 1:
                    del self._waiting[call]
                elif waiting:
                    self._waiting[call] = waiting - 1
            else:
                call = self._newest_call.get(call_id, -1)  # a second result of a call, or a result without one
            answered_from = min(answered_from, call)
            if call >= 0:
                index = call - self._base
                self._reach[index] = max(self._reach[index], position)
        self._answered_from[-1] = answered_from

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
        return self._answered_from[index] - self._base < window_start

    def _evict(self, target: int, must: int = 0) -> None:
        """Start the window at ``target`` (for a budget) and at least ``must`` (for a result without its call).

        The start moves forward to where no tool group is cut in two; for a
        budget, not past a call still waiting for its result (see the module
        docstring). It never moves backwards.
        """
        target = max(target, must)
        pinned = self._oldest_waiting()
        if pinned is not None and self._far_over_budget():
            pinned = None
        start = target if pinned is not None and pinned < target else self._group_closure(self.evicted, target)
        if pinned is not None and pinned < start:
            # A call waiting for its result stays (with everything after it): start before its group.
            start = max(self._safe_cut_at_or_before(pinned, self.evicted), self._group_closure(self.evicted, must))
        if start <= self.evicted:
            return
        for chars, tokens in self._sizes[self.evicted : start]:
            self._window_chars -= chars
            self._window_tokens -= tokens
        self.evicted = start

    def _held_open(self) -> bool:
        """Whether a call waiting for its result keeps the window from moving at all (checked before a scan)."""
        pinned = self._oldest_waiting()
        return (
            pinned is not None
            and self._safe_cut_at_or_before(pinned, self.evicted) <= self.evicted
            and not self._far_over_budget()
        )

    def _group_closure(self, lower: int, target: int) -> int:
        """The first index at or after ``target`` where no tool group of ``raw[lower:]`` is cut in two."""
        if not self._newest_call and not self._bonded:
            return min(target, len(self.raw))  # no tool call or reasoning in the raw window: no group to keep whole
        reach, base = self._reach, self._base
        index = lower
        end = target
        while index < end:
            last = reach[index] - base + 1
            if last > end:
                end = last
            index += 1
        return min(end, len(self.raw))

    def _safe_cut_at_or_before(self, cut: int, lower: int = 0) -> int:
        """The last index in ``lower..cut`` where no tool group of ``raw[lower:]`` is cut in two (else ``lower``).

        A call of the window still waiting for its result reaches past any cut after it.
        """
        if not self._newest_call and not self._bonded:
            return cut  # no tool call or reasoning in the raw window
        reach, base, waiting, evicted = self._reach, self._base, self._waiting, self.evicted
        safe = lower
        furthest = -1  # the last index a group starting before ``index`` reaches
        for index in range(lower, cut):
            if furthest < index:
                safe = index
            if index >= evicted and index + base in waiting:
                furthest = cut  # its result will come after any cut
                break
            furthest = max(furthest, reach[index] - base)
        if furthest < cut:
            safe = cut
        return safe

    def _oldest_waiting(self) -> int | None:
        """Index of the oldest episode of the window with a call waiting for its result (no scan)."""
        waiting = self._waiting
        if not waiting:
            return None
        start = self._base + self.evicted
        gone = []  # waiting calls that left the window (past twice a budget): they hold it no more
        oldest = None
        for position in waiting:
            if position >= start:
                oldest = position - self._base
                break
            gone.append(position)
        for position in gone:
            del waiting[position]
        return oldest

    def _far_over_budget(self) -> bool:
        """Past twice a budget: a call that never got its result no longer holds the window."""
        return not self._fits(self._doubled)


def window_of(
    episodes: Sequence[Episode],
    budget: Budget,
    evict_to: float,
    count_tokens: Tokenizer,
    evicted_through: int = 0,
    clipping: ToolClipping | None = None,
) -> RawWindow:
    """A window holding ``episodes`` (a convenience for tests and tools)."""
    window = RawWindow(budget, evict_to, count_tokens, clipping)
    window.reset(episodes, evicted_through)
    return window
