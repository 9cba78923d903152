"""The OpenAI Agents SDK tests: the SDK's own (vendored/) and ours, against MemEngineSession.

The SDK is asyncio-only, so these tests run on asyncio only. No test here
reaches the network: tracing is off, and the SDK's real model clients fail
the test if called (as in the SDK's own conftest.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pip install 'agent-memengine[agents]')")

from agents import set_tracing_disabled
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)


@pytest.fixture(autouse=True)
def _no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        pytest.fail("a real model was called; these tests run offline")

    for model in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(model, "get_response", refuse)
        monkeypatch.setattr(model, "stream_response", refuse)
