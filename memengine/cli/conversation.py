"""The sample conversation bundled with the package, replayed by ``memengine demo``."""

from __future__ import annotations

import json
from importlib.resources import files

import attrs

SAMPLE_FILE = "sample_conversation.jsonl"


@attrs.frozen
class Turn:
    """One line of the sample conversation."""

    role: str
    content: str


def load_sample_conversation() -> tuple[Turn, ...]:
    """Every turn of the bundled sample conversation, in order.

    The file is JSON Lines, one ``{"role": ..., "content": ...}`` object a line.
    """
    text = files("memengine.cli").joinpath(SAMPLE_FILE).read_text(encoding="utf-8")
    turns = []
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            turns.append(Turn(role=record["role"], content=record["content"]))
    return tuple(turns)
