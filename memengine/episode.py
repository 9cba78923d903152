"""Episodes: one turn of conversation, the unit the engine stores."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import attrs

from .limits import MAX_EPISODE_ID_BYTES, MAX_ROLE_CHARS, require_text, require_utf8
from .tool_calls import tool_links

#: ``json.dumps(value, allow_nan=False, ensure_ascii=False)``, without making an encoder per call:
#: the JSON text of metadata, as the store keeps it (``TypeError``/``ValueError`` for what JSON cannot hold exactly).
encode_json: Callable[[object], str] = json.JSONEncoder(allow_nan=False, ensure_ascii=False).encode

# Where an episode's metadata may hold the provider's own message or item.
_MESSAGE_KEYS = ("message", "item", "raw")


def _new_id() -> str:
    """A UUIDv7 (RFC 9562) as 32 hex digits: unique, and ordered by creation time.

    Time order keeps the store's id index appending at its right edge instead
    of touching a random page per new episode, which roughly halves the cost
    of a commit.
    """
    unix_ms = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10))  # one system call for both random fields (as secrets.randbits reads)
    rand_a = random >> 68  # 12 bits
    rand_b = random & (2**62 - 1)
    value = (unix_ms & (2**48 - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return f"{value:032x}"


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _check_role(instance: Episode, attribute: attrs.Attribute[str], value: object) -> None:
    require_text("Episode.role", value, max_chars=MAX_ROLE_CHARS)


def _check_content(instance: Episode, attribute: attrs.Attribute[str], value: object) -> None:
    # Its length is bounded by SessionConfig.max_content_chars, checked by add().
    if value is None or (isinstance(value, str) and not value.strip()):
        # An assistant message that is only a tool call has no text: providers send content null.
        if _carries_message(instance.metadata):
            if value is None:
                object.__setattr__(instance, "content", "")  # (validators run once every field is set)
            else:
                require_utf8("Episode.content", value)
            return
        if value is not None:
            raise ValueError(f"Episode.content must be a non-empty string{_EMPTY_CONTENT}")
    require_text("Episode.content", value)


_EMPTY_CONTENT = (
    " (it may be empty or None only when the metadata carries the message: tool calls or results, "
    "or a provider message or item under 'message', 'item' or 'raw')"
)


def _carries_message(metadata: dict[str, Any]) -> bool:
    """Whether the metadata holds what the episode says: tool calls or results, or a provider message."""
    if any(isinstance(metadata.get(key), dict) for key in _MESSAGE_KEYS):
        return True
    return bool(tool_links(metadata))


def _check_id(instance: Episode, attribute: attrs.Attribute[str], value: object) -> None:
    require_text("Episode.id", value, max_bytes=MAX_EPISODE_ID_BYTES)


def _check_created_at(instance: Episode, attribute: attrs.Attribute[datetime], value: object) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"Episode.created_at must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("Episode.created_at must be timezone-aware (use datetime.now(timezone.utc))")


def snapshot_metadata(value: object) -> dict[str, Any]:
    """See :func:`encode_metadata`; returns only the copy."""
    return encode_metadata(value)[0]


def encode_metadata(value: object) -> tuple[dict[str, Any], str]:
    """A deep, JSON-exact copy of ``value`` and its JSON text, or ``TypeError``/``ValueError``.

    Metadata may hold only what JSON stores exactly: dicts with str keys,
    lists, str, int, finite float, bool and None. Anything else (tuples, int
    keys, NaN, sets, objects) would come back from the store changed, so it is
    refused instead. The copy shares nothing with ``value``: editing the
    caller's dict later changes neither the episode nor what is stored.
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"Episode.metadata must be a mapping, not {type(value).__name__}")
    value = dict(value)
    try:
        encoded = encode_json(value)
    except RecursionError:
        raise ValueError("Episode.metadata is nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Episode.metadata must be JSON-serializable: {exc}") from None
    require_utf8("Episode.metadata", encoded)  # no NUL rule: JSON writes NUL as an escape
    copy = json.loads(encoded)
    if copy != value or not _same_types(copy, value):
        raise TypeError(
            "Episode.metadata may hold only dicts with str keys, lists, str, int, float, bool and None "
            "(tuples, non-str keys and other types would not come back from the store as they went in)"
        )
    return copy, encoded


