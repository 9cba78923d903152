"""A summarizer's or sink's error text may quote the episodes it was handed: it never outlives them.

memengine keeps such text only where erasure reaches it (the batch's row in
the store: ``retain_outbox.last_error``, ``summaries_set_aside.error``, shown
by ``list_set_aside``); its log lines name the error's type, never its text
(a log line cannot be taken back). After a delete, clear or forget, no text of
the erased episodes is left in those rows. On both stores and both libraries.
"""

from __future__ import annotations

import logging

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine

from .conftest import StoreRows
from .fakes import QuotingSummarizer
from .test_erasure_set_aside import MARKER, RefusingDictSink
from .test_retain_delivery import GUARD, QUICK

pytestmark = pytest.mark.anyio

#: Summary and retain batches set aside after one round of two quick attempts.
CONFIG = SessionConfig(
    evict_to=1.0,
    max_episodes=2,
    summarize_attempts=2,
    summarize_backoff=0.001,
    summarize_backoff_max=0.001,
    summarize_set_aside_after=1,
    retain_every=1,
    retain_attempts=2,
    retain_retry_later=0.01,
    retain_set_aside_after=1,
    **QUICK,
)


def logged_text(caplog: pytest.LogCaptureFixture) -> str:
    """Everything the captured log records say, tracebacks included."""
    handler = logging.Handler()
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    return "\n".join(handler.format(record) for record in caplog.records)


def stored_error_texts(rows: StoreRows) -> list[tuple]:
    return [
        *rows.query("SELECT session_id, error FROM summaries_set_aside"),
        *rows.query("SELECT session_id, last_error FROM retain_outbox WHERE last_error IS NOT NULL"),
    ]


async def both_set_aside(engine, session_id: str) -> None:
    session = engine.session(session_id)
    await session.add([Episode("user", "hello"), Episode("user", f"my {MARKER}")])
    await session.add([Episode("user", f"turn {n}") for n in range(4)])
    with anyio.fail_after(GUARD):
        while True:
            stats = await engine.stats()
            if stats.summaries_set_aside and stats.retains_set_aside:
                break
            await anyio.sleep(0.01)
    listed = await engine.list_set_aside()
    assert {work.kind for work in listed} == {"summary", "retain"}
    assert all(MARKER in work.error for work in listed)  # kept with the batch, where erasure reaches it


@pytest.mark.parametrize("erase", ["forget", "clear", "delete"])
async def test_error_texts_quoting_erased_episodes_are_erased_and_never_logged(store_url, caplog, erase) -> None:
    caplog.set_level(logging.DEBUG)
    rows = StoreRows(store_url)
    sink = RefusingDictSink()
    async with open_engine(
        store_url, summarizer=QuotingSummarizer(MARKER), retain_sink=sink, config=CONFIG, retain_grace=0
    ) as engine:
        await both_set_aside(engine, "t/a")
        assert any(MARKER in str(error) for _, error in stored_error_texts(rows))
        if erase == "forget":
            await engine.forget(tenant="t")
        elif erase == "clear":
            await engine.session("t/a").clear()
        else:
            await engine.session("t/a").delete_episodes([2])
        assert [work for work in await engine.list_set_aside() if MARKER in work.error] == []
        assert [row for row in stored_error_texts(rows) if MARKER in str(row[1])] == []
    assert MARKER not in logged_text(caplog)
    assert any(r.levelno == logging.ERROR and "set aside" in r.getMessage() for r in caplog.records)
