"""One test that searches the world: after ``forget(tenant=...)``, nothing memengine writes holds the tenant's text.

The tenant's every text carries a unique marker, and the tenant has every
kind of trace: summaries, a summary batch set aside (the model's refusal
quoting it), a retain batch set aside (the sink's refusal quoting it), a
batch the sink refused once (quoting it) before taking it, a recording
(``record_to``), and telemetry on. After the forget, the marker is searched
for in every text column of every table of the store, the recording, the
set-aside listing, an export of the other tenants and every log record
captured (DEBUG and up): none may hold it, and the sink holds nothing of the
tenant. On both stores and both async libraries.
"""

from __future__ import annotations

import logging
import uuid

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memengine import Episode, open_engine

from .erasure_world import file_holds, json_holds, log_text, store_holding
from .fakes import QuotingSummarizer
from .test_error_text_erasure import CONFIG
from .test_retain_delivery import GUARD

pytestmark = pytest.mark.anyio

NO_SUMMARY = "no-summary"  # the summarizer refuses a batch holding this, quoting it
NO_RETAIN = "no-retain"  # the sink refuses a batch holding this, quoting it


class WorldSink:
    """The README's DictSink that refuses (quoting) what holds NO_RETAIN, and the first call of ``once`` sessions."""

    mode = "append"

    def __init__(self) -> None:
        self.sessions: dict[str, dict[int, str]] = {}
        self.refused_once: set[str] = set()
        self.forgot: set[str] = set()

    async def retain(self, batch) -> None:
        for episode in batch.episodes:
            if NO_RETAIN in episode.content:
                raise ValueError(f"refusing to store {episode.content!r}")
        if batch.session_id.endswith("/once") and batch.session_id not in self.refused_once:
            self.refused_once.add(batch.session_id)
            raise ConnectionError(f"sink busy, try {batch.episodes[0].content!r} again")
        self.sessions.setdefault(batch.session_id, {}).update({e.seq: e.content for e in batch.episodes})

    async def forget(self, request) -> None:
        stored = self.sessions.get(request.session_id, {})
        for seq in list(stored) if request.seqs is None else request.seqs:
            stored.pop(seq, None)
        self.forgot.add(request.session_id)


async def until(condition) -> None:
    with anyio.fail_after(GUARD):
        while not await condition():  # noqa: ASYNC110 - polls what a user can observe
            await anyio.sleep(0.01)


async def test_after_a_tenant_forget_nothing_memengine_writes_holds_its_text(store_url, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    marker = f"zq{uuid.uuid4().hex[:12]}"
    recording = tmp_path / "messages.jsonl"
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = WorldSink()
    async with open_engine(
        store_url,
        summarizer=QuotingSummarizer(NO_SUMMARY),
        retain_sink=sink,
        config=CONFIG,
        record_to=recording,
        tracer_provider=tracer_provider,
        retain_grace=0,
    ) as engine:
        summarized = engine.session("w/summarized")
        await summarized.add([Episode("user", f"{marker} turn {n}", metadata={"m": marker}) for n in range(6)])
        assert marker in (await summarized.context(wait_for_summary=True)).summary  # type: ignore[operator]
        await engine.session("w/refused-summary").add(
            [Episode("user", f"{marker} {NO_SUMMARY}")] + [Episode("user", f"{marker} later {n}") for n in range(3)]
        )
        await engine.session("w/refused-retain").add([Episode("user", f"{marker} {NO_RETAIN}")])
        await engine.session("w/once").add([Episode("user", f"{marker} refused once")])
        await engine.session("o/other").add([Episode("user", "the other tenant's words")])

        async def everything_in_place() -> bool:
            stats = await engine.stats()
            return (
                stats.summaries_set_aside >= 1
                and stats.retains_set_aside >= 1
                and sink.sessions.get("w/once") == {1: f"{marker} refused once"}
                and len(sink.sessions.get("w/summarized", {})) == 6
            )

        await until(everything_in_place)
        listed = await engine.list_set_aside()
        assert json_holds([work.error for work in listed], marker)  # the traces are there before the forget
        assert file_holds(recording, marker) and store_holding(store_url, marker)

        await engine.forget(tenant="w")

        async def sink_told() -> bool:
            # The sink forgot every session it held something of; what waited for it left the store.
            report = await engine.forget(tenant="w")
            return {"w/summarized", "w/once"} <= sink.forgot and report.sessions == 0

        await until(sink_told)
        assert store_holding(store_url, marker) == []
        assert not file_holds(recording, marker)
        assert not json_holds([(work.session_id, work.error) for work in await engine.list_set_aside()], marker)
        exported = [record async for record in engine.export(tenant="o")]
        assert exported and not json_holds(exported, marker)
        assert all(stored == {} for session_id, stored in sink.sessions.items() if session_id.startswith("w/"))
        assert sink.sessions["o/other"] == {1: "the other tenant's words"}
    assert store_holding(store_url, marker) == []
    assert not file_holds(recording, marker)
    assert marker not in log_text(caplog.records)
    spans = exporter.get_finished_spans()
    assert spans and not json_holds([(span.name, dict(span.attributes or {})) for span in spans], marker)