def _same_types(copy: object, original: object) -> bool:
    if type(copy) is not type(original) and not (isinstance(copy, dict) and isinstance(original, Mapping)):
        return False
    if isinstance(copy, dict):
        return all(isinstance(k, str) and _same_types(copy[k], original[k]) for k in copy)  # type: ignore[index]
    if isinstance(copy, list):
        return all(_same_types(c, o) for c, o in zip(copy, original, strict=True))  # type: ignore[call-overload]
    return True


def _check_seq(instance: Episode, attribute: attrs.Attribute[int | None], value: object) -> None:
    # The engine stamps stored episodes without the validators (stored_episode, with_seq).
    if value is not None:
        raise TypeError(
            f"Episode.seq is assigned by the store when the episode is added (got seq={value!r}); "
            "leave it out: add() returns the stored episodes with their seq"
        )


@attrs.frozen
class Episode:
    """One turn of conversation.

    ``role`` and ``content`` must be non-blank strings of valid Unicode
    without NUL; ``role`` is at most ``MAX_ROLE_CHARS`` (256) characters.
    ``content`` may be empty (``""``, or ``None``, stored as ``""``) when the
    metadata carries the message: an assistant message that is only tool
    calls (providers send ``content: null``), a tool result, or a provider
    message or item under ``"message"``, ``"item"`` or ``"raw"``.
    ``id`` (the same rules, at most ``MAX_EPISODE_ID_BYTES``, 1,024 bytes of
    UTF-8) identifies the episode within its session: adding an episode whose
    id the session already holds stores nothing new. ``seq`` is ``None`` until
    the episode is stored; stored episodes carry their position in the session
    (1, 2, 3, ...). The store assigns it: passing ``seq=`` raises ``TypeError``
    (an episode read back, seq and all, may still be added again, to any
    session). See :mod:`memengine.limits`.
    """

    role: str = attrs.field(validator=_check_role)
    content: str = attrs.field(validator=_check_content)
    id: str = attrs.field(kw_only=True, factory=_new_id, validator=_check_id)
    created_at: datetime = attrs.field(kw_only=True, factory=_utc_now, validator=_check_created_at)
    metadata: dict[str, Any] = attrs.field(kw_only=True, factory=dict, converter=snapshot_metadata, hash=False)
    seq: int | None = attrs.field(kw_only=True, default=None, validator=_check_seq)


_FIELDS = tuple(field.name for field in attrs.fields(Episode))
# stored_episode sets exactly these, by name.
assert _FIELDS == ("role", "content", "id", "created_at", "metadata", "seq"), _FIELDS
_set = object.__setattr__
_ROLE, _CONTENT = attrs.fields(Episode).role, attrs.fields(Episode).content


def stored_episode(
    role: str, content: str, id: str, created_at: datetime, metadata: dict[str, Any], seq: int
) -> Episode:
    """An Episode from values that were validated before they were stored.

    For the engine's own use (reading its store back, stamping a seq on an
    episode it just stored): it skips the validators, which ran at the edge.
    """
    # Field by field, unrolled: this runs for every episode stored and read back (see _FIELDS).
    episode = object.__new__(Episode)
    _set(episode, "role", role)
    _set(episode, "content", content)
    _set(episode, "id", id)
    _set(episode, "created_at", created_at)
    _set(episode, "metadata", metadata)
    _set(episode, "seq", seq)
    return episode


def with_private_metadata(
    role: str, content: str, metadata: dict[str, Any], *, content_checked: bool = False
) -> Episode:
    """A new Episode (validated, with a new id and the time now) whose ``metadata`` is taken as it is.

    For the engine's own callers that build ``metadata`` themselves as a
    JSON-exact value no one else holds (made from ``json.loads``, checked
    against ``max_metadata_bytes``): it skips the deep copy and type check that
    ``Episode(metadata=...)`` makes of a caller's value (see :func:`encode_metadata`).
    ``content_checked``: the caller has made sure ``content`` is what
    ``Episode.content`` accepts but its length (not blank, no NUL, valid
    Unicode: JSON text whose UTF-8 it counted, say), so it is not encoded
    again here, in one go on the event loop (json_slices.py).
    """
    episode = stored_episode(role, content, _new_id(), _utc_now(), metadata, None)  # type: ignore[arg-type]
    # The validators Episode() runs, but those of the fields made here (id, created_at, seq).
    _check_role(episode, _ROLE, role)
    if not content_checked:
        _check_content(episode, _CONTENT, content)
    return episode


def with_seq(episode: Episode, seq: int) -> Episode:
    """The same (already validated) episode, stamped with its stored seq."""
    return stored_episode(episode.role, episode.content, episode.id, episode.created_at, episode.metadata, seq)
