"""The raw window keeps its rules whatever the sequence of events.

Budgets (episodes, characters, tokens) evicted in chunks down to a low-water
mark, tool calls never separated from their results, boundaries that only
move forward and survive a reload, and summary batches that never cut a tool
group: checked after every step of random scripts, against the definitions.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from memengine import Episode
from memengine.episode import with_seq
from memengine.session.window import Budget, RawWindow
from memengine.tool_calls import CALLS_KEY, RESULT_OF_KEY, tool_links


def numbered(role: str, content: str, *, seq: int, metadata: dict | None = None) -> Episode:
    """An episode as the store hands it to the window: stamped with its seq."""
    return with_seq(Episode(role, content, metadata=metadata or {}), seq)


def words(text: str) -> int:
    return len(text.split())


plain = st.tuples(st.just("plain"), st.integers(1, 30))
calling = st.tuples(st.just("call"), st.integers(1, 3))  # an episode making 1-3 calls
answering = st.tuples(st.just("result"), st.integers(0, 10))  # answers one of the calls made so far (or none)
stray = st.tuples(st.just("stray"), st.just(0))  # answers a call never made
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"), st.lists(st.one_of(plain, plain, calling, answering, answering, stray), max_size=5)
        ),
        st.tuples(st.just("summarize"), st.integers(1, 50)),
        st.tuples(st.just("delete"), st.integers(0, 50)),
    ),
    max_size=40,
)


class Script:
    """The episodes of a script's steps: call ids new for each call, or drawn from two (``call_0``, ``call_1``)."""

    def __init__(self, *, reused_ids: bool) -> None:
        self.reused_ids = reused_ids
        self.seqs = itertools.count(1)
        self.call_ids = itertools.count(1)
        self.calls: list[str] = []  # calls made (with reused ids: those not answered yet)
        self.last_seq = 0

    def episodes(self, step: list[tuple[str, int]]) -> list[Episode]:
        new = []
        for kind, size in step:
            seq = self.last_seq = next(self.seqs)
            metadata: dict = {}
            if kind == "call":
                if self.reused_ids:
                    made = [f"call_{n}" for n in range(min(size, 2))]
                else:
                    made = [f"c{next(self.call_ids)}" for _ in range(size)]
                self.calls.extend(made)
                metadata = {CALLS_KEY: made}
            elif kind == "result" and self.calls:
                pick = size % len(self.calls)
                metadata = {RESULT_OF_KEY: self.calls.pop(pick) if self.reused_ids else self.calls[pick]}
            elif kind == "stray":
                metadata = {RESULT_OF_KEY: "call_1" if self.reused_ids else f"never-made-{seq}"}
            new.append(numbered("user", " ".join(["w"] * (size if kind == "plain" else 2)), seq=seq, metadata=metadata))
        return new

    def delete(self, window: RawWindow, which: int) -> None:
        """A delete: the session is loaded again without one episode (seqs stay unique: a gap)."""
        if window.raw:
            kept = [episode for n, episode in enumerate(window.raw) if n != which % len(window.raw)]
            window.reset(kept, window.evicted_through or 0, last_seq=self.last_seq)


def is_valid_prefix(raw: list[Episode], start: int, *, shown_from: int | None = None) -> bool:
    """Every result in ``raw[start:]`` has its call there before it; no call before ``start`` has a result after.

    With ``shown_from`` (the window's start), a result before it whose call is
    not raw at all (never added, or abandoned and summarized) is let pass: it
    was evicted at once and shows only until its summary is stored.
    """
    called_at: dict[str, int] = {}
    made = {c for e in raw for c in tool_links(e.metadata).calls}
    for index, episode in enumerate(raw):
        links = tool_links(episode.metadata)
        for call_id in links.results:
            if shown_from is not None and index < shown_from and call_id not in made:
                continue
            if index >= start and called_at.get(call_id, -1) < start:
                return False
        for call_id in links.calls:
            called_at[call_id] = index
    shown_results = {c for e in raw[start:] for c in tool_links(e.metadata).results}
    return not any(set(tool_links(e.metadata).calls) & shown_results for e in raw[:start])


