"""JSON of a value with long strings, made a slice at a time so the event loop's other tasks run in between.

An adapter encodes what it is given (an Agents SDK item, a tool's output of
megabytes in it), counts the text's UTF-8 bytes and reads the JSON back.
Each is one call into C that holds the interpreter for the whole text: for a
4 MB output about 30 ms in which no session is served, nor any other task of
the application (a worker thread would not help: those calls hold the
interpreter's lock there too). Invariant 13 of the design asks that work
proportional to an input's size be off the event loop when large.

Here only the strings longer than :data:`LONG_STRING` characters are cut:
the rest of the value (its skeleton, each long string set aside for a marker)
is encoded, measured and read back at once, being small; each long string is
escaped and measured a slice at a time (JSON's escaping is per character, so
the slices' escapes joined are the string's), with a checkpoint after each
slice, and put back in place of its marker. The result is, to the character,
what ``encode_json`` and ``json.loads`` make of the whole value
(tests/test_json_slices.py holds it to that on random values).

What is not cut: a long dict key (encoded with the skeleton), and a value
with more than :data:`WALK_LIMIT` containers, which :func:`has_long_string`
does not look through (it is encoded whole, as before).
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # what JSONEncoder(ensure_ascii=False) uses
from typing import Any

import anyio.lowlevel

from .episode import encode_json

#: Characters of a string above which it is escaped a slice of this many at a time (about half a millisecond each).
LONG_STRING = 1 << 17
#: Containers :func:`has_long_string` looks into before it gives up (a value of more is encoded at once).
WALK_LIMIT = 10_000


def has_long_string(value: object) -> bool:
    """Whether a string longer than :data:`LONG_STRING` is among ``value``'s values (dicts, lists, tuples).

    Cheap for the usual item (a few containers, about a microsecond): it runs
    on every item added. Stops at the first one found, and after
    :data:`WALK_LIMIT` containers (so also in a value that holds itself).
    """
    limit = LONG_STRING
    if isinstance(value, str):
        return len(value) > limit
    if not isinstance(value, dict | list | tuple):
        return False
    stack = [value]
    containers = 0
    while stack:
        container = stack.pop()
        containers += 1
        if containers > WALK_LIMIT:
            return False
        for child in container.values() if isinstance(container, dict) else container:  # type: ignore[attr-defined]
            kind = type(child)
            if kind is str:
                if len(child) > limit:
                    return True
            elif kind is dict or kind is list:
                if child:
                    stack.append(child)
            elif isinstance(child, str):  # (subclasses: the exact types above are the usual ones, and faster)
                if len(child) > limit:
                    return True
            elif isinstance(child, dict | list | tuple):
                stack.append(child)
    return False


async def encode_in_slices(value: object) -> tuple[str, Any, int]:
    """``(encode_json(value), json.loads of it, its UTF-8 bytes)``, long strings a slice at a time.

    A checkpoint after every slice. Raises what ``encode_json`` raises for
    ``value`` (``TypeError``, ``ValueError``), and ``UnicodeEncodeError`` for
    a lone surrogate (as ``str.encode`` does on the whole text).
    """
    marker = f"memengine-long-{uuid.uuid4().hex}-"
    long: list[str] = []
    skeleton_json = encode_json(_set_aside(value, marker, long, set()))
    pieces = skeleton_json.split(f'"{marker}')
    if len(pieces) != len(long) + 1 or not all(
        piece.startswith(f'{number}"') for number, piece in enumerate(pieces[1:])
    ):
        # The marker is somewhere else too (the value holds this very text): encode it at once instead.
        encoded = encode_json(value)
        return encoded, json.loads(encoded), len(encoded.encode())
    parts = [pieces[0]]
    size = len(pieces[0].encode())
    for number, text in enumerate(long):
        parts.append('"')
        for start in range(0, len(text), LONG_STRING):
            escaped = encode_basestring(text[start : start + LONG_STRING])[1:-1]  # (without its quotes)
            size += len(escaped.encode())
            parts.append(escaped)
            await anyio.lowlevel.checkpoint()
        rest = pieces[number + 1][len(str(number)) :]  # from the marker's closing quote on
        parts.append(rest)
        size += 1 + len(rest.encode())
    exact = _put_back(json.loads(skeleton_json), marker, long)
    encoded = "".join(parts)
    return encoded, exact, size


def _set_aside(value: object, marker: str, long: list[str], on_path: set[int]) -> object:
    """``value`` with each long string replaced by ``marker`` and its number in ``long``, in the encoder's order.

    Containers are copied (tuples as lists, as JSON writes them); a container
    met again on its own path (a cycle) is left as it is, for the encoder to refuse.
    """
    if isinstance(value, str):
        if len(value) > LONG_STRING:
            long.append(value)
            return f"{marker}{len(long) - 1}"
        return value
    if not isinstance(value, dict | list | tuple) or id(value) in on_path:
        return value
    on_path.add(id(value))
    try:
        if isinstance(value, dict):
            return {key: _set_aside(child, marker, long, on_path) for key, child in value.items()}
        return [_set_aside(child, marker, long, on_path) for child in value]
    finally:
        on_path.discard(id(value))


def _put_back(value: Any, marker: str, long: list[str]) -> Any:
    """The read-back skeleton with each marker replaced by its long string (as a plain ``str``, as JSON reads it)."""
    if isinstance(value, str):
        if value.startswith(marker):
            text = long[int(value[len(marker) :])]
            return text if type(text) is str else str.__getitem__(text, slice(None))
        return value
    if isinstance(value, dict):
        return {key: _put_back(child, marker, long) for key, child in value.items()}
    if isinstance(value, list):
        return [_put_back(child, marker, long) for child in value]
    return value
