# Vendored from the OpenAI Agents SDK, openai-agents 0.24.0 (the PyPI sdist),
# tests/test_responses.py (only the helper the session tests use), MIT License,
# Copyright (c) 2025 OpenAI: see tests/agents_sdk/vendored/LICENSE.
from __future__ import annotations

from openai.types.responses import ResponseOutputItem, ResponseOutputMessage, ResponseOutputText


def get_text_message(content: str) -> ResponseOutputItem:
    return ResponseOutputMessage(
        id="1",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )
