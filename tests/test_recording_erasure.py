"""A recording (``record_to``) keeps no erased text: delete, clear and forget reach it, and it still replays.

The engine runs on both stores and both async libraries; the recording is a
file. Checked on the file's bytes (no erased text, nor an error text quoting
it) and on a replay of it into a fresh store (the same seqs and windows, no
mismatch).
"""

from __future__ import annotations

import anyio
import pytest

from memengine import Episode, SessionConfig, SummaryError, open_engine
from memengine.replay import read_log, recorded_config, replay

from .fakes import QuotingSummarizer

pytestmark = pytest.mark.anyio

CONFIG = SessionConfig(
    evict_to=1.0,
    max_episodes=3,
    max_chars=400,
    summarize_attempts=1,
    summarize_backoff=0.001,
    summarize_backoff_max=0.001,
    summarize_retry_later=0.05,  # a read arriving after a failure is told at the next one
    passivate_after=None,
)


def marker(n: int) -> str:
    return f"passport number X{n}234567"


async def test_delete_clear_and_forget_leave_no_erased_text_in_the_recording(store_url, tmp_path) -> None:
    recording = tmp_path / "messages.jsonl"
    async with open_engine(
        store_url, summarizer=QuotingSummarizer("passport"), config=CONFIG, record_to=recording
    ) as engine:
        kept = engine.session("t/kept")
        await kept.add([Episode("user", "hello"), Episode("user", f"my {marker(1)}", metadata={"why": marker(1)})])
        await kept.add([Episode("user", "bye, and ünïcode 123")])
        await kept.context()
        await kept.delete_episodes([2])
        cleared = engine.session("u/cleared")
        await cleared.add([Episode("user", f"my {marker(2)}")])
        await cleared.clear()
        await cleared.add([Episode("user", "after the clear")])
        forgotten = engine.session("v/forgotten")
        # Evicted and refused by the summarizer, quoting it: the read's error text quotes the marker too.
        await forgotten.add([Episode("user", f"my {marker(3)}")] + [Episode("user", f"turn {n}") for n in range(4)])
        with anyio.fail_after(30), pytest.raises(SummaryError, match=marker(3)):
            await forgotten.context(wait_for_summary=True)
        assert marker(3) in recording.read_text(encoding="utf-8")
        await engine.forget(tenant="v")
        await kept.context()

    text = recording.read_text(encoding="utf-8")
    for n in (1, 2, 3):
        assert marker(n) not in text
    assert "hello" in text and "ünïcode 123" in text and "after the clear" in text  # the rest is intact
    adds = [r for r in read_log(recording) if r["type"] == "add" and r["session"] == "t/kept"]
    assert adds[0]["erased"] == [2]
    assert [e["content"] for e in adds[0]["payload"]["episodes"]] == ["hello", "xx xxxxxxxx xxxxxx x0000000"]
    assert adds[0]["payload"]["episodes"][1]["metadata"] == {}

    recorded = recorded_config(recording)
    assert recorded is not None
    async with open_engine(tmp_path / "replayed.db", config=recorded.config) as fresh:
        report = await replay(recording, fresh)
        assert report.mismatches == ()
        assert [e.content for e in (await fresh.session("t/kept").context()).episodes] == [
            "hello",
            "bye, and ünïcode 123",
        ]
        assert (await fresh.session("u/cleared").context()).episodes[0].content == "after the clear"
