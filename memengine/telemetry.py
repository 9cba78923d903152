"""OpenTelemetry spans and metrics: emitted when ``opentelemetry-api`` is installed, nothing otherwise.

opentelemetry is imported when an engine opens, never by ``import memengine``.
What is emitted (see the README's "Observability"):

- A span per client operation, named ``"{gen_ai.operation.name} {method}"``
  (``create_memory add``, ``search_memory context``, ``search_memory recall``,
  ``delete_memory delete_episodes``, ``delete_memory clear``), following the
  GenAI memory conventions: ``gen_ai.operation.name``, ``gen_ai.conversation.id``
  (the session id), ``gen_ai.memory.record.count`` (episodes added, returned,
  found or deleted), and on failure ``error.type`` (the exception's class name)
  with an error status. A cancelled call ends its span with ``error.type`` set to
  the backend's cancellation class and no error status.
- A span per summarizer call (``memengine.summarize``, the count is the episodes
  folded in) and per retain sink call (``memengine.retain``, the count is the
  batch's episodes; for a ``forget`` call, the seqs forgotten, 0 for a whole
  session). Client spans are children of the caller's current span; these two
  are roots (the engine's own tasks run them, after the call that caused
  them), made current so spans the summarizer or the sink start (an LLM call)
  nest under them.
- Content (episode text, summaries, queries) only when opted in: ``open_engine(
  capture_content=True)``, or with ``capture_content`` left at None, the
  environment variable ``MEMENGINE_OTEL_CAPTURE_CONTENT=true``.
- The histogram ``gen_ai.client.operation.duration`` (seconds) for every span
  above, with ``gen_ai.operation.name``, ``memengine.operation`` and, on
  failure, ``error.type``; and the gauges of :class:`~memengine.stats.EngineStats`.
"""

from __future__ import annotations

import json
import os
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

CAPTURE_CONTENT_ENV = "MEMENGINE_OTEL_CAPTURE_CONTENT"
SCOPE = "memengine"
DURATION = "gen_ai.client.operation.duration"


def capture_content_default(capture_content: bool | None) -> bool:
    """``capture_content`` as given, or when None, from :data:`CAPTURE_CONTENT_ENV` (default off)."""
    if capture_content is not None:
        if not isinstance(capture_content, bool):
            raise TypeError(f"capture_content must be a bool or None, not {type(capture_content).__name__}")
        return capture_content
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class Operation:
    """One traced operation: a span (when tracing) and a duration measurement. Use it as a context manager.

    It never changes what passes through: an exception leaves ``__exit__``
    as it came in, and a cancelled operation's span ends.
    """

    __slots__ = ("_attributes", "_content", "_count", "_span", "_started", "_telemetry", "_token")

    def __init__(self, telemetry: Telemetry, operation_name: str, method: str, session_id: str | None) -> None:
        self._telemetry = telemetry
        self._attributes: dict[str, Any] = {"gen_ai.operation.name": operation_name, "memengine.operation": method}
        if session_id is not None:
            self._attributes["gen_ai.conversation.id"] = session_id
        self._count: int | None = None
        self._content: dict[str, str] = {}
        self._span: Any = None
        self._token: Any = None
        self._started = 0.0

    def count(self, records: int) -> None:
        """Set ``gen_ai.memory.record.count``."""
        self._count = records

    def content(self, attribute: str, text: Callable[[], object]) -> None:
        """Set a content attribute, only if content capture is on (``text`` is not called otherwise)."""
        if self._telemetry.capture_content and self._telemetry.tracing:
            value = text()
            self._content[attribute] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def __enter__(self) -> Operation:
        telemetry = self._telemetry
        self._started = time.perf_counter()
        if telemetry.tracing:
            operation_name = self._attributes["gen_ai.operation.name"]
            if operation_name.startswith("memengine."):
                # The engine's own work, in a task of the engine's: a root span, since the task's context
                # is whatever call happened to activate the session. Current while the summarizer or
                # sink runs, so the spans they start nest under it.
                self._span = telemetry.start_span(operation_name, None, self._attributes)
                self._token = telemetry.make_current(self._span)
            else:
                # A caller's operation: a child of the caller's current span. Not made current: the
                # work happens in the session's actor, and a task the call starts (an activation)
                # must not inherit it.
                name = f"{operation_name} {self._attributes['memengine.operation']}"
                self._span = telemetry.start_span(name, telemetry.client_kind, self._attributes)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        telemetry = self._telemetry
        error_type = None if kind is None else kind.__qualname__
        try:
            if self._token is not None:
                telemetry.detach(self._token)
            if self._span is not None:
                span = self._span
                if self._count is not None:
                    span.set_attribute("gen_ai.memory.record.count", self._count)
                for attribute, value in self._content.items():
                    span.set_attribute(attribute, value)
                if error_type is not None:
                    span.set_attribute("error.type", error_type)
                    if isinstance(error, Exception):
                        telemetry.set_error(span, error_type)
                span.end()
            if telemetry.duration is not None:
                attributes = {
                    "gen_ai.operation.name": self._attributes["gen_ai.operation.name"],
                    "memengine.operation": self._attributes["memengine.operation"],
                }
                if error_type is not None:
                    attributes["error.type"] = error_type
                telemetry.duration.record(time.perf_counter() - self._started, attributes)
        except Exception:  # telemetry must never change the operation's outcome
            pass


