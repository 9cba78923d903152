"""An image, file or audio part in an episode counts as providers count it, and reaches the
summarizer as a short placeholder, not as its base64 text."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping, Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memengine import Episode, SessionConfig, open_engine
from memengine.attachments import (
    ATTACHMENT_TOKENS,
    _base64_source,
    _in_metadata,
    data_urls,
    for_summarizer,
    metadata_tokens,
)
from memengine.tokens import estimate_tokens

from .fakes import fold

pytestmark = pytest.mark.anyio

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + random.Random(10).randbytes(150 * 1024 - 8)).decode()  # 150 KB
QUESTION = "What is in this picture?"


def image_item() -> str:
    """An OpenAI Responses user message with an input_image part, as JSON (too large for metadata)."""
    parts = [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
    ]
    return json.dumps({"role": "user", "content": parts})


class ReadingSummarizer:
    """Records the contents it was given."""

    def __init__(self) -> None:
        self.read: list[str] = []

    async def summarize(self, previous: str | None, episodes: Sequence[Episode]) -> str:
        self.read.extend(episode.content for episode in episodes)
        return fold(previous, episodes)


async def test_an_image_counts_as_an_image_and_the_summarizer_reads_a_placeholder(store_url) -> None:
    summarizer = ReadingSummarizer()
    config = SessionConfig(max_episodes=2, max_tokens=100_000, evict_to=0.5)
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", image_item())])
        context = await session.context()
        text_around = image_item().replace(f"data:image/png;base64,{PNG}", "")
        assert context.tokens == estimate_tokens(text_around) + ATTACHMENT_TOKENS  # not ~146,000 of base64
        await session.add([Episode("assistant", "A cat on a windowsill."), Episode("user", "Thanks!")])
        with anyio.fail_after(30):
            await session.context(wait_for_summary=True)
    [seen] = [text for text in summarizer.read if QUESTION in text]
    assert "[image/png, 150 KB]" in seen
    assert PNG[:100] not in seen
    assert len(seen) < 300


def test_placeholders_name_the_media_type_and_size() -> None:
    audio = base64.b64encode(bytes(3000)).decode()
    text = f'{{"file_data": "data:application/pdf;base64,{PNG}"}} and data:audio/wav;name=a.wav;base64,{audio} end'
    assert [url.placeholder for url in data_urls(text)] == ["[application/pdf, 150 KB]", "[audio/wav, 3 KB]"]
    [episode] = for_summarizer([Episode("user", text)])
    assert episode.content == '{"file_data": "[application/pdf, 150 KB]"} and [audio/wav, 3 KB] end'


def test_text_without_data_urls_is_left_alone() -> None:
    episodes = [Episode("user", "a data: URL needs ;base64, and a type"), Episode("user", "data:;base64,AAAA")]
    assert list(data_urls(episodes[0].content)) == []
    assert list(data_urls(episodes[1].content)) == []
    assert for_summarizer(episodes) == episodes


def test_a_text_made_of_markers_is_scanned_in_bounded_time() -> None:
    for text in (";base64," * 500_000, "data:a/b;base64,a" * 250_000, "data:image/png;base64," + "A" * 4_000_000):
        assert len(list(data_urls(text))) <= 2_048


async def test_an_image_kept_in_metadata_counts_and_is_named_to_the_summarizer(store_url) -> None:
    small = base64.b64encode(random.Random(11).randbytes(6 * 1024)).decode()
    message = {
        "role": "user",
        "content": [
            {"type": "input_text", "text": QUESTION},
            {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{small}"}},
        ],
    }
    summarizer = ReadingSummarizer()
    config = SessionConfig(max_episodes=2, evict_to=0.5)
    async with open_engine(store_url, summarizer=summarizer, config=config) as engine:
        session = engine.session("s")
        await session.add([Episode("user", QUESTION, metadata=message)])
        context = await session.context()
        assert context.tokens == estimate_tokens(QUESTION) + ATTACHMENT_TOKENS  # the text, and the image
        await session.add([Episode("assistant", "A cat on a windowsill."), Episode("user", "Thanks!")])
        with anyio.fail_after(30):
            await session.context(wait_for_summary=True)
    assert f"{QUESTION}\n[image/jpeg, 6 KB]" in summarizer.read


def test_base64_sources_in_metadata_are_named() -> None:
    data = base64.b64encode(bytes(2048)).decode()
    anthropic = {
        "role": "user",
        "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": data}}],
    }
    audio = {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "mp3"}}]}
    [image, sound] = for_summarizer(
        [Episode("user", "look", metadata=anthropic), Episode("user", "hear", metadata=audio)]
    )
    assert (image.content, sound.content) == ("look\n[image/webp, 2 KB]", "hear\n[audio/mp3, 2 KB]")


async def test_metadata_with_data_and_format_keys_that_hold_text_is_not_an_attachment(store_url) -> None:
    # An application's own metadata may hold {"data": ..., "format": ...} (a tool's result, a report):
    # only base64 data is an attachment; text is neither counted as one nor named to the summarizer.
    text = "Revenue rose 4 % in Q3, driven by the Lisbon and Porto stores and by online orders."
    report = {"data": text, "format": "text"}
    mislabelled = {"type": "base64", "media_type": "text/plain", "data": text}
    episodes = [Episode("tool", "report ready", metadata={"report": report, "source": mislabelled})]
    async with open_engine(store_url, summarizer=ReadingSummarizer()) as engine:
        session = engine.session("s")
        await session.add(episodes)
        assert (await session.context()).tokens == estimate_tokens("report ready")
    assert for_summarizer(episodes) == episodes


def _in_metadata_by_definition(value: object) -> list[tuple[str, int, int, int]]:
    """What metadata's attachments are, written plainly: depth first, in order; a base64 source is one, whole."""
    if isinstance(value, str):
        return [(url.media_type, url.start, url.end, url.payload_chars) for url in data_urls(value)]
    if isinstance(value, Mapping):
        source = _base64_source(value)
        if source is not None:
            return [(source.media_type, source.start, source.end, source.payload_chars)]
        return [found for child in value.values() for found in _in_metadata_by_definition(child)]
    if isinstance(value, (list, tuple)):
        return [found for child in value for found in _in_metadata_by_definition(child)]
    return []


_B64 = base64.b64encode(bytes(range(96))).decode()  # 128 characters: long enough to be a source
_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.sampled_from(
        ["plain text", f"data:image/png;base64,{_B64}", f"see data:audio/wav;base64,{_B64} and data:x;base64,"]
    ),
    st.builds(
        lambda kind, media: {"type": kind, "media_type": media, "data": _B64},
        st.sampled_from(["base64", "url"]),
        st.sampled_from(["image/webp", 7]),
    ),
    st.builds(lambda data, form: {"data": data, "format": form}, st.sampled_from([_B64, "short text"]), st.just("mp3")),
)
_JSON_TREES = st.recursive(
    _LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from("abcdata"), children, max_size=4),
    max_leaves=30,
)


@given(st.dictionaries(st.sampled_from(["item", "data", "media_type", "type", "x"]), _JSON_TREES, max_size=4))
@settings(max_examples=300, deadline=None)
def test_attachments_in_metadata_are_found_in_order_at_any_depth(metadata: dict) -> None:
    found = [(url.media_type, url.start, url.end, url.payload_chars) for url in _in_metadata(metadata)]
    assert found == _in_metadata_by_definition(metadata)
    assert metadata_tokens(metadata) == ATTACHMENT_TOKENS * len(found)