def open_call_shown(raw: list[Episode], start: int) -> bool:
    answered = {c for e in raw for c in tool_links(e.metadata).results}
    return any(c not in answered for e in raw[start:] for c in tool_links(e.metadata).calls)


@settings(max_examples=300, deadline=None)
@given(
    max_episodes=st.integers(1, 8),
    max_chars=st.integers(1, 120),
    max_tokens=st.one_of(st.none(), st.integers(1, 30)),
    evict_to=st.sampled_from([0.25, 0.5, 1.0]),
    script=steps,
)
def test_the_window_keeps_its_rules(max_episodes, max_chars, max_tokens, evict_to, script) -> None:
    budget = Budget(max_episodes, max_chars, max_tokens)
    low_water = budget.scaled(evict_to)
    window = RawWindow(budget, evict_to, words)
    history = Script(reused_ids=False)
    for step, (action, argument) in enumerate(script):
        if action == "append":
            new = history.episodes(argument)
            before = window.evicted
            window.append(new)
            assert window.evicted >= before  # eviction never goes back
            shown = window.window
            sizes = (len(shown), sum(len(e.content) for e in shown), sum(words(e.content) for e in shown))
            if not budget.holds(*sizes):
                # Only a call still waiting for its result holds the window over budget, never past twice it.
                doubled = Budget(max_episodes * 2, max_chars * 2, None if max_tokens is None else max_tokens * 2)
                assert open_call_shown(window.raw, window.evicted)
                assert doubled.holds(*sizes) or budget.holds(sizes[0] - 1, 0, 0) or len(shown) == 1
            elif len(new) == 1 and window.evicted > before and not open_call_shown(window.raw, before):
                # An eviction for a budget goes down to the low-water mark (or further, to keep a group whole).
                assert low_water.holds(*sizes) or any(tool_links(e.metadata) for e in window.raw[before:])
        elif action == "delete":
            history.delete(window, argument)
        elif window.evicted:
            end = window.batch_end(argument, lambda episodes, chars, tokens: chars <= 60)
            assert 1 <= end <= window.evicted
            assert is_valid_prefix(window.raw, end, shown_from=window.evicted)  # the cut leaves no orphan
            dropped = window.drop_through(window.raw[end - 1].seq)
            assert dropped == end
        assert is_valid_prefix(window.raw, window.evicted)
        # What a read returns (pending episodes shown too) is valid, but for results whose call is gone.
        assert is_valid_prefix(window.raw, 0, shown_from=window.evicted)
        if step % 2:  # not after every step: episodes not yet counted may also be summarized away
            assert window.tokens == sum(words(e.content) for e in window.raw)
        # A reload from the store (the episodes and the boundary) shows the same window.
        fresh = RawWindow(budget, evict_to, words)
        fresh.reset(window.raw, window.evicted_through or 0, last_seq=history.last_seq)
        assert fresh.evicted == window.evicted


def test_one_llm_call_covers_a_chunk_not_a_turn() -> None:
    window = RawWindow(Budget(20, 10**6), 0.5, words)
    evictions = 0
    for seq in range(1, 201):
        before = window.evicted
        window.append([numbered("user", f"turn {seq}", seq=seq)])
        if window.evicted > before:
            evictions += 1
            assert (window.evicted, len(window.window)) == (11, 10)  # 21 episodes: 11 go, half the budget stays
            window.drop_through(window.evicted_through)
    assert evictions == 17  # 187 evicted episodes, eleven at a time: one summarizer call each