class _NoOperation(Operation):
    """What :meth:`Telemetry.operation` returns while nothing would be recorded: does nothing, costs nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def count(self, records: int) -> None:
        pass

    def content(self, attribute: str, text: Callable[[], object]) -> None:
        pass

    def __enter__(self) -> Operation:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        pass


NO_OPERATION = _NoOperation()


class Telemetry:
    """An engine's tracer and meter, or nothing when opentelemetry is not installed."""

    def __init__(self, tracer: Any = None, meter: Any = None, capture_content: bool = False) -> None:
        self._tracer = tracer
        self._meter = meter
        # Set when the engine uses the global providers and none was configured yet: then nothing
        # is recorded (the API's proxies drop everything) until the application configures one.
        self._unconfigured: Callable[[], bool] | None = None
        self.capture_content = capture_content
        self.duration: Any = None
        self.client_kind: Any = None
        self._api: Any = None
        self._meter_provider: Any = None
        if meter is not None:
            self.duration = _duration_histogram(meter)

    @property
    def tracing(self) -> bool:
        return self._tracer is not None

    @property
    def metering(self) -> bool:
        return self._meter is not None

    @classmethod
    def start(cls, tracer_provider: Any = None, meter_provider: Any = None, capture_content: bool = False) -> Telemetry:
        """From the given providers (default: the global ones), or a no-op one without opentelemetry."""
        try:
            from opentelemetry import context, metrics, trace
        except ImportError:
            if tracer_provider is not None or meter_provider is not None:
                raise ImportError(
                    "tracer_provider and meter_provider need opentelemetry-api: pip install 'agent-memengine[otel]'"
                ) from None
            return cls(capture_content=capture_content)
        from ._version import installed_version

        version = installed_version()
        tracer = trace.get_tracer(SCOPE, version, tracer_provider)
        meter = metrics.get_meter(SCOPE, version, meter_provider)
        telemetry = cls(tracer, meter, capture_content)
        telemetry._meter_provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        telemetry._api = (context, trace)
        telemetry.client_kind = trace.SpanKind.CLIENT
        if tracer_provider is None and meter_provider is None:
            telemetry._unconfigured = _while_unconfigured(trace, metrics)
        return telemetry

    def operation(self, operation_name: str, method: str, session_id: str | None = None) -> Operation:
        """A traced operation; a no-op without opentelemetry, or while no provider is configured."""
        if self._tracer is None and self._meter is None:
            return NO_OPERATION
        if self._unconfigured is not None and self._unconfigured():
            return NO_OPERATION
        return Operation(self, operation_name, method, session_id)

    def start_span(self, name: str, kind: Any, attributes: dict[str, Any]) -> Any:
        """A child of the current span with a ``kind``; without one, an internal root span."""
        if kind is None:
            context, _ = self._api
            return self._tracer.start_span(name, context=context.Context(), attributes=attributes)
        return self._tracer.start_span(name, kind=kind, attributes=attributes)

    def make_current(self, span: Any) -> Any:
        context, trace = self._api
        return context.attach(trace.set_span_in_context(span))

    def detach(self, token: Any) -> None:
        context, _ = self._api
        context.detach(token)

    def set_error(self, span: Any, error_type: str) -> None:
        _, trace = self._api
        span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))

    def observe(self, engine: Observed) -> None:
        """Show ``engine``'s figures in the gauges of this meter provider, while it is open."""
        if self._meter is not None:
            _gauges_of(self._meter_provider, self._meter).engines.add(engine)


