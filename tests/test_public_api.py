"""The public surface and the validation at its edge."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import pytest

import memengine
from memengine import Episode, SessionConfig, open_engine


def test_exports_are_deliberate() -> None:
    assert sorted(memengine.__all__) == [
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
    for name in memengine.__all__:
        assert getattr(memengine, name) is not None


def test_errors_form_one_hierarchy() -> None:
    for error in (
        memengine.SessionClosedError,
        memengine.EngineClosedError,
        memengine.StoreError,
        memengine.ForgetIncompleteError,
    ):
        assert issubclass(error, memengine.MemEngineError)


def test_episode_defaults() -> None:
    episode = Episode("user", "hello")
    assert episode.seq is None and episode.metadata == {}
    assert episode.created_at.tzinfo is not None
    assert Episode("user", "hello").id != episode.id


def test_default_ids_are_uuid7_in_time_order() -> None:
    ids = [Episode("user", "x").id for _ in range(2000)]
    assert len(set(ids)) == 2000
    parsed = [uuid.UUID(hex=i) for i in ids]
    assert {(u.version, u.variant) for u in parsed} == {(7, uuid.RFC_4122)}
    # The leading 48 bits are the creation time in milliseconds: never decreasing.
    stamps = [u.int >> 80 for u in parsed]
    assert stamps == sorted(stamps)
    assert abs(stamps[-1] - time.time() * 1000) < 60_000


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"role": "", "content": "x"}, ValueError),
        ({"role": "user", "content": "   "}, ValueError),
        ({"role": None, "content": "x"}, TypeError),
        ({"role": "user", "content": 42}, TypeError),
        ({"role": "user", "content": "bad \udc80 surrogate"}, ValueError),
        ({"role": "user", "content": "x", "id": ""}, ValueError),
        ({"role": "user", "content": "x", "created_at": datetime(2026, 1, 1)}, ValueError),
        ({"role": "user", "content": "x", "created_at": "2026-01-01"}, TypeError),
        ({"role": "user", "content": "x", "metadata": {"when": datetime.now(UTC)}}, ValueError),
        ({"role": "user", "content": "x", "metadata": {1: "int key"}}, TypeError),
        ({"role": "user", "content": "x", "metadata": {"nan": float("nan")}}, ValueError),
        ({"role": "user", "content": "x", "metadata": ["not", "a", "mapping"]}, TypeError),
        ({"role": "user", "content": "x", "seq": 0}, TypeError),
    ],
)
def test_episode_rejects_bad_fields(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        Episode(**kwargs)


def test_episode_metadata_is_copied() -> None:
    metadata = {"topic": "moving"}
    episode = Episode("user", "x", metadata=metadata)
    metadata["topic"] = "changed"
    assert episode.metadata == {"topic": "moving"}


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_episodes": 0}, ValueError),
        ({"max_episodes": -3}, ValueError),
        ({"max_chars": 0}, ValueError),
        ({"retain_every": 0}, ValueError),
        ({"max_episodes": 2.5}, TypeError),
        ({"max_episodes": True}, TypeError),
        ({"passivate_after": 0}, ValueError),
        ({"passivate_after": float("inf")}, ValueError),
        ({"summarize_attempts": 0}, ValueError),
        ({"summarize_backoff": -1.0}, ValueError),
        ({"summarize_retry_later": "soon"}, TypeError),
    ],
)
def test_session_config_rejects_nonsense(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        SessionConfig(**kwargs)


def test_session_config_accepts_sensible_values() -> None:
    config = SessionConfig(max_episodes=5, max_chars=100, retain_every=3, passivate_after=None)
    assert (config.max_episodes, config.max_chars, config.retain_every) == (5, 100, 3)


@pytest.mark.anyio
async def test_session_ids_are_validated_without_io(db_path) -> None:
    async with open_engine(db_path) as engine:
        with pytest.raises(ValueError):
            engine.session("")
        with pytest.raises(ValueError):
            engine.session("   ")
        with pytest.raises(TypeError):
            engine.session(7)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            engine.session("x" * 5000)
        engine.session("alice/chat-1")
        assert engine.active_sessions == 0  # a handle alone activates nothing


@pytest.mark.anyio
async def test_open_engine_rejects_bad_arguments(db_path) -> None:
    with pytest.raises(TypeError):
        async with open_engine(db_path, config={"max_episodes": 3}):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError):
        async with open_engine(db_path, summarizer=object()):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError):
        async with open_engine(db_path, max_concurrent_summaries=0):
            pass
    with pytest.raises(ValueError):
        async with open_engine(""):
            pass


# -- arguments that would do nothing are refused -----------------------------------


def test_an_episode_cannot_be_given_a_seq() -> None:
    # The store numbers episodes as it stores them: a seq given here was silently dropped by add().
    with pytest.raises(TypeError, match=r"Episode\.seq is assigned by the store"):
        Episode("user", "hello", seq=5)


@pytest.mark.anyio
async def test_an_episode_read_back_can_be_added_again(db_path) -> None:
    async with open_engine(db_path) as engine:
        (stored,) = await engine.session("a").add([Episode("user", "hello")])
        (copied,) = await engine.session("b").add([stored])
    assert (stored.seq, copied.seq, copied.id) == (1, 1, stored.id)


@pytest.mark.anyio
@pytest.mark.parametrize("value", ["yes", 1, None])
async def test_wait_for_summary_must_be_a_bool(db_path, value: object) -> None:
    async with open_engine(db_path) as engine:
        with pytest.raises(TypeError, match="wait_for_summary must be a bool"):
            await engine.session("s").context(wait_for_summary=value)  # type: ignore[arg-type]


# -- reprs say what an object is, and never a secret --------------------------------


@pytest.mark.anyio
async def test_an_engine_repr_names_its_store_summarizer_and_sessions(db_path) -> None:
    async with open_engine(db_path) as engine:
        await engine.session("s").add([Episode("user", "hello")])
        shown = repr(engine)
    assert shown.startswith("<Engine ")
    assert f"SQLiteStore({str(db_path)!r})" in shown
    assert "ExtractiveSummarizer(max_chars=1200" in shown
    assert "1 active session" in shown


@pytest.mark.anyio
async def test_a_postgres_engine_repr_hides_the_password() -> None:
    from .conftest import postgres_schema

    with postgres_schema() as url:
        secret_url = url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
        async with open_engine(secret_url) as engine:
            shown = repr(engine)
    assert "PostgresStore('postgresql://postgres:***@" in shown
    assert "s3cret" not in shown


def test_summarizer_reprs_show_their_settings_and_no_api_key() -> None:
    from types import SimpleNamespace

    from memengine import ExtractiveSummarizer, OpenAISummarizer

    assert repr(ExtractiveSummarizer(max_chars=500)) == (
        "ExtractiveSummarizer(max_chars=500, max_sentence_chars=240, fresh_share=0.25, half_life=1000)"
    )
    client = SimpleNamespace(base_url="https://user:pw@llm.example/v1/", api_key="sk-s3cret")  # as openai's has
    summarizer = OpenAISummarizer("gpt-4o-mini", client=client)
    shown = repr(summarizer)
    assert shown.startswith("OpenAISummarizer(model='gpt-4o-mini', base_url='https://llm.example/v1")
    assert "s3cret" not in shown and "pw" not in shown
