"""``memengine set-aside`` and ``memengine inspect`` show work set aside, and the command retries or discards it."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.cli import main

from .conftest import StoreRows
from .fakes import RecordingSink, RecordingSummarizer, add_each, covered, turns

CONFIG = SessionConfig(
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
    passivate_after=None,
)


class Refuses:
    """A summarizer and a sink that refuse everything of session "poison"."""

    mode = "append"

    async def summarize(self, previous, episodes):
        raise RuntimeError("the model refuses")

    async def retain(self, batch) -> None:
        if batch.session_id == "poison":
            raise ConnectionError("the sink refuses")


def set_aside_store(url: str) -> None:
    """A store where session "poison" has its summary batch and its first retain batch set aside."""

    async def write() -> None:
        async with open_engine(url, summarizer=Refuses(), retain_sink=Refuses(), config=CONFIG, retain_grace=0) as e:
            await add_each(e.session("poison"), turns(3))
            await e.session("fine").add([Episode("user", "fine")])
            with anyio.fail_after(30):
                while (stats := await e.stats()).summaries_set_aside < 1 or stats.retains_set_aside < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)

    anyio.run(write)


@pytest.fixture
def url(store_url: str) -> str:
    set_aside_store(store_url)
    return store_url


def test_list_and_inspect_show_the_work_set_aside(url, capsys) -> None:
    assert main(["set-aside", "list", url]) == 0
    listed = capsys.readouterr().out
    assert "summary  session poison: summary of episodes 1..1, 1 failed attempt" in listed
    assert "retain   session poison: retain batch of seqs 1..1, 1 failed attempt" in listed
    assert "the model refuses" in listed and "the sink refuses" in listed

    assert main(["set-aside", "list", url, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(w["kind"], w["session_id"], w["first_seq"], w["last_seq"]) for w in document["set_aside"]] == [
        ("summary", "poison", 1, 1),
        ("retain", "poison", 1, 1),
    ]

    assert main(["inspect", url]) == 0
    shown = capsys.readouterr().out
    assert "set aside after too many failed rounds (2" in shown and "the sink refuses" in shown
    assert main(["inspect", url, "poison", "--json"]) == 0
    assert [w["kind"] for w in json.loads(capsys.readouterr().out)["set_aside"]] == ["summary", "retain"]
    assert main(["inspect", url, "fine", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["set_aside"] == []


def test_discard_says_what_it_would_drop_and_drops_it_with_yes(url, capsys) -> None:
    rows = StoreRows(url)
    assert main(["set-aside", "discard", url]) == 0
    assert "would discard (run again with --yes to drop them) 1 retain batch" in capsys.readouterr().out
    assert rows.query("SELECT count(*) FROM retain_outbox WHERE set_aside_at IS NOT NULL") == [(1,)]

    assert main(["set-aside", "discard", url, "poison", "--yes"]) == 0
    assert "discarded 1 retain batch" in capsys.readouterr().out
    assert rows.query("SELECT count(*) FROM retain_outbox WHERE session_id = 'poison' AND first_seq = 1") == [(0,)]
    assert rows.query("SELECT count(*) FROM summaries_set_aside") == [(1,)]  # a summary batch is never discarded


def test_retry_lifts_the_marks_and_the_next_engine_does_the_work(url, capsys) -> None:
    assert main(["set-aside", "retry", url]) == 0
    assert "1 summary batch and 1 retain batch tried again" in capsys.readouterr().out
    assert main(["set-aside", "list", url]) == 0
    assert ": 0 set aside" in capsys.readouterr().out

    summarizer, sink = RecordingSummarizer(), RecordingSink()

    async def run_again() -> None:
        async with open_engine(url, summarizer=summarizer, retain_sink=sink, config=CONFIG) as engine:
            context = await engine.session("poison").context(wait_for_summary=True)
            assert covered(context.summary) == ["turn 1"]
            with anyio.fail_after(30):
                while len(poison(sink)) < 3:
                    await sink.wait_for(len(sink.batches) + 1)

    def poison(sink: RecordingSink) -> list[int]:
        return [batch.first_seq for batch in sink.batches if batch.session_id == "poison"]

    anyio.run(run_again)
    assert poison(sink) == [1, 2, 3]  # in order, once each


def test_a_missing_store_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["set-aside", "list", str(tmp_path / "nothing.db")]) == 3
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "nothing.db").exists()
