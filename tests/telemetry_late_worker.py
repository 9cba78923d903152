"""Child process for test_telemetry: global providers configured only after the engine opened.

Setting the global providers cannot be undone in a process, so this runs in
one of its own. Prints the names of the finished spans and the operations
measured (in order), as JSON.
"""

from __future__ import annotations

import json
import sys

import anyio
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memengine import Episode, open_engine


async def main(path: str) -> None:
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    async with open_engine(path) as engine:  # the global providers: none configured yet
        session = engine.session("s1")
        await session.add([Episode("user", "before any provider")])
        await session.context()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        await session.add([Episode("user", "after the providers")])
    measured = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "gen_ai.client.operation.duration":
                    for point in metric.data.data_points:
                        measured.append([point.attributes["memengine.operation"], point.count])
    spans = [span.name for span in exporter.get_finished_spans()]
    print(json.dumps({"spans": spans, "measured": measured}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], backend=sys.argv[2])
