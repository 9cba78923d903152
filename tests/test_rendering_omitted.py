"""A context that left episodes out to stay within its token ceiling says so in every rendering.

``Context.tokens`` counts ``omitted.note``; the renderings must carry it, or
the model would be sent a conversation with a silent hole in it.
"""

from __future__ import annotations

import pytest

from memengine import Context, Episode
from memengine.context import Omitted
from memengine.episode import with_seq
from memengine.rendering import SUMMARY_PREFIX

OMITTED = Omitted(first_seq=4, last_seq=9, count=6, tokens=420)
EPISODES = (
    with_seq(Episode("user", "and the beach?"), 10),
    with_seq(Episode("assistant", "Twenty minutes by train."), 11),
)


@pytest.mark.parametrize("summary", ["The user is moving to Lisbon.", None])
def test_every_rendering_carries_the_note_on_what_was_left_out(summary: str | None) -> None:
    context = Context("s", summary, 3 if summary else 0, EPISODES, 9, omitted=OMITTED)
    expected = (SUMMARY_PREFIX + summary + "\n\n" if summary else "") + OMITTED.note

    chat = context.to_openai_chat()
    assert chat[0] == {"role": "system", "content": expected}
    assert [m["content"] for m in chat[1:]] == ["and the beach?", "Twenty minutes by train."]
    responses = context.to_openai_responses()
    assert responses[0] == {"role": "system", "content": expected}
    assert context.to_anthropic()["system"] == expected


def test_nothing_left_out_renders_no_note() -> None:
    context = Context("s", "The user is moving to Lisbon.", 3, EPISODES, 9)
    assert context.to_openai_chat()[0] == {
        "role": "system",
        "content": SUMMARY_PREFIX + "The user is moving to Lisbon.",
    }
    assert "left out" not in str(context.to_anthropic())