def test_a_late_result_keeps_its_call_in_the_window() -> None:
    window = RawWindow(Budget(4, 10**6), 0.5, words)
    window.append([numbered("assistant", "calling", seq=1, metadata={CALLS_KEY: ["slow"]})])
    window.append([numbered("user", f"chat {seq}", seq=seq) for seq in range(2, 7)])
    assert window.evicted == 0  # the call waits for its result: nothing before it may go
    window.append([numbered("tool", "the result", seq=7, metadata={RESULT_OF_KEY: "slow"})])
    window.append([numbered("user", "one more", seq=8)])
    # Now the group is complete and the window is over budget: call and result leave together.
    assert [e.seq for e in window.window] == [8]
    assert is_valid_prefix(window.raw, window.evicted)


def test_a_call_and_its_results_are_evicted_together() -> None:
    window = RawWindow(Budget(3, 10**6), 1.0, words)
    window.append(
        [
            numbered("assistant", "two calls", seq=1, metadata={CALLS_KEY: ["a", "b"]}),
            numbered("tool", "a done", seq=2, metadata={RESULT_OF_KEY: "a"}),
            numbered("tool", "b done", seq=3, metadata={RESULT_OF_KEY: "b"}),
        ]
    )
    assert window.evicted == 0
    window.append([numbered("user", "thanks", seq=4)])
    assert [e.seq for e in window.window] == [4]  # not [2, 3, 4]: the results never stay without their call


def test_a_result_whose_call_is_gone_is_not_shown_raw() -> None:
    window = RawWindow(Budget(10, 10**6), 0.5, words)
    window.append(
        [numbered("user", "hello", seq=1), numbered("tool", "who called me", seq=2, metadata={RESULT_OF_KEY: "x"})]
    )
    assert window.window == []
    window.append([numbered("user", "next", seq=3)])
    assert [e.seq for e in window.window] == [3]


def test_a_call_id_used_again_after_a_summary_still_keeps_its_group_whole() -> None:
    """Frameworks that number call ids per turn (call_0, call_1, ...) use an id again; the later group stays whole."""
    window = RawWindow(Budget(4, 10**6), 0.5, words)
    window.append(
        [
            numbered("assistant", "first call", seq=1, metadata={CALLS_KEY: ["c"]}),
            numbered("tool", "first result", seq=2, metadata={RESULT_OF_KEY: "c"}),
            *[numbered("user", f"chat {seq}", seq=seq) for seq in range(3, 6)],
            numbered("assistant", "second call, same id", seq=6, metadata={CALLS_KEY: ["c"]}),
            numbered("tool", "second result", seq=7, metadata={RESULT_OF_KEY: "c"}),
        ]
    )
    window.drop_through(2)  # a summary covers the first group: its call id is forgotten, not the second group's
    window.append([numbered("user", "one more", seq=8)])
    assert is_valid_prefix(window.raw, window.evicted)
    assert window.window[0].seq != 7, "a tool result is shown raw without its call"


def turn_with_a_tool_call(seq: int, call_id: str) -> list[Episode]:
    return [
        numbered("user", f"question {seq}", seq=seq),
        numbered("assistant", "calling", seq=seq + 1, metadata={CALLS_KEY: [call_id]}),
        numbered("tool", "result", seq=seq + 2, metadata={RESULT_OF_KEY: call_id}),
        numbered("assistant", f"answer {seq}", seq=seq + 3),
    ]


def test_call_ids_reused_every_turn_keep_the_window_as_full_as_unique_ids() -> None:
    """Models that number calls per turn (call_0 every turn): each result pairs with its own turn's call."""
    sizes = {}
    for ids in ("reused", "unique"):
        window = RawWindow(Budget(16, 10**6), 0.5, words)
        shown = []
        for turn in range(40):
            for episode in turn_with_a_tool_call(turn * 4 + 1, "call_0" if ids == "reused" else f"call_{turn}"):
                window.append([episode])
                if turn >= 5:
                    shown.append(len(window.window))
            if window.evicted:
                window.drop_through(window.evicted_through)
            assert is_valid_prefix(window.raw, window.evicted)
        sizes[ids] = (min(shown), max(shown))
    assert sizes["reused"] == sizes["unique"]
    assert sizes["unique"][0] >= 7


