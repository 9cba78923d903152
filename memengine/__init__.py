"""memengine: an actor-based memory engine for LLM agents.

Each session is an actor that owns a window of recent episodes and a rolling
summary of what left the window, backed by a durable, event-sourced store.
"""

from .clipping import ToolClipping
from .config import SessionConfig
from .context import Context, Omitted
from .engine import Engine, open_engine
from .episode import Episode
from .errors import (
    EngineClosedError,
    EngineFailedError,
    ForeignLoopError,
    ForgetIncompleteError,
    LeaseLostError,
    MemEngineError,
    SessionBusyError,
    SessionClosedError,
    StoreError,
    SummaryError,
    UncertainCommitError,
)
from .privacy.export import ExportStream
from .privacy.report import ForgetReport
from .retain.batch import ForgetRequest, ForgettingSink, RetainBatch, RetainSink
from .retain.delivery import RetainMetrics
from .session.handle import Session
from .stats import EngineStats
from .store.base import Recalled, SetAside
from .summarizer.extractive import ExtractiveSummarizer
from .summarizer.openai import OpenAISummarizer
from .summarizer.protocol import Summarizer


def __getattr__(name: str) -> str:
    # __version__ is read from the installed metadata only when asked for: importing stays cheap.
    if name == "__version__":
        from ._version import installed_version

        return installed_version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Context",
    "Engine",
    "EngineClosedError",
    "EngineFailedError",
    "EngineStats",
    "Episode",
    "ExportStream",
    "ExtractiveSummarizer",
    "ForeignLoopError",
    "ForgetIncompleteError",
    "ForgetReport",
    "ForgetRequest",
    "ForgettingSink",
    "LeaseLostError",
    "MemEngineError",
    "Omitted",
    "OpenAISummarizer",
    "Recalled",
    "RetainBatch",
    "RetainMetrics",
    "RetainSink",
    "Session",
    "SessionBusyError",
    "SessionClosedError",
    "SessionConfig",
    "SetAside",
    "StoreError",
    "Summarizer",
    "SummaryError",
    "ToolClipping",
    "UncertainCommitError",
    "open_engine",
]
