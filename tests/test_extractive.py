"""The offline summarizer: bounded, deterministic, informative, and current."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from importlib.resources import files

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memengine import Episode, ExtractiveSummarizer

WINDOW = 20  # the engine's default window: a turn is summarized when the 20th after it arrives


def load_sample_conversation() -> list[Episode]:
    text = files("memengine.cli").joinpath("sample_conversation.jsonl").read_text(encoding="utf-8")
    return [Episode(turn["role"], turn["content"]) for turn in map(json.loads, filter(str.strip, text.splitlines()))]


SAMPLE = load_sample_conversation()  # 292 turns: a move to Lisbon, a dog, a job, a language, a trip


def turn(number: int) -> Episode:
    """The sample's turn ``number``, counting from 1 like the lines of the file."""
    return SAMPLE[number - 1]


def replay(summarizer: ExtractiveSummarizer, episodes: Sequence[Episode], window: int = WINDOW) -> str | None:
    """Fold the episodes in as the engine does: each alone, when it leaves the window."""
    summary = None
    for episode in episodes[: len(episodes) - window]:
        summary = summarizer.summarize_now(summary, [episode])
    return summary


def first_said_in(line: str) -> int:
    """The number of the first sample turn that says this summary line's sentence."""
    sentence = line.split(": ", 1)[1].rstrip("…")
    return next(number for number, episode in enumerate(SAMPLE, 1) if sentence in episode.content)


# Determinism and bounds


def test_the_same_input_gives_the_same_summary() -> None:
    assert replay(ExtractiveSummarizer(), SAMPLE) == replay(ExtractiveSummarizer(), SAMPLE)


REPLAY_SCRIPT = """
import json, sys
from memengine import Episode, ExtractiveSummarizer
summarizer, summary = ExtractiveSummarizer(), None
for role, content in json.load(sys.stdin):
    summary = summarizer.summarize_now(summary, [Episode(role, content)])
sys.stdout.write(summary)
"""


def test_the_summary_does_not_depend_on_the_process() -> None:
    # A restarted engine must compute the same summary: nothing may depend on string hashing.
    episodes = SAMPLE[:120]
    expected = replay(ExtractiveSummarizer(), episodes, window=0)
    stdin = json.dumps([(episode.role, episode.content) for episode in episodes])
    for seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", REPLAY_SCRIPT],
            input=stdin,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONIOENCODING": "utf-8"},
            check=True,
        )
        assert result.stdout == expected


texts = st.text(st.one_of(st.sampled_from(" .!?…:,'\n"), st.characters(codec="utf-8")), max_size=300)
roles = st.sampled_from(["user", "assistant", "a tool\nwith a newline"])
contents = texts.map(lambda text: text.replace("\x00", "")).filter(str.strip)  # Episode refuses NUL
episodes = st.lists(st.builds(Episode, role=roles, content=contents), min_size=1, max_size=6)


@given(
    previous=st.none() | texts,
    episodes=episodes,
    max_chars=st.integers(1, 400),
    max_sentence_chars=st.integers(1, 300),
)
def test_any_input_gives_a_bounded_non_empty_summary_of_clean_lines(
    previous: str | None, episodes: list[Episode], max_chars: int, max_sentence_chars: int
) -> None:
    summarizer = ExtractiveSummarizer(max_chars, max_sentence_chars)
    summary = summarizer.summarize_now(previous, episodes)
    assert summary.strip()
    assert len(summary) <= max_chars
    assert all(line.strip() for line in summary.splitlines())
    assert summarizer.summarize_now(previous, episodes) == summary


def test_the_summary_stays_within_max_chars_through_a_long_conversation() -> None:
    for max_chars in (1, 40, 300, 1200):
        summarizer = ExtractiveSummarizer(max_chars=max_chars)
        summary = None
        for episode in SAMPLE[:100]:
            summary = summarizer.summarize_now(summary, [episode])
            assert summary.strip()
            assert len(summary) <= max_chars