def test_a_call_whose_result_was_deleted_no_longer_holds_the_window() -> None:
    # Seqs 1..4 were stored; the result (3) was deleted: the window is loaded again without it.
    window = RawWindow(Budget(4, 10**6), 0.5, words)
    window.reset(
        [
            numbered("user", "question", seq=1),
            numbered("assistant", "calling", seq=2, metadata={CALLS_KEY: ["c1"]}),
            numbered("assistant", "answer", seq=4),
        ]
    )
    for seq in range(5, 20):
        window.append([numbered("user", f"turn {seq}", seq=seq)])
        assert len(window.window) <= 4, "the call counts as waiting for its result again"
    # The newest episode deleted: the session's last seq says so.
    window = RawWindow(Budget(4, 10**6), 0.5, words)
    window.reset(
        [numbered("user", "question", seq=1), numbered("assistant", "calling", seq=2, metadata={CALLS_KEY: ["c1"]})],
        last_seq=3,
    )
    for seq in range(4, 20):
        window.append([numbered("user", f"turn {seq}", seq=seq)])
        assert len(window.window) <= 4, "the call counts as waiting for its result again"


def pairs_by_position(raw: list[Episode]) -> list[list[int | None]]:
    """For each episode, the index of the call each of its results answers (the rule the window applies)."""
    unanswered: dict[str, list[int]] = {}
    newest: dict[str, int] = {}
    answered: list[list[int | None]] = []
    for index, episode in enumerate(raw):
        links = tool_links(episode.metadata)
        for call_id in links.calls:
            unanswered.setdefault(call_id, []).append(index)
            newest[call_id] = index
        calls: list[int | None] = []
        for call_id in links.results:
            waiting = unanswered.get(call_id)
            calls.append(waiting.pop() if waiting else newest.get(call_id))
        answered.append(calls)
    return answered


@settings(max_examples=300, deadline=None)
@given(max_episodes=st.integers(1, 8), evict_to=st.sampled_from([0.25, 0.5, 1.0]), script=steps)
def test_reused_call_ids_keep_each_group_whole(max_episodes, evict_to, script) -> None:
    """Ids drawn from two (call_0, call_1, as models that number calls per turn): groups are paired by position."""
    window = RawWindow(Budget(max_episodes, 10**6), evict_to, words)
    history = Script(reused_ids=True)
    for action, argument in script:
        if action == "append":
            window.append(history.episodes(argument))
        elif action == "delete":
            history.delete(window, argument)
        elif window.evicted:
            end = window.batch_end(argument, lambda episodes, chars, tokens: episodes <= 3)
            assert all(call is None or call >= end for calls in pairs_by_position(window.raw)[end:] for call in calls)
            window.drop_through(window.raw[end - 1].seq)
        start = window.evicted
        for index, calls in enumerate(pairs_by_position(window.raw)):
            if index >= start:
                assert all(call is not None and call >= start for call in calls), "a result shown without its call"
        fresh = RawWindow(Budget(max_episodes, 10**6), evict_to, words)
        fresh.reset(window.raw, window.evicted_through or 0, last_seq=history.last_seq)
        assert fresh.evicted == window.evicted


def agents_item(seq: int, item: dict) -> Episode:
    """An Agents SDK item as MemEngineSession stores it (the item under its key, the call links beside)."""
    links = tool_links({"item": item})
    metadata: dict = {"openai_agents.item": item}
    if links.calls:
        metadata[CALLS_KEY] = list(links.calls)
    if links.results:
        metadata[RESULT_OF_KEY] = list(links.results)
    return numbered(item.get("role") or item["type"], f"item {seq}", seq=seq, metadata=metadata)


