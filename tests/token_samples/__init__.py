"""Texts of each kind an agent's memory holds, with their token counts by real tokenizers.

``references.json`` holds, per sample, per message, the counts of OpenAI's
``o200k_base`` and ``cl100k_base`` encodings, recorded by ``record.py`` (which
needs ``tiktoken``; memengine does not). The tests in ``test_tokens.py`` and
``benchmarks/tokens.py --accuracy`` compare the offline estimate with them.
A sample file holds its messages separated by blank lines; ``conversation`` is
the conversation bundled with the package (one message per turn); ``edge`` is
made here (:func:`edge_cases`): long runs, emoji, URLs, logs, minified code.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
SAMPLE_FILES = {
    "conversation": None,
    "prose": "prose.txt",
    "python": "python_code.py.txt",
    "json": "json.txt",
    "tech_docs": "tech_docs.md",
    "base64": "base64.txt",
    "hex": "hex.txt",
    "cjk": "cjk.txt",
    "russian": "russian.txt",
    "edge": None,
}
ENCODINGS = ("o200k_base", "cl100k_base")


def messages(kind: str) -> list[str]:
    """The sample's messages, in order."""
    name = SAMPLE_FILES[kind]
    if kind == "edge":
        return list(edge_cases().values())
    if name is None:
        from memengine.cli.conversation import load_sample_conversation

        return [turn.content for turn in load_sample_conversation()]
    text = (HERE / name).read_text(encoding="utf-8")
    return [part.strip("\n") for part in text.split("\n\n") if part.strip()]


def references() -> dict[str, dict[str, list[int]]]:
    """``{kind: {encoding: [tokens of each message]}}``, as recorded."""
    return json.loads((HERE / "references.json").read_text(encoding="utf-8"))


def edge_cases() -> dict[str, str]:
    """Texts beyond the other samples' shapes, made the same way every time."""
    rng = random.Random(3)

    def hexes(size: int) -> str:
        return rng.randbytes(size).hex()

    return {
        "10,000 spaces": " " * 10_000,
        "10,000 newlines": "\n" * 10_000,
        "10,000 tabs": "\t" * 10_000,
        "10,000 letters": "a" * 10_000,
        "10,000 equals signs": "=" * 10_000,
        "10,000 digits": "".join(rng.choice("0123456789") for _ in range(10_000)),
        "emoji": "\U0001f642\U0001f389\U0001f44d great job! \U0001f680\U0001f525" * 200,
        "URLs": " ".join(
            f"https://example.com/path/{rng.randrange(10**6)}/item?id={rng.randrange(10**9)}&ref=abc"
            for _ in range(200)
        ),
        "log lines": "\n".join(
            f"2026-12-04T16:{rng.randrange(60):02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}Z INFO "
            f"worker[{rng.randrange(64)}] request id={hexes(6)} took {rng.random() * 100:.2f}ms status=200"
            for _ in range(200)
        ),
        "minified JavaScript": (
            "function(a,b){return a.map(function(c){return c*b})};var x=document.getElementById('app');"
            "x.innerHTML='<div class=\"c\">'+y+'</div>';"
        )
        * 50,
        "markdown table": "\n".join(
            f"| {rng.randrange(1000)} | item {i} | {rng.random():.3f} | ok |" for i in range(300)
        ),
        "UUIDs": "\n".join(f"{hexes(4)}-{hexes(2)}-{hexes(2)}-{hexes(2)}-{hexes(6)}" for _ in range(300)),
        "German": (
            "Die Bundesregierung hat am Mittwoch beschlossen, die F\u00f6rderung f\u00fcr erneuerbare Energien im "
            "kommenden Jahr deutlich zu erh\u00f6hen. Unternehmen k\u00f6nnen ab M\u00e4rz neue Antr\u00e4ge stellen. "
        )
        * 20,
        "indented code": "\n".join(f"        value_{i} = compute(value_{i - 1}, factor={i})" for i in range(300)),
        "numbers, CSV": "\n".join(
            ",".join(str(rng.randrange(10 ** rng.randrange(1, 9))) for _ in range(10)) for _ in range(200)
        ),
    }