def test_a_huge_sentence_is_clipped_not_dropped() -> None:
    huge = "Bolo walked " + "along the river and over the old bridge " * 500 + "to the park"
    summary = ExtractiveSummarizer(max_chars=1200, max_sentence_chars=240).summarize_now(None, [Episode("user", huge)])
    assert summary.startswith("user: Bolo walked along the river")
    assert summary.endswith("…")
    assert len(summary) == 240


def test_a_sentence_longer_than_the_whole_summary_is_clipped_to_fit() -> None:
    huge = "Bolo walked " + "along the river and over the old bridge " * 500 + "to the park"
    summary = ExtractiveSummarizer(max_chars=50, max_sentence_chars=240).summarize_now(None, [Episode("user", huge)])
    assert summary.startswith("user: Bolo walked")
    assert len(summary) == 50


def test_a_previous_summary_from_another_summarizer_is_read_sentence_by_sentence() -> None:
    facts = [
        "Hannah moved from Manchester to Lisbon in March.",
        "She works as a product analyst at Maré Pay.",
        "Her dog Bolo is a five-year-old beagle mix.",
    ]
    previous = " ".join(facts * 6)  # one long paragraph, no roles
    summary = ExtractiveSummarizer(max_chars=300).summarize_now(previous, [Episode("user", "Clara visits in May.")])
    assert len(summary) <= 300
    assert set(facts) <= set(summary.splitlines())


# What gets selected

CHIT_CHAT = ["Hi!", "Okay.", "What was it?", "Sure, thanks!", "Yes.", "Hello?"]
FACTS = [
    "My sister Clara moved to Porto in May and works as a nurse at São João hospital.",
    "The rent for the Arroios flat is 1,180 euros a month, paid on the first.",
    "Bolo, my beagle mix, sees Doctor Matos for his vaccine on 3 June.",
]


def test_role_labels_do_not_count_as_words() -> None:
    # Counting "user" as a word once filled summaries with lines like "user: Hi!".
    previous = "\n".join(f"user: {line}" for line in CHIT_CHAT * 4)
    new = [Episode("user", line) for line in CHIT_CHAT]
    new[2:2] = [Episode("user", fact) for fact in FACTS]
    summary = ExtractiveSummarizer(max_chars=320).summarize_now(previous, new)
    assert summary.splitlines() == [f"user: {fact}" for fact in FACTS]


def test_a_line_of_one_content_word_does_not_beat_an_informative_one() -> None:
    informative = "Bolo sees Doctor Matos for his vaccine on 3 June."
    new = [Episode("user", informative), Episode("user", "Lisbon?"), Episode("assistant", "Porto!")]
    summary = ExtractiveSummarizer(max_chars=60).summarize_now(None, new)
    assert summary == f"user: {informative}"


def test_every_turn_folded_in_leaves_its_best_sentence_in_the_summary() -> None:
    # New information always gets in, even against a summary full of strong old lines.
    summarizer = ExtractiveSummarizer()
    summary = None
    for episode in SAMPLE[:150]:
        summary = summarizer.summarize_now(summary, [episode])
        assert any(line.split(": ", 1)[1].rstrip("…") in episode.content for line in summary.splitlines())


LAST_THIRD = ["Azores", "São Miguel", "Ponta Delgada", "Furnas", "whale", "B1", "Clara"]  # first said after turn 200
FIRST_THIRD = ["Hannah", "Lisbon", "Maré Pay", "Bolo", "Inês", "Arroios", "CIPLE", "14 April"]  # introduced by turn 80