def test_the_window_never_starts_between_a_reasoning_item_and_the_item_after_it() -> None:
    # A reasoning model's turn: reasoning, then its call or message. The Responses API refuses that item
    # without its reasoning item (400, "... was provided without its required 'reasoning' item"), and the
    # reasoning item without it: a cut between them would leave the raw window an invalid request.
    for max_episodes, evict_to in itertools.product(range(2, 9), (0.25, 0.5, 0.75)):
        window = RawWindow(Budget(max_episodes, 10**6), evict_to, words)
        seq = itertools.count(1)
        for turn in range(12):
            call_id = f"call_{turn}"
            items = [
                {"role": "user", "content": f"question {turn}"},
                {"type": "reasoning", "id": f"rs_{turn}", "summary": []},
                {"type": "function_call", "id": f"fc_{turn}", "call_id": call_id, "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": call_id, "output": "ok"},
                {"type": "reasoning", "id": f"rs_{turn}b", "summary": []},
                {"type": "message", "id": f"msg_{turn}", "role": "assistant", "content": f"answer {turn}"},
            ]
            for item in items:
                window.append([agents_item(next(seq), item)])
                if window.evicted:
                    before = window.raw[window.evicted - 1].metadata["openai_agents.item"]
                    assert before.get("type") != "reasoning", (max_episodes, evict_to, turn, window.evicted)


def test_episodes_measured_while_their_commit_runs_enter_as_if_measured_on_entry() -> None:
    """``measure`` (called while the append commits) counts each content once; the append then takes those counts.

    The window is the same as one that measured nothing: sizes, tokens, tool
    pairing and eviction. What was measured of an episode that did not enter
    (its id was stored before) is forgotten with the append: a later episode
    with that id is measured again.
    """
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return words(text)

    image = {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 200}}]}
    call = {CALLS_KEY: ["c1"]}
    result = {RESULT_OF_KEY: ["c1"]}
    contents = [
        ("user", "look at this picture", image),
        ("assistant", "calling a tool", call),
        ("tool", "the tool said so", result),
    ]
    budget = Budget(3, 10**6)
    plain, ahead = RawWindow(budget, 0.5, words), RawWindow(budget, 0.5, counting)
    for turn in range(4):
        batch = [
            numbered(role, f"{text} {turn}", seq=3 * turn + n + 1, metadata=meta)
            for n, (role, text, meta) in enumerate(contents)
        ]
        ahead.measure(batch)
        assert counted == [episode.content for episode in batch]  # measured now, not on entry
        counted.clear()
        ahead.append(batch)
        plain.append(batch)
        assert counted == []  # the append took the counts made ahead
        assert ahead.raw == plain.raw and ahead.evicted == plain.evicted
        assert ahead.sizes(len(ahead.raw)) == plain.sizes(len(plain.raw)) and ahead.tokens == plain.tokens
        assert ahead.evicted_through == plain.evicted_through

    dropped = numbered("user", "one two three", seq=13)
    ahead.measure([dropped])
    ahead.append([])  # its id was stored already: it did not enter, and its measure is forgotten
    same_id = with_seq(Episode("user", "one two three four five", id=dropped.id), 13)
    counted.clear()
    ahead.append([same_id])
    assert counted == [same_id.content]
    assert ahead.sizes(len(ahead.raw))[-1] == (len(same_id.content), 5)


def test_an_id_measured_twice_with_other_contents_enters_with_its_own_count() -> None:
    """Two episodes of one append share an id (the store keeps the first): the first enters with its own tokens."""
    window = RawWindow(Budget(20, 10**6), 0.5, words)
    first = numbered("user", "hello", seq=1)
    second = Episode("user", "lorem ipsum " * 40, id=first.id)
    window.measure([first, second])
    window.append([first])  # the store returned the second as not new
    assert window.tokens == 1
    assert window.sizes(1) == [(len("hello"), 1)]
