"""OpenTelemetry spans and metrics, and engine.stats(), with the SDK's in-memory exporter and reader.

Each test passes its own providers to open_engine, so nothing global is set.
"""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from memengine import EngineStats, Episode, SessionClosedError, SessionConfig, open_engine

from .fakes import ForgettingSink, GatedSummarizer, RecordingSink, StuckSink, turns

pytestmark = pytest.mark.anyio


class Telemetry:
    """A tracer provider and a meter provider of this test's own, with what they received."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def providers(self) -> dict[str, object]:
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    def span(self, name: str) -> ReadableSpan:
        (span,) = self.spans(name)
        return span

    def metrics(self) -> dict[str, list]:
        found: dict[str, list] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                assert scope.scope.name == "memengine"
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).append(metric)
        return found

    def gauge(self, name: str) -> float:
        (metric,) = self.metrics()[name]
        (point,) = metric.data.data_points
        return point.value


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


def attributes(span: ReadableSpan) -> dict:
    return dict(span.attributes or {})


async def test_client_operations_are_genai_memory_spans(db_path, telemetry) -> None:
    async with open_engine(db_path, **telemetry.providers()) as engine:
        session = engine.session("s1")
        await session.add([Episode("user", "the secret is pelican"), Episode("assistant", "noted")])
        await session.context()
        await engine.recall("pelican", session_id="s1")
        assert await session.delete_episodes([1]) == 1
        await session.clear()

    expected = {
        "create_memory add": ("create_memory", 2),
        "search_memory context": ("search_memory", 2),
        "search_memory recall": ("search_memory", 1),
        "delete_memory delete_episodes": ("delete_memory", 1),
        "delete_memory clear": ("delete_memory", None),
    }
    for name, (operation, count) in expected.items():
        span = telemetry.span(name)
        assert span.kind is SpanKind.CLIENT
        assert span.instrumentation_scope.name == "memengine"
        assert span.status.status_code is StatusCode.UNSET
        assert attributes(span).get("gen_ai.operation.name") == operation
        assert attributes(span).get("gen_ai.conversation.id") == "s1"
        assert attributes(span).get("gen_ai.memory.record.count") == count
        assert "error.type" not in attributes(span)
    # Content is off by default: no episode text or query anywhere in the spans.
    for span in telemetry.exporter.get_finished_spans():
        assert not any("pelican" in str(value) for value in attributes(span).values()), span.name


async def test_content_is_recorded_when_opted_in(db_path, telemetry) -> None:
    sink = RecordingSink()
    config = SessionConfig(max_episodes=2, retain_every=1)
    async with open_engine(
        db_path, capture_content=True, config=config, retain_sink=sink, **telemetry.providers()
    ) as engine:
        session = engine.session("s1")
        await session.add([Episode("user", "the secret is pelican")])
        await session.context()
        await engine.recall("pelican", all_sessions=True)
        await session.add(turns(2))
        await session.context(wait_for_summary=True)
        with anyio.fail_after(60):
            await sink.wait_for(2)
    assert "pelican" in attributes(telemetry.spans("memengine.summarize")[0])["memengine.summary"]
    assert "pelican" in attributes(telemetry.spans("memengine.retain")[0])["gen_ai.memory.content"]
    assert "the secret is pelican" in attributes(telemetry.spans("create_memory add")[0])["gen_ai.memory.content"]
    assert "the secret is pelican" in attributes(telemetry.spans("search_memory context")[0])["gen_ai.memory.content"]
    recall = attributes(telemetry.span("search_memory recall"))
    assert recall["gen_ai.memory.query.text"] == "pelican"
    assert "gen_ai.conversation.id" not in recall  # a search over every session


async def test_the_environment_variable_turns_content_on(db_path, telemetry, monkeypatch) -> None:
    monkeypatch.setenv("MEMENGINE_OTEL_CAPTURE_CONTENT", "true")
    async with open_engine(db_path, **telemetry.providers()) as engine:
        await engine.session("s1").add([Episode("user", "pelican")])
    assert "pelican" in attributes(telemetry.span("create_memory add"))["gen_ai.memory.content"]


async def test_a_failing_operation_has_its_error_type_and_leaves_unchanged(db_path, telemetry) -> None:
    async with open_engine(db_path, **telemetry.providers()) as engine:
        session = engine.session("s1")
        with pytest.raises(ValueError, match="seq") as raised:
            await session.delete_episodes([0])
        assert raised.value.__traceback__ is not None
        await session.close()
        with pytest.raises(SessionClosedError):
            await session.add(turns(1))
    failed = telemetry.span("delete_memory delete_episodes")
    assert attributes(failed)["error.type"] == "ValueError"
    assert failed.status.status_code is StatusCode.ERROR
    closed = telemetry.span("create_memory add")
    assert attributes(closed)["error.type"] == "SessionClosedError"
    durations = {
        (point.attributes["memengine.operation"], point.attributes.get("error.type"))
        for metric in telemetry.metrics()["gen_ai.client.operation.duration"]
        for point in metric.data.data_points
    }
    assert ("delete_episodes", "ValueError") in durations
    (histogram,) = telemetry.metrics()["gen_ai.client.operation.duration"]
    assert histogram.unit == "s"
    assert histogram.data.data_points[0].explicit_bounds[:2] == (0.0005, 0.001)
    assert ("add", "SessionClosedError") in durations


async def test_a_cancelled_caller_ends_its_span(db_path, telemetry) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(max_episodes=2)
    async with open_engine(db_path, summarizer=summarizer, config=config, **telemetry.providers()) as engine:
        session = engine.session("s1")
        await session.add(turns(3))
        await summarizer.wait_until_called()
        with anyio.move_on_after(0.2):
            await session.context(wait_for_summary=True)
        span = telemetry.span("search_memory context")  # ended while the summary is still held back
        assert attributes(span)["error.type"] == anyio.get_cancelled_exc_class().__qualname__
        assert span.status.status_code is StatusCode.UNSET
        summarizer.release()
        assert (await session.context(wait_for_summary=True)).summary is not None


async def test_each_summarizer_call_is_a_span(db_path, telemetry) -> None:
    config = SessionConfig(max_episodes=2)
    async with open_engine(db_path, config=config, **telemetry.providers()) as engine:
        session = engine.session("s1")
        await session.add(turns(3))
        await session.context(wait_for_summary=True)
    (span,) = telemetry.spans("memengine.summarize")
    assert span.kind is SpanKind.INTERNAL
    assert attributes(span)["gen_ai.operation.name"] == "memengine.summarize"
    assert attributes(span)["gen_ai.conversation.id"] == "s1"
    assert attributes(span)["gen_ai.memory.record.count"] == 2  # evicted down to evict_to=0.5 of 2
    assert "memengine.summary" not in attributes(span)


async def test_each_retain_delivery_is_a_span_and_a_failure_has_its_error_type(db_path, telemetry) -> None:
    sink = RecordingSink(failures=1)
    config = SessionConfig(retain_every=2, retain_backoff=0.01)
    async with open_engine(db_path, retain_sink=sink, config=config, **telemetry.providers()) as engine:
        await engine.session("s1").add(turns(2))
        with anyio.fail_after(60):
            await sink.wait_for(1)
    failed, delivered = telemetry.spans("memengine.retain")
    for span in (failed, delivered):
        assert attributes(span)["gen_ai.operation.name"] == "memengine.retain"
        assert attributes(span)["gen_ai.conversation.id"] == "s1"
        assert attributes(span)["gen_ai.memory.record.count"] == 2
    assert attributes(failed)["error.type"] == "ConnectionError"
    assert failed.status.status_code is StatusCode.ERROR
    assert "error.type" not in attributes(delivered)


async def test_each_forget_is_a_retain_span_of_its_own_operation(db_path, telemetry) -> None:
    sink = ForgettingSink()
    config = SessionConfig(retain_every=3, max_episodes=100)
    async with open_engine(db_path, retain_sink=sink, config=config, **telemetry.providers()) as engine:
        session = engine.session("s1")
        await session.add(turns(3))
        with anyio.fail_after(60):
            await sink.wait_for_calls(1)
        await session.delete_episodes([1, 3])
        await session.clear()
        with anyio.fail_after(60):
            await sink.wait_for_calls(3)
    spans = telemetry.spans("memengine.retain")
    assert [(attributes(s)["memengine.operation"], attributes(s)["gen_ai.memory.record.count"]) for s in spans] == [
        ("retain", 3),
        ("forget", 2),
        ("forget", 0),  # a whole session
    ]
    assert {attributes(s)["gen_ai.conversation.id"] for s in spans} == {"s1"}


async def test_stats_and_gauges_show_sessions_and_episodes_waiting_for_a_summary(db_path, telemetry) -> None:
    summarizer = GatedSummarizer()
    config = SessionConfig(max_episodes=4)
    async with open_engine(db_path, summarizer=summarizer, config=config, **telemetry.providers()) as engine:
        assert await engine.stats() == EngineStats(0, 0, 0, 0, 0, None)
        await engine.session("s1").add(turns(5))
        await engine.session("s2").add(turns(1))
        await summarizer.wait_until_called()
        stats = await engine.stats()
        assert stats.active_sessions == 2
        assert stats.episodes_waiting_for_summary == 3  # 5 episodes, 2 kept (evict_to=0.5 of 4)
        assert telemetry.gauge("memengine.sessions.active") == 2
        assert telemetry.gauge("memengine.summary.waiting_episodes") == 3
        assert telemetry.gauge("memengine.mailbox.depth") == stats.mailbox_depth
        summarizer.release()
        await engine.session("s1").context(wait_for_summary=True)
        assert (await engine.stats()).episodes_waiting_for_summary == 0
        assert telemetry.gauge("memengine.summary.waiting_episodes") == 0


async def test_stats_show_the_outbox_behind_a_stuck_sink(db_path, telemetry) -> None:
    config = SessionConfig(retain_every=2)
    sink = StuckSink()
    async with open_engine(db_path, retain_sink=sink, config=config, retain_grace=0, **telemetry.providers()) as engine:
        session = engine.session("s1")
        await session.add(turns(2))
        await session.add(turns(2, start=3))
        with anyio.fail_after(60):  # the batches are recorded just after the adds return
            while (stats := await engine.stats()).outbox_depth < 2:  # noqa: ASYNC110 - a figure, no event
                await anyio.sleep(0.01)
        assert stats.outbox_depth == 2
        assert stats.oldest_undelivered_age is not None and stats.oldest_undelivered_age >= 0
        engine._outbox_sample = None  # the gauges read a sample taken every few seconds: take one now
        await engine._sample_outbox_once()
        assert telemetry.gauge("memengine.retain.outbox.depth") == 2


class RefusingSummarizer:
    async def summarize(self, previous, episodes):
        raise RuntimeError("refused")


class RefusingSink:
    mode = "append"

    async def retain(self, batch) -> None:
        raise ConnectionError("refused")


async def test_stats_and_gauges_count_the_work_set_aside(db_path, telemetry) -> None:
    config = SessionConfig(
        max_episodes=2,
        evict_to=1.0,
        retain_every=1,
        summarize_attempts=1,
        summarize_retry_later=0.001,
        summarize_set_aside_after=1,
        retain_attempts=1,
        retain_backoff=0.001,
        retain_retry_later=0.001,
        retain_set_aside_after=1,
    )
    async with open_engine(
        db_path,
        summarizer=RefusingSummarizer(),
        retain_sink=RefusingSink(),
        config=config,
        retain_grace=0,
        **telemetry.providers(),
    ) as engine:
        await engine.session("s").add(turns(3))
        with anyio.fail_after(60):
            while (stats := await engine.stats()).retains_set_aside < 1 or stats.summaries_set_aside < 1:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        assert (stats.summaries_set_aside, stats.retains_set_aside) == (1, 1)
        await engine._sample_set_aside_once()  # the gauges read a sample taken every few seconds: take one now
        assert telemetry.gauge("memengine.summary.set_aside") == 1
        assert telemetry.gauge("memengine.retain.set_aside") == 1


async def test_memengine_works_without_opentelemetry(db_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry` now fails
    async with open_engine(db_path, capture_content=True) as engine:
        session = engine.session("s1")
        await session.add(turns(3))
        assert len((await session.context()).episodes) == 3
        assert len(await engine.recall("turn", all_sessions=True)) == 3
        assert (await engine.stats()).active_sessions == 1
        with pytest.raises(ValueError):
            await session.delete_episodes([0])
    with pytest.raises(ImportError, match=r"agent-memengine\[otel\]"):
        async with open_engine(db_path, tracer_provider=TracerProvider()):
            pass


def test_importing_memengine_does_not_import_opentelemetry() -> None:
    code = "import sys, memengine; assert not any(m.startswith('opentelemetry') for m in sys.modules), 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_gauges_follow_the_open_engines_of_a_meter_provider(tmp_path, telemetry) -> None:
    async with open_engine(tmp_path / "a.db", **telemetry.providers()) as engine:
        await engine.session("s1").add(turns(1))
        assert telemetry.gauge("memengine.sessions.active") == 1
    assert "memengine.sessions.active" not in telemetry.metrics()  # a closed engine reports nothing
    async with open_engine(tmp_path / "b.db", **telemetry.providers()) as first:
        async with open_engine(tmp_path / "c.db", **telemetry.providers()) as second:
            await first.session("s1").add(turns(1))
            await second.session("s1").add(turns(1))
            await second.session("s2").add(turns(1))
            assert telemetry.gauge("memengine.sessions.active") == 3  # one gauge, summed over the open engines


class TracingSummarizer:
    """A summarizer that calls a "model" in a span of its own, as an instrumented LLM client would."""

    def __init__(self, tracer_provider: TracerProvider) -> None:
        self.tracer = tracer_provider.get_tracer("a model client")

    async def summarize(self, previous, episodes) -> str:
        with self.tracer.start_as_current_span("chat model"):
            await anyio.lowlevel.checkpoint()
            return f"{len(episodes)} episodes"


async def test_spans_nest_under_the_callers_and_a_summarizers_under_its_call(db_path, telemetry) -> None:
    summarizer = TracingSummarizer(telemetry.tracer_provider)
    caller = telemetry.tracer_provider.get_tracer("the application")
    config = SessionConfig(max_episodes=2)
    async with open_engine(db_path, summarizer=summarizer, config=config, **telemetry.providers()) as engine:
        with caller.start_as_current_span("handle a request") as request:
            session = engine.session("s1")  # activated inside the request: its tasks copy the request's context
            await session.add(turns(3))
            await session.context(wait_for_summary=True)
    add = telemetry.span("create_memory add")
    assert add.parent is not None and add.parent.span_id == request.get_span_context().span_id
    summarize = telemetry.span("memengine.summarize")
    assert summarize.parent is None  # the engine's own work: a root, correlated by gen_ai.conversation.id
    model = telemetry.span("chat model")
    assert model.parent is not None and model.parent.span_id == summarize.context.span_id
    assert model.context.trace_id == summarize.context.trace_id


class SlottedMeterProvider:
    """A meter provider that takes no weak reference (``__slots__``, no ``__weakref__``)."""

    __slots__ = ("inner",)

    def __init__(self, inner: MeterProvider) -> None:
        self.inner = inner

    def get_meter(self, name, version=None, schema_url=None, attributes=None):
        return self.inner.get_meter(name, version, schema_url, attributes)


async def test_a_meter_provider_without_weak_references_gets_its_gauges_once(tmp_path, telemetry) -> None:
    provider = SlottedMeterProvider(telemetry.meter_provider)
    for name in ("a.db", "b.db"):
        async with open_engine(tmp_path / name, meter_provider=provider) as engine:
            await engine.session("s1").add(turns(1))
            assert telemetry.gauge("memengine.sessions.active") == 1


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_global_providers_configured_after_the_engine_opened_are_used_from_then_on(tmp_path, backend) -> None:
    # Until a provider is configured, operations record nothing (and cost nothing); from then on, they do.
    done = subprocess.run(
        [sys.executable, "-m", "tests.telemetry_late_worker", str(tmp_path / "memory.db"), backend],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["spans"] == ["create_memory add"]
    assert seen["measured"] == [["add", 1]]
