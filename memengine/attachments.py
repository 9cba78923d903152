"""Non-text parts inside an episode's content: how providers count them, and what the summarizer reads.

An image, a file or an audio clip reaches an episode's content as a base64
data URL (``data:image/png;base64,iVBOR...``): a bare URL, or inside a
provider's item kept as JSON (an OpenAI ``input_image`` / ``image_url`` part,
an ``input_file``'s ``file_data``, an ``input_audio`` part). Counted as text,
a 150 KB PNG is about 143,000 tokens of base64; a provider counts it as an
image, and the summarizer can do nothing with its bytes. So:

- :func:`counting_attachments` wraps a tokenizer: each data URL counts
  :data:`ATTACHMENT_TOKENS`, and only the text around them is counted.
  Those in an episode's metadata (a provider's message kept there, the
  content holding its text) count the same (:func:`metadata_tokens`).
- :func:`for_summarizer` gives the summarizer each episode with its data URLs
  replaced by a short placeholder, ``[image/png, 150 KB]``, and those of its
  metadata named after its content.

Finding them is linear in the text, without a regular expression: each
``;base64,`` marker is found with ``str.find``, its media type read from the
at most 128 characters before it, and its payload's end by stripping base64
characters from chunks that double in size. Only the first 2,048 markers of a
text are looked at (a text made of markers costs milliseconds, not seconds).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from .episode import Episode, stored_episode
from .tokens import Tokenizer

#: Tokens counted for one image, file or audio part. Providers count an image by its size in pixels,
#: not its bytes: Anthropic about width x height / 750 tokens, images past ~1.15 megapixels scaled
#: down first, so about 1,600 at most; OpenAI (GPT-4o, high detail) 85 + 170 per 512-pixel tile of
#: the image scaled to fit 2048 x 2048 and 768 on its short side, so 1,445 at most (their vision
#: guides). memengine does not decode images, so it counts the most either charges. Files (PDF:
#: per page) and audio (per second) are counted the same way, as a placeholder figure: pass a
#: tokenizer that knows your provider's rules for exact counts of those.
ATTACHMENT_TOKENS = 1_600

_MARKER = ";base64,"
_PREFIX = "data:"
#: Markers looked at per text, at most: a text made of markers costs milliseconds, not seconds, and
#: past these, data URLs are counted and shown as text.
_MAX_MARKERS = 2_048
_MAX_MEDIA_TYPE = 128  # characters between "data:" and ";base64," (type, subtype, parameters)
_BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_"
_NOT_IN_MEDIA_TYPE = frozenset(" \t\r\n\"'<>(){}[],\\")


@attrs.frozen
class DataUrl:
    """One base64 data URL: ``text[start:end]``."""

    start: int
    end: int
    media_type: str  # "image/png" (parameters left out)
    payload_chars: int

    @property
    def size(self) -> int:
        """Bytes of the decoded data (about: padding aside)."""
        return self.payload_chars * 3 // 4

    @property
    def placeholder(self) -> str:
        """What the summarizer reads instead: ``[image/png, 150 KB]``."""
        size = self.size
        shown = f"{size} bytes" if size < 1024 else f"{round(size / 1024):,} KB"
        return f"[{self.media_type}, {shown}]"


def data_urls(text: str) -> Iterator[DataUrl]:
    """The base64 data URLs in ``text``, in order (linear in the text)."""
    find = text.find
    marker = find(_MARKER)
    for _ in range(_MAX_MARKERS):
        if marker == -1:
            return
        found = _data_url_at(text, marker)
        if found is not None:
            yield found
            marker = find(_MARKER, found.end)
        else:
            marker = find(_MARKER, marker + len(_MARKER))


def counting_attachments(count: Tokenizer) -> Tokenizer:
    """``count``, with each data URL counted as :data:`ATTACHMENT_TOKENS` instead of as its base64 text."""

    def tokens(text: str) -> int:
        if _MARKER not in text:  # the usual case: one scan in C
            return count(text)
        found = list(data_urls(text))
        if not found:
            return count(text)
        return count(_replaced(text, found, "")) + ATTACHMENT_TOKENS * len(found)

    return tokens


def metadata_tokens(metadata: Mapping[str, Any]) -> int:
    """Tokens of the data URLs in ``metadata``'s strings, at any depth (:data:`ATTACHMENT_TOKENS` each)."""
    return ATTACHMENT_TOKENS * len(_in_metadata(metadata))


