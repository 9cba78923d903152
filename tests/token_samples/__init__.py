"""Texts of each kind an agent's memory holds, with their token counts by real tokenizers.

``references.json`` holds, per sample, per message, the counts of OpenAI's
``o200k_base`` and ``cl100k_base`` encodings, recorded by ``record.py`` (which
needs ``tiktoken``; memengine does not). The tests in ``test_tokens.py`` and
``benchmarks/tokens.py --accuracy`` compare the offline estimate with them.
A sample file holds its messages separated by blank lines; ``conversation`` is
the conversation bundled with the package (one message per turn).
"""

from __future__ import annotations

import json
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
}
ENCODINGS = ("o200k_base", "cl100k_base")


def messages(kind: str) -> list[str]:
    """The sample's messages, in order."""
    name = SAMPLE_FILES[kind]
    if name is None:
        from memengine.cli.conversation import load_sample_conversation

        return [turn.content for turn in load_sample_conversation()]
    text = (HERE / name).read_text(encoding="utf-8")
    return [part.strip("\n") for part in text.split("\n\n") if part.strip()]


def references() -> dict[str, dict[str, list[int]]]:
    """``{kind: {encoding: [tokens of each message]}}``, as recorded."""
    return json.loads((HERE / "references.json").read_text(encoding="utf-8"))
