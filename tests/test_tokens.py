"""The offline token estimate: close to real tokenizers on every kind of text, linear on any text.

The reference counts were recorded from OpenAI's tokenizers (``tests/token_samples``);
memengine does not need ``tiktoken``, the tests read the recorded numbers.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memengine.tokens import estimate_tokens

from .token_samples import SAMPLE_FILES, edge_cases, messages, references

#: Kinds written in Latin script or ASCII: the estimate is within these bounds of o200k_base
#: (in total over the sample), slightly above as a budget wants.
LATIN = ("conversation", "prose", "python", "json", "tech_docs", "base64", "hex")
#: Where the two OpenAI encodings differ by 1.45-1.8x: the estimate lies between them, give or take.
OTHER = ("cjk", "russian")


def test_every_sample_kind_has_reference_counts() -> None:
    recorded = references()
    assert set(recorded) == set(SAMPLE_FILES) == {*LATIN, *OTHER, "edge"}
    for kind in SAMPLE_FILES:
        for counts in recorded[kind].values():
            assert len(counts) == len(messages(kind))


@pytest.mark.parametrize("kind", LATIN)
def test_latin_text_is_estimated_within_a_few_percent_above_o200k(kind: str) -> None:
    real = references()[kind]["o200k_base"]
    estimated = [estimate_tokens(text) for text in messages(kind)]
    assert -0.03 <= sum(estimated) / sum(real) - 1 <= 0.10
    per_message = [estimate / count - 1 for estimate, count in zip(estimated, real, strict=True)]
    assert -0.05 <= statistics.median(per_message) <= 0.10


@pytest.mark.parametrize("kind", OTHER)
def test_cjk_and_cyrillic_are_estimated_between_the_encodings(kind: str) -> None:
    recorded = references()[kind]
    o200k, cl100k = sum(recorded["o200k_base"]), sum(recorded["cl100k_base"])
    estimated = sum(estimate_tokens(text) for text in messages(kind))
    assert 0.75 * min(o200k, cl100k) <= estimated <= 1.25 * max(o200k, cl100k)


@pytest.mark.parametrize("index", range(len(edge_cases())), ids=list(edge_cases()))
def test_long_runs_emoji_urls_logs_and_minified_code_stay_in_a_wide_band(index: int) -> None:
    """Long runs of digits, newlines or spaces are counted as the encodings merge them, never as one token."""
    recorded = references()["edge"]
    o200k, cl100k = recorded["o200k_base"][index], recorded["cl100k_base"][index]
    estimated = estimate_tokens(messages("edge")[index])
    assert 0.75 * min(o200k, cl100k) <= estimated <= 1.7 * max(o200k, cl100k)


def test_short_texts() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a") == 1
    assert estimate_tokens("hello world") == 2


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000), st.text(max_size=2000))  # within one 16 KB block
def test_appending_never_counts_less_and_a_join_adds_little(first: str, second: str) -> None:
    alone = estimate_tokens(first)
    joined = estimate_tokens(first + second)
    assert joined >= alone
    assert joined <= alone + estimate_tokens(second) + 4  # a word, hump or indent formed at the join
    if first:
        assert 1 <= alone <= 2 * len(first.encode("utf-8", "surrogatepass")) + 1


PATHOLOGICAL = """
from memengine.tokens import estimate_tokens
n = 4_000_000
for text in ("a+" * (n // 2), "a" * n, "1" * n, " " * n, "\\n" * n, "=" * n, "aB" * (n // 2), "\\u4e2d" * n):
    print(estimate_tokens(text))
"""


def test_four_million_characters_of_any_shape_are_estimated() -> None:
    """The old regular expression rescanned digit-free runs: 32,000 characters of ``a+a+...`` took 51 s.

    Linear, this is well under a second; the generous timeout only catches a hang.
    """
    done = subprocess.run([sys.executable, "-c", PATHOLOGICAL], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    counts = [int(line) for line in done.stdout.split()]
    assert len(counts) == 8
    assert all(count >= 1 for count in counts)
    assert counts[0] >= 2_000_000  # a+a+...: one word and one punctuation run per two characters