def _while_unconfigured(trace: Any, metrics: Any) -> Callable[[], bool] | None:
    """A check that the global providers are still the API's defaults, which record nothing; None if not now.

    Until the application sets a provider, the API hands out proxies: spans
    and measurements through them go nowhere, but building them costs each
    operation a few microseconds. Checked at every operation, not only at
    open, so that a provider configured after the engine opened is used.

    The check reads the API's own globals: its public getters look at
    ``os.environ`` on every call while unset, which costs more than the
    operation it would save. Where those globals are not found (another
    version of the API), operations are always recorded, as before.
    """
    try:
        import opentelemetry.metrics._internal as metrics_state
    except ImportError:
        return None

    if (
        not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        or type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"
        or getattr(trace, "_TRACER_PROVIDER", ...) is not None
        or getattr(metrics_state, "_METER_PROVIDER", ...) is not None
    ):
        return None  # configured already (or an API we do not know): always record

    def unconfigured() -> bool:
        return trace._TRACER_PROVIDER is None and metrics_state._METER_PROVIDER is None  # type: ignore[no-any-return]

    return unconfigured


class Observed(Protocol):
    def _gauge_figures(self) -> dict[str, float] | None: ...


#: The gauges: name, unit, description, and how the figures of several open engines combine.
GAUGES: tuple[tuple[str, str, str, Callable[[list[float]], float]], ...] = (
    ("memengine.sessions.active", "{session}", "Sessions activated in this process", sum),
    ("memengine.mailbox.depth", "{message}", "Messages waiting in the mailboxes of active sessions (sum)", sum),
    (
        "memengine.summary.waiting_episodes",
        "{episode}",
        "Evicted episodes of active sessions that no stored summary covers yet",
        sum,
    ),
    (
        "memengine.summary.holes",
        "{range}",
        "Ranges of summarized episodes of active sessions being summarized again after a delete",
        sum,
    ),
    # Per store, not per process: engines of one process normally share a store, so the largest.
    ("memengine.retain.outbox.depth", "{batch}", "Retain batches not yet delivered (sampled every 5 s)", max),
    ("memengine.retain.outbox.oldest_age", "s", "Age of the oldest undelivered retain batch", max),
    (
        "memengine.summary.set_aside",
        "{batch}",
        "Summary batches set aside after too many failed rounds (sampled every 5 s)",
        max,
    ),
    ("memengine.retain.set_aside", "{batch}", "Retain batches set aside after too many failed rounds", max),
)


class _Gauges:
    """One set of gauges per meter provider, over every engine open on it (a gauge cannot be unregistered)."""

    def __init__(self, meter: Any) -> None:
        self.engines: weakref.WeakSet[Observed] = weakref.WeakSet()
        from opentelemetry.metrics import Observation

        def callback_for(name: str, combine: Callable[[list[float]], float]) -> Callable[[Any], list[Observation]]:
            def callback(options: Any) -> list[Observation]:
                figures = [engine._gauge_figures() for engine in list(self.engines)]
                values = [found[name] for found in figures if found is not None and name in found]
                return [Observation(combine(values))] if values else []

            return callback

        for name, unit, description, combine in GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[callback_for(name, combine)], unit=unit, description=description
            )


_gauges: weakref.WeakKeyDictionary[Any, _Gauges] = weakref.WeakKeyDictionary()
_gauges_of_lasting: dict[int, tuple[Any, _Gauges]] = {}  # providers that take no weak reference


def _gauges_of(provider: Any, meter: Any) -> _Gauges:
    try:
        gauges = _gauges.get(provider)
    except TypeError:
        kept = _gauges_of_lasting.get(id(provider))
        if kept is None:
            kept = _gauges_of_lasting[id(provider)] = (provider, _Gauges(meter))
        return kept[1]
    if gauges is None:
        gauges = _gauges[provider] = _Gauges(meter)
    return gauges


#: The GenAI conventions' buckets for gen_ai.client.operation.duration, below 10 ms finer: most memory
#: operations take a few milliseconds.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                    20.48, 40.96, 81.92)  # fmt: skip


def _duration_histogram(meter: Any) -> Any:
    description = "Duration of memengine operations (GenAI memory operations, summarizer and sink calls)"
    try:
        return meter.create_histogram(
            DURATION, unit="s", description=description, explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS)
        )
    except TypeError:  # opentelemetry-api before 1.23 takes no advisory
        return meter.create_histogram(DURATION, unit="s", description=description)


#: For actors created without an engine (tests, tools): emits nothing.
NO_TELEMETRY = Telemetry()
