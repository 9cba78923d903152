"""A value's JSON made a slice at a time is, to the character, the JSON made at once (json_slices.py)."""

from __future__ import annotations

import collections
import json
import math
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memengine import json_slices
from memengine.episode import encode_json

BACKENDS = ["asyncio", "trio"]


class Text(str):
    pass


# Every string of more than 3 characters is long here: most values are cut into many slices.
SHORT = 3

texts = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ['say "hi"\\n', "\x00\x1f\x7f", "東京の天気は晴れ", "emoji 😀 and 𝄞", "", "memengine-long-"]
)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=6) | st.integers(-3, 3), children, max_size=4)
    ),
    max_leaves=25,
)


def at_once(value: object) -> tuple[str, Any, int]:
    encoded = encode_json(value)
    return encoded, json.loads(encoded), len(encoded.encode())


def in_slices(value: object, backend: str = "asyncio") -> tuple[str, Any, int]:
    return anyio.run(json_slices.encode_in_slices, value, backend=backend)


@pytest.fixture
def short_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_slices, "LONG_STRING", SHORT)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
def test_in_slices_is_the_json_made_at_once(short_slices: None, backend: str, value: object) -> None:
    encoded, exact, size = in_slices(value, backend)
    expected = at_once(value)
    assert encoded == expected[0]
    assert exact == expected[1] and type(exact) is type(expected[1])
    assert size == expected[2]


def test_a_long_string_is_cut_into_slices_with_the_loop_running_between(short_slices: None) -> None:
    """Other tasks run between the slices: one per slice of each long string."""
    value = {"output": "x" * 10, "content": [{"text": 'ab"cd\\ef\n'}], "short": "abc"}
    turns = 0

    async def main() -> tuple[str, Any, int]:
        nonlocal turns
        result: list[tuple[str, Any, int]] = []

        async def encode() -> None:
            result.append(await json_slices.encode_in_slices(value))

        async with anyio.create_task_group() as group:
            group.start_soon(encode)
            while not result:
                turns += 1
                await anyio.lowlevel.checkpoint()
        return result[0]

    assert anyio.run(main) == at_once(value)
    assert turns >= math.ceil(10 / SHORT) + math.ceil(len('ab"cd\\ef\n') / SHORT) - 1


def test_a_value_holding_the_marker_text_is_still_encoded_exactly(short_slices: None, monkeypatch) -> None:
    monkeypatch.setattr(json_slices.uuid, "uuid4", lambda: type("U", (), {"hex": "fixed"})())
    value = {"a": "memengine-long-fixed-0", "b": "a long one", "memengine-long-fixed-1": "another long one"}
    assert in_slices(value) == at_once(value)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"text": "a long text", "score": float("nan")}, ValueError),
        ({"text": "a long text", "when": object()}, TypeError),
        ({"text": "a long text", "cut": "half of a pair: \ud83d here"}, UnicodeEncodeError),
        (["a long text", "first half \ud83d"], UnicodeEncodeError),
    ],
)
def test_what_at_once_refuses_in_slices_refuses_alike(short_slices: None, value: object, error: type) -> None:
    with pytest.raises(error):
        at_once(value)
    with pytest.raises(error):
        in_slices(value)


def test_a_value_that_holds_itself_is_refused_as_at_once(short_slices: None) -> None:
    value: dict[str, Any] = {"text": "a long text"}
    value["self"] = [value]
    assert json_slices.has_long_string(value)
    with pytest.raises(ValueError, match="Circular"):
        at_once(value)
    with pytest.raises(ValueError, match="Circular"):
        in_slices(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"a": "abc", "b": [1, "xy", {"c": None}]}, False),
        ({"a": "abc", "b": [1, "xy", {"c": "long!"}]}, True),
        ({"a": ("x", "long!")}, True),
        ({"a": collections.OrderedDict(key="long!")}, True),  # a dict subclass: its values, not its keys
        ({"a": collections.OrderedDict(long_key=1)}, False),
        ({"a": Text("long!")}, True),  # a str subclass
        ({"long key": 1}, False),  # keys are not cut (module docstring)
        ("long!", True),
        (5, False),
    ],
)
def test_has_long_string(short_slices: None, value: object, expected: bool) -> None:
    assert json_slices.has_long_string(value) is expected


def test_past_the_walk_limit_a_value_is_not_looked_through(short_slices: None, monkeypatch) -> None:
    monkeypatch.setattr(json_slices, "WALK_LIMIT", 10)
    deep: Any = "long!"
    for _ in range(20):
        deep = [deep]
    assert not json_slices.has_long_string(deep)
    assert json_slices.has_long_string(deep[0][0][0][0][0][0][0][0][0][0][0][0][0])
