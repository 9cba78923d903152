"""Old tool outputs clipped in the view (issue #28, part 2): what the model reads is clipped,
what is stored, recalled, exported, retained and summarized is whole."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memengine import Episode, SessionConfig, ToolClipping, open_engine
from memengine.clipping import CLIP_MARKER, clip_episode
from memengine.context import Context
from memengine.episode import with_seq
from memengine.rendering import AGENTS_ITEM_IN_CONTENT_KEY, AGENTS_ITEM_KEY, to_anthropic, to_openai_responses
from memengine.replay import recorded_config
from memengine.session.window import Budget, RawWindow, window_of
from memengine.tokens import estimate_tokens
from memengine.tool_calls import RESULT_OF_KEY

from .fakes import RecordingSink, fold

CLIPPING = ToolClipping(keep_turns=2, over_chars=100, head_chars=20, tail_chars=10)
BIG = "".join(f"line {n:03d} of the file\n" for n in range(40))  # 840 characters, 40 lines


def call(call_id: str) -> Episode:
    tool_call = {"id": call_id, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    return Episode("assistant", "", metadata={"role": "assistant", "tool_calls": [tool_call]})


def result(call_id: str, output: str = BIG) -> Episode:
    return Episode("tool", output, metadata={"role": "tool", "tool_call_id": call_id})


def marker(clipped: int, seq: int) -> str:
    return f"[… {clipped:,} characters clipped; full output: seq {seq} …]"


def shown_clipped(seq: int) -> str:
    """``BIG`` as the view shows it clipped: its first line, the marker, its last 10 characters."""
    return "line 000 of the file\n" + marker(810, seq) + "\n the file\n"


def exchange(count: int) -> list[Episode]:
    """``count`` call-and-result exchanges, each result ``BIG``."""
    return [episode for n in range(count) for episode in (call(f"c{n}"), result(f"c{n}"))]


class ContentSummarizer:
    """Records the contents each call was given."""

    def __init__(self) -> None:
        self.contents: list[str] = []

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.contents.extend(episode.content for episode in episodes)
        return fold(previous, episodes)


# -- the clip itself ---------------------------------------------------------------


def test_the_marker_names_what_was_clipped_and_the_seq_that_holds_it() -> None:
    text = "a" * 50 + "b" * 5000 + "c" * 50
    clipped = clip_episode(with_seq(result("c", text), 42), ToolClipping())
    assert clipped is not None
    assert clipped.content == "a" * 50 + "b" * 550 + "\n[… 4,100 characters clipped; full output: seq 42 …]\n" + (
        "b" * 350 + "c" * 50
    )
    assert CLIP_MARKER.format(clipped=3912, seq=42) == "[… 3,912 characters clipped; full output: seq 42 …]"
    assert clipped.seq == 42


def test_the_head_ends_at_a_line_end_and_the_provider_message_is_clipped_too() -> None:
    episode = with_seq(result("c"), 7)
    clipped = clip_episode(episode, CLIPPING)
    assert clipped is not None
    assert clipped.content == shown_clipped(7)  # the head: a whole line (20 characters), its line end clipped
    assert clipped.metadata == {"role": "tool", "tool_call_id": "c"}  # (its renderings take the content)
    assert (clipped.id, clipped.role, clipped.created_at) == (episode.id, episode.role, episode.created_at)


def test_an_output_exactly_at_the_size_is_shown_whole_and_one_more_character_is_clipped() -> None:
    at_size = with_seq(result("c", "x" * 100), 3)
    assert clip_episode(at_size, CLIPPING) is None
    clipped = clip_episode(with_seq(result("c", "x" * 101), 3), CLIPPING)
    assert clipped is not None
    assert clipped.content == "x" * 20 + "\n" + marker(71, 3) + "\n" + "x" * 10


def test_only_tool_results_are_clipped() -> None:
    assert clip_episode(with_seq(Episode("user", BIG), 1), CLIPPING) is None
    assert clip_episode(with_seq(Episode("assistant", BIG), 1), CLIPPING) is None


def test_cjk_is_clipped_by_characters() -> None:
    text = "漢字かな交じり文" * 50  # 400 characters, no line ends
    clipped = clip_episode(with_seq(result("c", text), 9), CLIPPING)
    assert clipped is not None
    assert clipped.content == text[:20] + "\n" + marker(370, 9) + "\n" + text[-10:]


@pytest.mark.parametrize(
    "unit",
    [
        "e\u0301",  # e and a combining acute accent
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: three emoji joined by zero-width joiners
        "\u2764\ufe0f",  # a heart and its emoji variation selector
        "\r\n",
    ],
)
def test_a_cut_never_splits_a_character(unit: str) -> None:
    text = unit * 200
    clipped = clip_episode(with_seq(result("c", text), 1), CLIPPING)
    assert clipped is not None
    head, tail = clipped.content.split("\n[…", 1)[0], clipped.content.rsplit("…]\n", 1)[1]
    assert head == unit * (len(head) // len(unit)) and head
    assert tail == unit * (len(tail) // len(unit)) and tail


def test_a_json_output_is_clipped_as_text_and_a_non_text_output_is_shown_whole() -> None:
    output = json.dumps({"files": [f"src/module_{n}.py" for n in range(30)]})
    clipped = clip_episode(with_seq(result("c", output), 5), CLIPPING)
    assert (
        clipped is not None
        and clipped.content == output[:20] + "\n" + marker(len(output) - 30, 5) + "\n" + (output[-10:])
    )
    # A Responses item whose output is a JSON object, not text: nothing of it is clipped.
    item = {"type": "function_call_output", "call_id": "c", "output": {"rows": list(range(100))}}
    assert clip_episode(with_seq(Episode("tool", "", metadata={"item": item}), 5), CLIPPING) is None


def test_an_image_in_the_output_is_shown_whole() -> None:
    output = "see data:image/png;base64," + "A" * 400
    assert clip_episode(with_seq(result("c", output), 5), CLIPPING) is None


def test_each_provider_shape_is_clipped_in_the_metadata_and_the_stored_episode_is_untouched() -> None:
    responses = {"type": "function_call_output", "call_id": "c", "output": BIG}
    anthropic = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": BIG}]}],
    }
    for metadata in (
        {"item": responses},
        {"message": anthropic},
        {"raw": {"role": "tool", "tool_call_id": "c", "content": BIG}},
        {"role": "tool", "tool_call_id": "c", "content": BIG, "app.note": "kept as it is"},
    ):
        episode = with_seq(Episode("tool", BIG, metadata=metadata), 4)
        before = json.dumps(episode.metadata)
        clipped = clip_episode(episode, CLIPPING)
        assert clipped is not None
        assert BIG not in json.dumps(clipped.metadata, ensure_ascii=False)
        assert json.dumps(clipped.metadata, ensure_ascii=False).count("full output: seq 4") == 1
        assert json.dumps(episode.metadata) == before and episode.content == BIG


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="must be less than over_chars"):
        ToolClipping(over_chars=100, head_chars=60, tail_chars=40)
    with pytest.raises(TypeError, match="ToolClipping"):
        SessionConfig(tool_clipping=True)  # type: ignore[arg-type]
    assert SessionConfig().tool_clipping is None  # off unless asked for


# -- the window ------------------------------------------------------------------


def stored(episodes: list[Episode]) -> list[Episode]:
    return [with_seq(episode, seq) for seq, episode in enumerate(episodes, 1)]


def test_the_window_counts_clipped_outputs_and_evicts_later() -> None:
    budget = Budget(episodes=100, chars=10**6, tokens=3000)
    episodes = stored(exchange(8))  # 8 results of about 200 tokens each
    plain = window_of(episodes, budget, 0.5, estimate_tokens)
    clipped = window_of(episodes, budget, 0.5, estimate_tokens, clipping=CLIPPING)
    assert plain.evicted == 0 and clipped.evicted == 0
    assert clipped.tokens < plain.tokens / 3
    # The newest two episodes (the last exchange) are shown whole; every older result clipped.
    assert clipped.raw[-1].content == BIG
    assert [e.content for e in clipped.raw if e.role == "tool"] == [shown_clipped(2 * n) for n in range(1, 8)] + [BIG]
    # The summarizer's batches read the stored episodes, whole.
    more = stored(exchange(40))
    plain = window_of(more, budget, 0.5, estimate_tokens)
    clipped = window_of(more, budget, 0.5, estimate_tokens, clipping=CLIPPING)
    assert plain.evicted > 0 and clipped.evicted == 0


def test_incremental_counts_match_a_fresh_count() -> None:
    """Clipped as the episodes arrive, summarized from the front: the running totals are those of a fresh count."""
    budget = Budget(episodes=30, chars=10**6, tokens=2000)
    episodes = stored(exchange(60))
    window = window_of([], budget, 0.5, estimate_tokens, clipping=CLIPPING)
    for episode in episodes:
        window.append([episode])
        live = [e for e in episodes if window.raw[0].seq <= e.seq <= episode.seq]  # type: ignore[operator]
        fresh = window_of(live, budget, 0.5, estimate_tokens, window.evicted_through or 0, CLIPPING)
        assert window.raw == fresh.raw and window.evicted == fresh.evicted
        assert window.tokens == sum(estimate_tokens(e.content) for e in window.raw) == fresh.tokens
        assert window.pending == live[: window.evicted]  # the summarizer reads them whole
        assert window.sizes(window.evicted) == [(len(e.content), estimate_tokens(e.content)) for e in window.pending]
        if window.evicted > 4:
            window.drop_through(window.raw[window.evicted - 3].seq)  # type: ignore[arg-type]
    assert any(e.content != BIG for e in window.raw if e.role == "tool")


# -- through the engine, on both stores ------------------------------------------------


def clipped_config(**settings) -> SessionConfig:
    return SessionConfig(max_episodes=100, max_chars=10**6, tool_clipping=CLIPPING, **settings)


@pytest.mark.anyio
async def test_context_and_every_rendering_show_old_outputs_clipped(store_url) -> None:
    async with open_engine(store_url, summarizer=ContentSummarizer(), config=clipped_config()) as engine:
        session = engine.session("s")
        await session.add(exchange(2))
        context = await session.context()
    assert [e.content for e in context.episodes] == ["", shown_clipped(2), "", BIG]
    assert context.tokens == sum(estimate_tokens(e.content) for e in context.episodes)
    chat = context.to_openai_chat()
    assert [m["role"] for m in chat] == ["assistant", "tool", "assistant", "tool"]
    assert chat[1]["content"] == shown_clipped(2) and chat[3]["content"] == BIG
    assert chat[1]["tool_call_id"] == chat[0]["tool_calls"][0]["id"] == "c0"
    responses = context.to_openai_responses()
    outputs = [item for item in responses if item.get("type") == "function_call_output"]
    assert [item["call_id"] for item in outputs] == ["c0", "c1"]
    assert outputs[0]["output"] == shown_clipped(2) and outputs[1]["output"] == BIG
    anthropic = context.to_anthropic()["messages"]
    results = [block for m in anthropic for block in m["content"] if block["type"] == "tool_result"]
    assert [r["content"] for r in results] == [shown_clipped(2), BIG]


@pytest.mark.anyio
async def test_stored_recalled_exported_retained_and_summarized_whole(store_url) -> None:
    sink, summarizer = RecordingSink(), ContentSummarizer()
    config = SessionConfig(max_episodes=4, max_chars=10**6, evict_to=0.5, retain_every=4, tool_clipping=CLIPPING)
    async with open_engine(store_url, summarizer=summarizer, retain_sink=sink, config=config) as engine:
        session = engine.session("s")
        for episode in exchange(4):
            await session.add([episode])
        context = await session.context(wait_for_summary=True)
        await sink.wait_for(2)
        records = [r async for r in engine.export(session_id="s") if r["type"] == "episode"]
        hits = await engine.recall("line 020", session_id="s")
    assert [r["content"] for r in records if r["role"] == "tool"] == [BIG] * 4
    assert next(r["metadata"] for r in records if r["role"] == "tool") == {"role": "tool", "tool_call_id": "c0"}
    assert hits and all(hit.episode.content == BIG for hit in hits)
    assert [c for c in sink.delivered_contents() if c] == [BIG] * 4
    assert context.summarized_through >= 2
    summarized = [seq for seq in (2, 4, 6, 8) if seq <= context.summarized_through]
    assert [c for c in summarizer.contents if c] == [BIG] * len(summarized)  # summarized whole
    shown = {e.seq: e.content for e in context.episodes if e.role == "tool"}
    assert shown == {seq: BIG if seq == 8 else shown_clipped(seq) for seq in (2, 4, 6, 8) if seq not in summarized}


@pytest.mark.anyio
async def test_clipping_delays_eviction_and_the_summarizer_call(store_url) -> None:
    calls = {}
    for clipping in (None, CLIPPING):
        summarizer = ContentSummarizer()
        config = SessionConfig(max_episodes=100, max_chars=4000, tool_clipping=clipping)
        async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
            session = engine.session(f"clipped-{clipping is not None}")
            for episode in exchange(8):
                await session.add([episode])
            context = await session.context(wait_for_summary=True)
        calls[clipping is not None] = (len(summarizer.contents), context.summarized_through)
    assert calls[False][1] > 0  # 8 x 800 characters overflow 4,000: evicted and summarized
    assert calls[True] == (0, 0)  # clipped, they fit: no eviction, no LLM call


@pytest.mark.anyio
async def test_delete_clear_and_reload_keep_the_view_a_function_of_the_live_episodes(store_url) -> None:
    async with open_engine(store_url, summarizer=ContentSummarizer(), config=clipped_config()) as engine:
        session = engine.session("s")
        await session.add(exchange(3))  # seqs 1..6; results 2, 4 and 6
        before = await session.context()
        assert [e.content for e in before.episodes] == ["", shown_clipped(2), "", shown_clipped(4), "", BIG]
        # Deleting the newest exchange makes seq 3 and 4 the newest two: 4 is shown whole again.
        await session.delete_episodes([5, 6])
        after = await session.context()
        assert [e.seq for e in after.episodes] == [1, 2, 3, 4]
        assert [e.content for e in after.episodes] == ["", shown_clipped(2), "", BIG]
        assert after.tokens < sum(estimate_tokens(e.content) for e in exchange(2))
    async with open_engine(store_url, summarizer=ContentSummarizer(), config=clipped_config()) as engine:
        session = engine.session("s")
        reloaded = await session.context()
        assert reloaded.episodes == after.episodes and reloaded.tokens == after.tokens
        await session.clear()
        await session.add(exchange(1))
        cleared = await session.context()
    assert [e.content for e in cleared.episodes] == ["", BIG]


@pytest.mark.anyio
async def test_a_recorded_log_keeps_the_setting(tmp_path) -> None:
    log = tmp_path / "messages.jsonl"
    config = clipped_config()
    async with open_engine(tmp_path / "memory.db", config=config, record_to=log) as engine:
        await engine.session("s").add(exchange(2))
    recorded = recorded_config(log)
    assert recorded is not None and recorded.config.tool_clipping == CLIPPING and recorded.notes == ()


def test_an_agents_sdk_item_kept_as_content_is_clipped_inside_its_json() -> None:
    item = {"type": "function_call_output", "call_id": "c", "output": BIG}
    episode = Episode("tool", json.dumps(item), metadata={AGENTS_ITEM_IN_CONTENT_KEY: True, RESULT_OF_KEY: "c"})
    clipped = clip_episode(with_seq(episode, 3), CLIPPING)
    assert clipped is not None
    assert json.loads(clipped.content) == {**item, "output": shown_clipped(3)}
    function_call = {"type": "function_call", "call_id": "c", "name": "read_file", "arguments": "{}"}
    calling = with_seq(Episode("assistant", "read_file", metadata={AGENTS_ITEM_KEY: function_call}), 2)
    rendered = to_openai_responses(Context("s", None, 0, (calling, clipped), 0))
    assert rendered == [function_call, {**item, "output": shown_clipped(3)}]


def test_native_messages_render_clipped_for_their_own_provider() -> None:
    anthropic_call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "read", "input": {}}]}
    anthropic_result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": BIG}],
    }
    episodes = stored(
        [
            Episode("assistant", "", metadata={"message": anthropic_call}),
            Episode("user", "", metadata={"message": anthropic_result}),
            *exchange(1),
        ]
    )
    window = window_of(episodes, Budget(100, 10**6), 0.5, estimate_tokens, clipping=CLIPPING)
    request = to_anthropic(Context("s", None, 0, tuple(window.raw), 0))
    assert request["messages"][1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": shown_clipped(2)}],
    }
    assert episodes[1].metadata["message"] == anthropic_result  # the stored episode: whole


def words(text: str) -> int:
    return len(text.split())


kinds = st.one_of(
    st.tuples(st.just("plain"), st.integers(1, 300)),
    st.tuples(st.just("exchange"), st.integers(0, 300)),  # a call, then its result of that many characters
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(kinds, min_size=1, max_size=4)),
        st.tuples(st.just("summarize"), st.integers(1, 20)),
        st.tuples(st.just("delete"), st.integers(0, 60)),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(
    max_episodes=st.integers(1, 12),
    max_chars=st.integers(50, 2000),
    keep_turns=st.integers(1, 5),
    evict_to=st.sampled_from([0.25, 0.5, 1.0]),
    script=steps,
)
def test_the_view_is_always_the_clipped_live_episodes(max_episodes, max_chars, keep_turns, evict_to, script) -> None:
    """Whatever the appends, summaries and deletes: each live tool result older than the newest
    ``keep_turns`` is shown clipped, every other episode whole; the counts are those of what is shown;
    the summarizer reads the episodes whole; a reload shows the same."""
    clipping = ToolClipping(keep_turns=keep_turns, over_chars=100, head_chars=20, tail_chars=10)
    budget = Budget(max_episodes, max_chars, None)
    window = RawWindow(budget, evict_to, words, clipping)
    seqs = itertools.count(1)
    live: list[Episode] = []  # the session's live episodes after its summary, whole: what the store holds
    for action, argument in script:
        if action == "append":
            new = []
            for kind, size in argument:
                if kind == "plain":
                    new.append(with_seq(Episode("user", "word " * size), next(seqs)))
                else:
                    seq = next(seqs)
                    new += [with_seq(call(f"c{seq}"), seq), with_seq(result(f"c{seq}", "x" * size or "y"), next(seqs))]
            live += new
            window.append(new)
        elif action == "summarize" and window.evicted:
            end = window.batch_end(argument, lambda episodes, chars, tokens: True)
            window.drop_through(window.raw[end - 1].seq)  # type: ignore[arg-type]
            live = live[end:]
        elif action == "delete" and live:
            del live[argument % len(live)]
            window.reset(live, window.evicted_through or 0, last_seq=next(seqs))
        old = len(live) - keep_turns
        expected = [
            (clip_episode(episode, clipping) or episode) if index < old else episode
            for index, episode in enumerate(live)
        ]
        assert window.raw == expected
        assert window.pending == live[: window.evicted]
        assert window.sizes(window.evicted) == [(len(e.content), words(e.content)) for e in window.pending]
        assert window.tokens == sum(words(e.content) for e in window.raw)
        fresh = RawWindow(budget, evict_to, words, clipping)
        fresh.reset(live, window.evicted_through or 0)
        assert (fresh.raw, fresh.evicted, fresh.tokens) == (window.raw, window.evicted, window.tokens)


def test_a_list_output_is_clipped_part_by_part_and_its_images_are_kept() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/plot.png"}}
    blocks = [{"type": "text", "text": BIG}, image, {"type": "text", "text": "short"}]
    message = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": blocks}]}
    parts = [{"type": "input_text", "text": BIG}, {"type": "input_image", "image_url": "https://example.com/a.png"}]
    item = {"type": "function_call_output", "call_id": "t", "output": parts}
    for metadata, path in (
        ({"message": message}, ("message", "content", 0, "content")),
        ({"item": item}, ("item", "output")),
    ):
        clipped = clip_episode(with_seq(Episode("tool", "", metadata=metadata), 8), CLIPPING)
        assert clipped is not None
        shown = clipped.metadata
        for key in path:
            shown = shown[key]
        whole = metadata
        for key in path:
            whole = whole[key]  # type: ignore[index]
        assert shown == [{**whole[0], "text": shown_clipped(8)}, *whole[1:]]  # type: ignore[index]
