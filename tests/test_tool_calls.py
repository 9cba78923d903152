"""Tool links: which tool call ids an episode's metadata calls and answers (memengine.tool_calls)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memengine.episode import Episode
from memengine.tool_calls import (
    CALLS_KEY,
    NO_LINKS,
    RESULT_OF_KEY,
    ToolLinks,
    answering,
    calling,
    tool_links,
)


def links(calls: tuple[str, ...] = (), results: tuple[str, ...] = ()) -> ToolLinks:
    return ToolLinks(calls=calls, results=results)


# --- ToolLinks ---------------------------------------------------------------------------------


def test_links_are_true_when_they_call_or_answer_anything() -> None:
    assert not NO_LINKS
    assert NO_LINKS == ToolLinks()
    assert links(calls=("a",))
    assert links(results=("a",))


def test_metadata_without_tool_shapes_links_nothing() -> None:
    assert tool_links({}) is NO_LINKS
    assert tool_links({"role": "user", "content": "hello"}) is NO_LINKS
    assert tool_links({"source": "slack", "message": {"text": "hi"}}) is NO_LINKS


# --- first-class keys ----------------------------------------------------------------------------


def test_first_class_keys() -> None:
    assert tool_links({CALLS_KEY: ["a", "b"]}) == links(calls=("a", "b"))
    assert tool_links({RESULT_OF_KEY: "a"}) == links(results=("a",))
    assert tool_links({RESULT_OF_KEY: ["a", "b"]}) == links(results=("a", "b"))
    assert tool_links({CALLS_KEY: "a"}) == links(calls=("a",))


def test_an_episode_may_both_call_and_answer() -> None:
    metadata = {**answering("earlier"), **calling(["next"])}
    assert tool_links(metadata) == links(calls=("next",), results=("earlier",))


def test_first_class_keys_count_only_at_the_top_level() -> None:
    assert tool_links({"message": {CALLS_KEY: ["a"], RESULT_OF_KEY: "b"}}) is NO_LINKS


def test_the_key_names_are_documented_constants() -> None:
    assert CALLS_KEY == "memengine.tool_calls"
    assert RESULT_OF_KEY == "memengine.tool_result_of"


# --- OpenAI Chat Completions ---------------------------------------------------------------------

CHAT_ASSISTANT = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ],
}


def test_chat_assistant_tool_calls_are_calls() -> None:
    assert tool_links(CHAT_ASSISTANT) == links(calls=("call_1", "call_2"))


def test_chat_tool_message_is_a_result() -> None:
    assert tool_links({"role": "tool", "tool_call_id": "call_1", "content": "42"}) == links(results=("call_1",))


def test_a_tool_call_id_without_a_role_is_a_result() -> None:
    assert tool_links({"tool_call_id": "call_1"}) == links(results=("call_1",))


def test_chat_custom_tool_calls_are_calls() -> None:
    message = {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "custom", "custom": {"name": "x"}}]}
    assert tool_links(message) == links(calls=("call_1",))


def test_legacy_function_call_links_nothing() -> None:
    message = {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}
    assert tool_links(message) is NO_LINKS
    assert tool_links({"role": "function", "name": "f", "content": "42"}) is NO_LINKS


# --- OpenAI Responses ----------------------------------------------------------------------------

RESPONSES_PAIRS = [
    ("function_call", "function_call_output"),
    ("custom_tool_call", "custom_tool_call_output"),
    ("computer_call", "computer_call_output"),
    ("local_shell_call", "local_shell_call_output"),
    ("shell_call", "shell_call_output"),
    ("apply_patch_call", "apply_patch_call_output"),
    ("tool_search_call", "tool_search_output"),
    ("program", "program_output"),
]


@pytest.mark.parametrize(("call_type", "output_type"), RESPONSES_PAIRS)
def test_responses_calls_and_their_outputs(call_type: str, output_type: str) -> None:
    call = {"type": call_type, "id": "item_1", "call_id": "call_1", "status": "completed"}
    output = {"type": output_type, "id": "item_2", "call_id": "call_1", "output": "done"}
    assert tool_links(call) == links(calls=("call_1",))
    assert tool_links(output) == links(results=("call_1",))


def test_any_call_output_type_is_a_result() -> None:
    assert tool_links({"type": "future_tool_call_output", "call_id": "c"}) == links(results=("c",))


def test_local_shell_call_output_names_its_call_by_id() -> None:
    # The API's LocalShellCallOutput has no call_id: its "id" is the call's id.
    assert tool_links({"type": "local_shell_call_output", "id": "call_1", "output": "{}"}) == links(results=("call_1",))
    both = {"type": "local_shell_call_output", "id": "item_9", "call_id": "call_1"}
    assert tool_links(both) == links(results=("call_1",))


@pytest.mark.parametrize(
    "item_type",
    [
        "mcp_call",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "some_future_call",
        "message",
        "reasoning",
    ],
)
def test_items_that_carry_their_own_output_link_nothing(item_type: str) -> None:
    assert tool_links({"type": item_type, "id": "x", "call_id": "call_1", "output": "o"}) is NO_LINKS


def test_a_responses_call_id_counts_only_on_a_typed_item() -> None:
    assert tool_links({"call_id": "call_1"}) is NO_LINKS


def test_mcp_approval_request_and_response() -> None:
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "name": "t", "server_label": "s", "arguments": "{}"}
    response = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    assert tool_links(request) == links(calls=("mcpr_1",))
    assert tool_links(response) == links(results=("mcpr_1",))


def test_calls_made_by_a_program_join_the_programs_group() -> None:
    call = {"type": "function_call", "call_id": "f1", "caller": {"type": "program", "caller_id": "p1"}}
    output = {"type": "function_call_output", "call_id": "f1", "caller": {"type": "program", "caller_id": "p1"}}
    direct = {"type": "function_call", "call_id": "f2", "caller": {"type": "direct"}}
    assert tool_links(call) == links(calls=("f1",), results=("p1",))
    assert tool_links(output) == links(results=("f1", "p1"))
    assert tool_links(direct) == links(calls=("f2",))


# --- Anthropic Messages --------------------------------------------------------------------------


def test_anthropic_tool_use_blocks_are_calls() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
            {"type": "tool_use", "id": "toolu_2", "name": "g", "input": {}},
        ],
    }
    assert tool_links(message) == links(calls=("toolu_1", "toolu_2"))


def test_anthropic_tool_result_blocks_are_results() -> None:
    message = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "x"}]},
            {"type": "text", "text": "and here is more"},
        ],
    }
    assert tool_links(message) == links(results=("toolu_1", "toolu_2"))


def test_anthropic_server_tool_use_and_result_in_one_message() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "t", "server_name": "s", "input": {}},
            {"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": []},
        ],
    }
    # Linked to itself: a group of one unless a paused turn split the pair.
    assert tool_links(message) == links(calls=("srvtoolu_1", "mcptoolu_1"), results=("srvtoolu_1", "mcptoolu_1"))


def test_anthropic_server_tool_result_in_a_later_message() -> None:
    later = {"role": "assistant", "content": [{"type": "code_execution_tool_result", "tool_use_id": "srvtoolu_1"}]}
    assert tool_links(later) == links(results=("srvtoolu_1",))


def test_anthropic_tool_use_called_by_code_execution_joins_its_group() -> None:
    block = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "f",
        "input": {},
        "caller": {"type": "code_execution_20250825", "tool_id": "srvtoolu_1"},
    }
    assert tool_links({"role": "assistant", "content": [block]}) == links(calls=("toolu_1",), results=("srvtoolu_1",))


def test_a_content_block_on_its_own() -> None:
    assert tool_links({"type": "tool_use", "id": "toolu_1"}) == links(calls=("toolu_1",))
    assert tool_links({"type": "tool_result", "tool_use_id": "toolu_1"}) == links(results=("toolu_1",))


def test_content_blocks_nested_deeper_are_not_looked_at() -> None:
    inner = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "tool_use", "id": "toolu_9"}]}
    assert tool_links({"content": [inner]}) == links(results=("toolu_1",))


# --- where the shapes may be ---------------------------------------------------------------------

SHAPES: list[tuple[dict[str, Any], ToolLinks]] = [
    (CHAT_ASSISTANT, links(calls=("call_1", "call_2"))),
    ({"role": "tool", "tool_call_id": "call_1"}, links(results=("call_1",))),
    ({"type": "function_call", "call_id": "call_1"}, links(calls=("call_1",))),
    ({"type": "function_call_output", "call_id": "call_1"}, links(results=("call_1",))),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}, links(calls=("t",))),
    ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}, links(results=("t",))),
]


@pytest.mark.parametrize("key", ["message", "item", "raw"])
@pytest.mark.parametrize(("shape", "expected"), SHAPES)
def test_shapes_are_found_one_level_down(key: str, shape: dict[str, Any], expected: ToolLinks) -> None:
    assert tool_links({key: shape, "source": "agent"}) == expected


@pytest.mark.parametrize(("shape", "expected"), SHAPES)
def test_shapes_two_levels_down_are_not_looked_at(shape: dict[str, Any], expected: ToolLinks) -> None:
    assert tool_links({"raw": {"message": shape}}) is NO_LINKS
    assert tool_links({"payload": shape}) is NO_LINKS


def test_top_level_and_nested_links_are_merged_without_duplicates() -> None:
    metadata = {
        CALLS_KEY: ["call_1"],
        "message": CHAT_ASSISTANT,
        "raw": {"type": "function_call", "call_id": "call_3"},
    }
    assert tool_links(metadata) == links(calls=("call_1", "call_2", "call_3"))


def test_ids_are_deduplicated_in_order() -> None:
    message = {
        "tool_calls": [{"id": "b"}, {"id": "a"}, {"id": "b"}],
        "content": [{"type": "tool_use", "id": "a"}, {"type": "tool_use", "id": "c"}],
    }
    assert tool_links(message) == links(calls=("b", "a", "c"))
    assert tool_links({RESULT_OF_KEY: ["x", "y", "x"], "tool_call_id": "y"}) == links(results=("x", "y"))


# --- malformed metadata --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        {CALLS_KEY: [1, None, "", "  ", ["a"], {"id": "a"}]},
        {CALLS_KEY: 5},
        {RESULT_OF_KEY: ""},
        {RESULT_OF_KEY: {"a": "b"}},
        {"tool_calls": "call_1"},
        {"tool_calls": [None, 1, "call_1", {"id": 7}, {"id": ""}, {"function": {}}]},
        {"tool_call_id": 3},
        {"tool_call_id": ""},
        {"type": "function_call", "call_id": 1},
        {"type": "function_call", "call_id": " "},
        {"type": "function_call"},
        {"type": ["function_call"], "call_id": "c"},
        {"type": "local_shell_call_output", "id": 4},
        {"content": "tool_use"},
        {"content": [None, 1, "x", [], {"type": "tool_use"}, {"type": "tool_use", "id": 2}]},
        {"content": [{"type": "tool_result", "tool_use_id": None}]},
        {"type": "function_call", "caller": {"caller_id": 4}},
        {"type": "tool_use", "caller": "srvtoolu_1"},
        {"message": "not a dict", "item": [], "raw": None},
    ],
)
def test_malformed_values_are_ignored(metadata: dict[str, Any]) -> None:
    assert tool_links(metadata) is NO_LINKS


def test_malformed_ids_are_skipped_and_good_ones_kept() -> None:
    assert tool_links({CALLS_KEY: [1, "a", "", "b"]}) == links(calls=("a", "b"))


def test_a_read_only_mapping_is_read_like_a_dict() -> None:
    metadata = MappingProxyType({"type": "function_call", "call_id": "c", "message": {"tool_call_id": "d"}})
    assert tool_links(metadata) == links(calls=("c",), results=("d",))


def test_not_a_mapping_links_nothing() -> None:
    assert tool_links([{"type": "function_call", "call_id": "c"}]) is NO_LINKS  # type: ignore[arg-type]
    assert tool_links(None) is NO_LINKS  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)

# Keys and values that the recognition looks at, so generated metadata reaches every branch.
TOOL_KEYS = [
    CALLS_KEY,
    RESULT_OF_KEY,
    "tool_calls",
    "tool_call_id",
    "type",
    "id",
    "call_id",
    "tool_use_id",
    "approval_request_id",
    "caller",
    "caller_id",
    "tool_id",
    "content",
    "message",
    "item",
    "raw",
]
TOOL_TYPES = [
    "function_call",
    "function_call_output",
    "local_shell_call_output",
    "mcp_call",
    "tool_search_output",
    "program",
    "tool_use",
    "server_tool_use",
    "tool_result",
    "web_search_tool_result",
    "mcp_approval_request",
    "mcp_approval_response",
]
toolish_values = st.recursive(
    st.none() | st.integers() | st.text(max_size=3) | st.sampled_from(TOOL_TYPES),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(TOOL_KEYS) | st.text(max_size=3), children, max_size=5)
    ),
    max_leaves=25,
)


def check_links(result: ToolLinks) -> None:
    assert isinstance(result, ToolLinks)
    for ids in (result.calls, result.results):
        assert isinstance(ids, tuple)
        assert all(isinstance(call_id, str) and call_id.strip() for call_id in ids)
        assert len(set(ids)) == len(ids)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_arbitrary_json_metadata_never_raises(metadata: dict[str, Any]) -> None:
    check_links(tool_links(metadata))


@given(st.dictionaries(st.sampled_from(TOOL_KEYS), toolish_values, max_size=8))
def test_arbitrary_tool_like_metadata_never_raises(metadata: dict[str, Any]) -> None:
    check_links(tool_links(metadata))


# --- calling() and answering() -------------------------------------------------------------------


def test_calling_builds_the_metadata_fragment() -> None:
    assert calling(["a", "b"]) == {CALLS_KEY: ["a", "b"]}
    assert calling(iter(["a"])) == {CALLS_KEY: ["a"]}
    assert calling(("a", "b")) == {CALLS_KEY: ["a", "b"]}


def test_answering_builds_the_metadata_fragment() -> None:
    assert answering("a") == {RESULT_OF_KEY: ["a"]}
    assert answering("a", "b") == {RESULT_OF_KEY: ["a", "b"]}


@given(st.lists(st.text(min_size=1).filter(str.strip), min_size=1, max_size=5, unique=True))
def test_calling_and_answering_round_trip(call_ids: list[str]) -> None:
    assert tool_links(calling(call_ids)) == links(calls=tuple(call_ids))
    assert tool_links(answering(*call_ids)) == links(results=tuple(call_ids))


def test_the_fragments_round_trip_through_an_episode() -> None:
    episode = Episode("assistant", "calling f", metadata={**calling(["call_1"]), "model": "m"})
    assert tool_links(episode.metadata) == links(calls=("call_1",))
    episode = Episode("tool", "42", metadata=answering("call_1"))
    assert tool_links(episode.metadata) == links(results=("call_1",))


def test_calling_refuses_a_single_string() -> None:
    with pytest.raises(TypeError, match="iterable of call ids"):
        calling("call_1")


@pytest.mark.parametrize("bad", [[1], ["a", None], [b"a"]])
def test_calling_refuses_non_str_ids(bad: list[Any]) -> None:
    with pytest.raises(TypeError, match="must be a str"):
        calling(bad)


def test_answering_refuses_non_str_ids() -> None:
    with pytest.raises(TypeError, match="must be a str, not int"):
        answering(1)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "   ", "\n"])
def test_blank_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="non-blank"):
        calling([bad])
    with pytest.raises(ValueError, match="non-blank"):
        answering("a", bad)


def test_repeated_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="'a' is given more than once"):
        calling(["a", "b", "a"])
    with pytest.raises(ValueError, match="more than once"):
        answering("a", "a")


def test_at_least_one_id_is_needed() -> None:
    with pytest.raises(ValueError, match=r"calling\(\) needs at least one call id"):
        calling([])
    with pytest.raises(ValueError, match=r"answering\(\) needs at least one call id"):
        answering()