def test_the_replayed_sample_follows_the_conversation_and_keeps_durable_facts() -> None:
    summary = replay(ExtractiveSummarizer(), SAMPLE)
    assert summary is not None
    lines = summary.splitlines()
    said_in = [first_said_in(line) for line in lines]
    last_third = len(SAMPLE) * 2 // 3
    # Recent topics are in: most lines come from the last third...
    assert sum(number > last_third for number in said_in) >= len(lines) / 2
    assert sum(word in summary for word in LAST_THIRD) >= 3
    # ...but old information fades gradually, not all at once.
    assert any(number <= last_third for number in said_in)
    assert sum(word in summary for word in FIRST_THIRD) >= 2


@pytest.mark.parametrize(
    ("number", "correction", "stale"),
    [
        (15, "my dog's name is Bolo, not Bola", None),
        (27, "it's 1,180 euros now, not 1,250", "1,250"),
        (77, "my start date moved to 14 April instead of 7 April", "7 April"),
        (221, "we're moving the trip to 19 to 26 September", None),
    ],
)
def test_a_correction_enters_the_summary_as_it_is_folded_in(number: int, correction: str, stale: str | None) -> None:
    assert correction in turn(number).content
    summarizer = ExtractiveSummarizer()
    before = replay(summarizer, SAMPLE[: number - 1], window=0)
    after = summarizer.summarize_now(before, [turn(number)])
    assert correction in after
    if stale is not None:  # no line still states the old value
        assert all(f"not {stale}" in line or f"of {stale}" in line for line in after.splitlines() if stale in line)


def test_a_correction_in_a_large_batch_supersedes_the_old_value() -> None:
    summarizer = ExtractiveSummarizer()
    before = replay(summarizer, SAMPLE[:40], window=0)
    assert "7 April" in before  # the first start date, moved to 14 April in turn 77
    after = summarizer.summarize_now(before, SAMPLE[40:100])
    assert "14 April" in after
    assert all("not 7 April" in line or "of 7 April" in line for line in after.splitlines() if "7 April" in line)


# Sentences


@pytest.mark.parametrize(
    "sentence",
    [
        "Dr. Matos gave Bolo his leishmaniasis vaccine on Friday.",
        "Mr. and Mrs. Almeida invited Hannah to dinner in Alfama.",
        "Bring the documents, e.g. the passport and the lease, to the AIMA office.",
        "The vet opens at 9 a.m. on Saturdays near Avenida Almirante Reis.",
        "J. R. R. Tolkien is Clara's favourite author for the beach.",
        "The flat is at No. 5 Rua de Arroios, third floor, no lift.",
        "Clara flies in from the U.S. on 21 September with Delta.",
    ],
)
def test_abbreviations_do_not_end_sentences(sentence: str) -> None:
    follow_up = "Hannah booked a table for two at the tasca."
    summary = ExtractiveSummarizer().summarize_now(None, [Episode("user", f"{sentence} {follow_up}")])
    assert summary.splitlines() == [f"user: {sentence}", f"user: {follow_up}"]


def test_stray_punctuation_and_spacing_make_no_empty_lines() -> None:
    content = "  Bolo is fine.   \n\n !!  ... Really?!  The vet said so.\t\t. Dr.  "
    summary = ExtractiveSummarizer().summarize_now(None, [Episode("user", content)])
    assert summary.splitlines() == ["user: Bolo is fine.", "user: The vet said so."]
    assert all(re.search(r"\w", line.removeprefix("user: ")) for line in summary.splitlines())


# Interface


@pytest.mark.anyio
async def test_summarize_gives_what_summarize_now_gives() -> None:
    summarizer = ExtractiveSummarizer()
    assert await summarizer.summarize(None, SAMPLE[:30]) == summarizer.summarize_now(None, SAMPLE[:30])


@pytest.mark.parametrize(
    "options",
    [
        {"max_chars": 0},
        {"max_sentence_chars": 0},
        {"fresh_share": -0.1},
        {"fresh_share": 1.5},
        {"half_life": 0},
    ],
)
def test_invalid_options_are_rejected(options: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ExtractiveSummarizer(**options)  # type: ignore[arg-type]