def for_summarizer(episodes: Sequence[Episode]) -> Sequence[Episode]:
    """The episodes as the summarizer should read them: each data URL replaced by its placeholder."""
    changed = [_with_placeholders(episode) for episode in episodes]
    if all(new is old for new, old in zip(changed, episodes, strict=True)):
        return episodes
    return changed


def _with_placeholders(episode: Episode) -> Episode:
    found = list(data_urls(episode.content)) if _MARKER in episode.content else []
    in_metadata = _in_metadata(episode.metadata) if episode.metadata else []
    if not found and not in_metadata:
        return episode
    content = _replaced(episode.content, found, None)
    if in_metadata:
        content = "\n".join([content, *[url.placeholder for url in in_metadata]])
    return stored_episode(episode.role, content, episode.id, episode.created_at, episode.metadata, episode.seq)  # type: ignore[arg-type]


def _in_metadata(metadata: Mapping[str, Any]) -> list[DataUrl]:
    """The data URLs in the strings of ``metadata`` (JSON values: dicts, lists, strings), in order.

    Also base64 sources without a URL: Anthropic's ``{"type": "base64",
    "media_type": ..., "data": ...}`` and OpenAI's ``input_audio``
    ``{"data": ..., "format": "wav"}`` (found in their place, not inside).

    Runs for every episode with metadata as it enters a window, and again as
    the summarizer reads it: one pass over each container's values, depth
    first, with JSON's own types checked by ``type`` (no call per value).
    """
    found: list[DataUrl] = []
    stack: list[Iterator[Any]] = [iter((metadata,))]  # (the metadata itself may be a base64 source)
    while stack:
        for value in stack[-1]:
            kind = type(value)
            if kind is str:
                if _MARKER in value:
                    found.extend(data_urls(value))
            elif kind is dict:
                if "data" in value:
                    source = _base64_source(value)
                    if source is not None:
                        found.append(source)
                        continue
                stack.append(iter(value.values()))
                break  # (on with this dict's values; the loop comes back for the rest of these)
            elif kind is list:
                stack.append(iter(value))
                break
            elif kind in _SCALARS:
                pass
            elif isinstance(value, str):
                if _MARKER in value:
                    found.extend(data_urls(value))
            elif isinstance(value, Mapping):
                source = _base64_source(value)
                if source is not None:
                    found.append(source)
                    continue
                stack.append(iter(list(value.values())))
                break
            elif isinstance(value, (list, tuple)):
                stack.append(iter(value))
                break
        else:
            stack.pop()
    return found


_SCALARS = frozenset((int, float, bool, type(None)))


def _base64_source(value: Mapping[str, Any]) -> DataUrl | None:
    data = value.get("data")
    if not isinstance(data, str) or len(data) < 64 or _base64_end(data, 0) != len(data):
        return None  # (an application's own {"data": some text, "format": ...} is no attachment)
    media_type = value.get("media_type")
    if value.get("type") == "base64" and isinstance(media_type, str):
        return DataUrl(0, 0, media_type, len(data))
    audio_format = value.get("format")
    if isinstance(audio_format, str):
        return DataUrl(0, 0, f"audio/{audio_format}", len(data))
    return None


def _replaced(text: str, found: list[DataUrl], replacement: str | None) -> str:
    """``text`` with each data URL replaced by ``replacement`` (``None``: its placeholder)."""
    pieces = []
    position = 0
    for url in found:
        pieces.append(text[position : url.start])
        pieces.append(url.placeholder if replacement is None else replacement)
        position = url.end
    pieces.append(text[position:])
    return "".join(pieces)


def _data_url_at(text: str, marker: int) -> DataUrl | None:
    """The data URL whose ``;base64,`` is at ``marker``, if that is one."""
    start = text.rfind(_PREFIX, max(0, marker - _MAX_MEDIA_TYPE - len(_PREFIX)), marker)
    if start == -1:
        return None
    media_type = text[start + len(_PREFIX) : marker]
    if not media_type or "/" not in media_type or any(char in _NOT_IN_MEDIA_TYPE for char in media_type):
        return None
    payload = marker + len(_MARKER)
    end = _base64_end(text, payload)
    if end == payload:
        return None
    return DataUrl(start, end, media_type.split(";", 1)[0].lower(), end - payload)


def _base64_end(text: str, start: int) -> int:
    """Where the run of base64 characters from ``start`` ends (time proportional to its length)."""
    end = start
    step = 64
    while True:
        chunk = text[end : end + step]
        run = len(chunk) - len(chunk.lstrip(_BASE64))
        end += run
        if run < step:
            return end
        step *= 2
