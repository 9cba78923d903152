"""memengine as the session memory of the OpenAI Agents SDK (``pip install 'agent-memengine[agents]'``).

:class:`MemEngineSession` implements the SDK's ``Session`` protocol, so
``Runner.run(agent, input, session=MemEngineSession(engine, "alice"))`` reads
the conversation from a memengine session and writes each turn to it. The
session keeps memengine's window and rolling summary: history never grows
without bound, and the window never separates a tool call from its output.

How items are stored
====================

Each SDK item (a ``TResponseInputItem``: a message, a ``function_call``, a
``function_call_output``, a reasoning item, or any type this module does not
know) is one episode. Its role is the item's ``role``, else its ``type``. Its
content is the item's readable text (a message's text, a call's name and
arguments, a tool's output), which is what the summarizer and
:meth:`~memengine.Engine.recall` read. The item itself is kept, exactly, in the
episode's metadata under :data:`ITEM_KEY`; an item larger than
``SessionConfig.max_metadata_bytes`` is kept as JSON in the content instead
(:data:`ITEM_IN_CONTENT_KEY` says so). An item holding a string of more than
:data:`memengine.json_slices.LONG_STRING` characters (a tool's output of
megabytes) is encoded a slice at a time, the event loop serving every other
session in between. Either way ``get_items()`` returns
what was added, JSON-equal (as fresh copies), by the rules of
:meth:`~memengine.Context.to_openai_responses` (an output whose call is gone
is left out, a late output follows its call). The tool call ids an item makes or answers are
written with memengine's own keys (:data:`memengine.tool_calls.CALLS_KEY`,
:data:`~memengine.tool_calls.RESULT_OF_KEY`), so the window evicts a call and
its output together.

Every item added is stored, as by the SDK's own sessions
========================================================

Each ``add_items`` stores every item it is given, as a new episode (with an
episode id of its own), whatever the item's ``id``: an item added again in a
later call is stored again, as the SDK's ``SQLiteSession`` and
``SQLAlchemySession`` store it. Ids do not tell a repeated item from a new
one: models behind the Chat Completions API all report the SDK's placeholder
``__fake_id__``, and test models repeat theirs (the SDK's
``agents.testing.ScriptedModel`` gives every message ``"scripted-message"``),
so a model that answers ``"OK"`` twice gives two equal items, and the
conversation has both. The same holds for a retry: an ``add_items`` retried
after it timed out may store its items twice, exactly as with the SDK's
stores (a cancelled ``add_items`` is still carried out: see
:class:`MemEngineSession`). To add idempotently, use the engine's own
:meth:`memengine.Session.add`, which stores an episode id once.

What is refused, where the SDK's own sessions differ
====================================================

``add_items`` stores nothing of a call it refuses. An item that JSON cannot
encode (an object, bytes, a set) raises ``TypeError``, as it does from the
SDK's ``SQLiteSession`` and ``SQLAlchemySession``. The SDK's sessions store
some things without a word that this session refuses, deliberately:

- ``NaN`` and infinities (``ValueError``): they are not JSON. The SDK writes
  them as the bare tokens ``NaN``/``Infinity``, which PostgreSQL's ``jsonb``
  cannot hold (memengine accepts the same input on both stores) and which
  strict JSON parsers refuse, a model provider's API among them when the
  item is sent on the next turn: the error would come later, far from its cause.
- An item that is not a dict (``TypeError``), and a dict passed as the list
  of items (the SDK stores each of its keys as an item): every
  ``TResponseInputItem`` is a dict, and the next ``Runner.run`` would fail
  on what was stored.
- A lone surrogate anywhere in an item (``ValueError``): half of a UTF-16
  pair on its own (``"\\ud83d"``, from a bad decode or a text cut in the middle
  of an emoji) is not Unicode text and has no UTF-8 encoding, and memengine
  keeps an item's JSON and its readable text as UTF-8 text on both stores.
  The SDK's sessions store it as the JSON escape ``\\ud83d``, which strict
  parsers refuse (PostgreSQL's ``jsonb`` among them).
- An empty or blank ``session_id`` (``ValueError``, from
  :meth:`memengine.Engine.session`): an id left empty by mistake (an unset
  user id) would put every such user in one shared conversation.

Threads and event loops
=======================

The SDK runs on asyncio only, so this adapter is asyncio-only; the engine
itself may run on asyncio or trio. Without ``portal``, every call must come
from the event loop that runs the engine (``Runner.run`` and
``Runner.run_streamed`` inside ``async with open_engine(...)``); a call from
any other raises :class:`memengine.ForeignLoopError` at once, naming ``portal=``.
``Runner.run_sync`` runs the agent on an event loop of its own, which cannot
be the engine's (the engine's loop must be running all along, ``run_sync``'s
is not); run the engine in a portal instead
(``anyio.from_thread.start_blocking_portal()``, or an ``anyio.from_thread.BlockingPortal``
opened in the engine's loop) and pass it as ``portal``: every call is then sent
to the engine's thread, from whichever thread or loop it is made.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

try:
    from agents.memory.session_settings import SessionSettings, coerce_session_settings
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memengine.integrations.openai_agents needs the OpenAI Agents SDK: pip install 'agent-memengine[agents]'"
    ) from exc

from .. import rendering
from ..episode import Episode, encode_json, with_private_metadata
from ..episode_shapes import AGENTS_ITEM_IN_CONTENT_KEY, AGENTS_ITEM_KEY, json_copy
from ..json_slices import encode_in_slices, has_long_string
from ..limits import MAX_ROLE_CHARS
from ..tool_calls import CALLS_KEY, RESULT_OF_KEY, tool_links

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from ..engine import Engine

__all__ = ["FAKE_ITEM_ID", "ITEM_IN_CONTENT_KEY", "ITEM_KEY", "SUMMARY_PREFIX", "MemEngineSession"]

#: Episode metadata key: the SDK item, exactly as it was added.
ITEM_KEY = AGENTS_ITEM_KEY
#: Episode metadata key: true when the item was too large for metadata and is the episode's content, as JSON.
ITEM_IN_CONTENT_KEY = AGENTS_ITEM_IN_CONTENT_KEY
#: The placeholder id the SDK gives items from models that report none (Chat Completions, LiteLLM).
FAKE_ITEM_ID = "__fake_id__"
#: How the summary message that ``get_items()`` puts first begins.
SUMMARY_PREFIX = rendering.SUMMARY_PREFIX


T = TypeVar("T")

#: Bytes of ``{ITEM_KEY: null}`` as JSON: the size of an item's metadata when it has no links, but the item's.
#: The JSON of metadata holding an item and nothing else, with ``null`` where the item's JSON goes.
_ITEM_ALONE = encode_json({ITEM_KEY: None})
_ITEM_ALONE_BYTES = len(_ITEM_ALONE.encode())


class MemEngineSession:
    """An OpenAI Agents SDK ``Session`` kept in a memengine session.

    ``engine`` comes from :func:`memengine.open_engine`; ``session_id`` names
    the memengine session (the same rules as :meth:`Engine.session`).
    ``session_settings`` (a ``SessionSettings`` or a dict of its fields;
    default ``SessionSettings()``, no limit) is what the SDK reads, for example the default ``limit`` of
    :meth:`get_items`. ``portal`` lets the session be used from other threads
    and event loops, ``Runner.run_sync`` included (see the module docstring).

    Every method is a checkpoint with memengine's cancellation semantics: a
    call cancelled while waiting for its answer stops waiting, and the
    session still carries it out.
    """

    def __init__(
        self,
        engine: Engine,
        session_id: str,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        portal: BlockingPortal | None = None,
    ) -> None:
        self._session = engine.session(session_id)
        self._config = engine.config
        self._portal = portal
        self.session_id = session_id
        if isinstance(session_settings, Mapping):
            session_settings = dict(session_settings)
        self.session_settings: SessionSettings = coerce_session_settings(session_settings or SessionSettings())

    def __repr__(self) -> str:
        return f"<MemEngineSession {self.session_id!r}>"

    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The conversation as the model should see it: the summary message, then the raw items.

        When the session has a summary (of items that left memengine's window),
        it comes first as one ``{"role": "system", "content": ...}`` message
        beginning with :data:`SUMMARY_PREFIX`; the raw items follow in order,
        exactly as they were added, by the rules of
        :meth:`~memengine.Context.to_openai_responses`: an output whose call is
        gone is left out, an output that came late follows its call, and a call
        whose output never came is left out once other items follow it.
        ``limit`` (else ``session_settings.limit``) returns only the latest
        ``limit`` of those raw items, in order and without the summary, as the
        SDK documents it (the cut may part an output from its call: the SDK
        drops such an output itself); ``0`` returns nothing. The items are
        fresh copies: editing them changes nothing the session holds.
        """
        if limit is None:
            limit = self.session_settings.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
        context = await self._call(self._session.context)
        view = context._rendered()  # (not copied first: the rendering's items are built anew)
        if limit is None:
            return rendering.to_openai_responses(view)
        if limit <= 0:
            return []
        # The latest items of what the rules leave; the SDK drops an output the cut parts from its call.
        return rendering.to_openai_responses(attrs.evolve(view, summary=None))[-limit:]

    async def add_items(self, items: list[Any]) -> None:
        """Store the items at the end of the session, in order; return when they are committed.

        Every item must be a dict of JSON (dicts, lists, str, finite numbers,
        bool and None), as the SDK's items are: ``TypeError`` for what JSON
        cannot encode or an item that is not a dict, ``ValueError`` for NaN or
        an infinity (see the module docstring). Every item is stored, even
        one added before, as by the SDK's own sessions (see the module
        docstring). A rejected argument stores nothing. Items with megabytes of
        text are converted (a slice at a time) before anything is sent: a call
        cancelled meanwhile stores nothing, as a large add of the engine's own.
        """
        if isinstance(items, Mapping) or isinstance(items, str | bytes):
            raise TypeError(f"add_items() takes a list of items, not {type(items).__name__}")
        converted = []
        for item in items:
            if has_long_string(item):  # (a tool's output of megabytes: not in one go on the event loop)
                converted.append(self._episode_from(*await self._sliced_encoding(item)))
            else:
                converted.append(self._episode_from(*self._encoding(item)))
        if converted:
            episodes, metadata_json = zip(*converted, strict=True)
            await self._call(self._session._add_private, episodes, metadata_json)

    async def pop_item(self) -> dict[str, Any] | None:
        """Remove the newest item durably and return it; ``None`` when there is none.

        Only raw items are popped, never the summary. Two concurrent pops
        return two different items.
        """
        while True:
            context = await self._call(self._session.context)
            if not context.episodes:
                return None
            newest = context.episodes[-1]
            assert newest.seq is not None
            if await self._call(self._session.delete_episodes, [newest.seq]):
                return _item_of(newest)
            # Someone else deleted it between our read and our delete: take the next newest.

    async def clear_session(self) -> None:
        """Remove every item and the summary, in memory and in the store.

        With memengine's guarantees: no summary of the removed items is ever
        readable again (not even one being computed right now), recall finds
        none of them, and none of them is handed to the retain sink afterwards.
        """
        await self._call(self._session.clear)

    def _encoding(self, item: object) -> tuple[str, Any, int]:
        """The item's JSON, that JSON read back (``exact``) and its UTF-8 bytes; refusals as documented."""
        _require_dict(item)
        try:
            encoded = encode_json(item)
            return encoded, json.loads(encoded), len(encoded.encode())
        except (TypeError, ValueError) as exc:
            raise _refusal(exc) from None

    async def _sliced_encoding(self, item: object) -> tuple[str, Any, int]:
        """:meth:`_encoding` of an item with long strings, a slice at a time (json_slices.py)."""
        _require_dict(item)
        try:
            return await encode_in_slices(item)
        except (TypeError, ValueError) as exc:
            raise _refusal(exc) from None

    def _episode_from(self, encoded: str, exact: Any, size: int) -> tuple[Episode, str | None]:
        """The item's episode, and its metadata's JSON (``None``: the store encodes it).

        The item is encoded once: its metadata's JSON, which the store keeps,
        is written around that text (what ``encode_json`` makes of the
        metadata, the item's keys last), not encoded again in the store's thread.
        (An item with a key twice, as an int and as a str, keeps both in that
        text; it loads back, as ``exact`` was loaded, with the last of them.)
        """
        links = tool_links({"item": exact})
        metadata: dict[str, Any] = {}
        if links.calls:
            metadata[CALLS_KEY] = list(links.calls)
        if links.results:
            metadata[RESULT_OF_KEY] = list(links.results)
        role = _role_of(exact)
        text = _readable_text(exact)
        # The metadata's JSON is {...the links, ITEM_KEY: encoded}: its size without encoding the item again
        # (encoded is exact's JSON; where an item repeats a key, exact keeps one, so this is an upper bound).
        shell = encode_json({**metadata, ITEM_KEY: None}) if metadata else _ITEM_ALONE  # {..., "item": null}
        head = len(shell.encode()) if metadata else _ITEM_ALONE_BYTES
        metadata_json: str | None = None
        if head - len("null") + size <= self._config.max_metadata_bytes:
            metadata[ITEM_KEY] = exact
            content = text if text.strip() and "\x00" not in text else encoded
            metadata_json = shell[: -len("null}")] + encoded + "}"
        else:
            metadata[ITEM_IN_CONTENT_KEY] = True
            content = encoded
        # The metadata is JSON-exact (made from json.loads) and this add's alone: not copied again. The JSON
        # text, as content, is known good (no NUL: JSON escapes it; its UTF-8 counted): not encoded again.
        return with_private_metadata(role, content, metadata, content_checked=content is encoded), metadata_json

    async def _call(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        if self._portal is not None:
            try:
                future = self._portal.start_task_soon(method, *args)
            except RuntimeError:
                pass  # called on the portal's own event loop: call directly
            else:
                import asyncio  # the SDK, hence this adapter, is asyncio-only

                return await asyncio.wrap_future(future)
        return await method(*args)


def _require_dict(item: object) -> None:
    if not isinstance(item, Mapping):
        raise TypeError(f"a session item must be a dict, not {type(item).__name__}")


def _refusal(error: TypeError | ValueError) -> TypeError | ValueError:
    """What ``add_items`` raises for an item whose encoding raised ``error`` (the module docstring)."""
    if isinstance(error, UnicodeEncodeError):  # (its message would quote the whole item)
        return ValueError(
            f"a session item must be valid Unicode: it holds a lone surrogate, "
            f"U+{ord(error.object[error.start]):04X}, half of a UTF-16 pair (a bad decode, a text cut mid-character), "
            "which neither store can keep"
        )
    if isinstance(error, TypeError):  # a value JSON has no type for: TypeError, as from the SDK's own sessions
        return TypeError(f"a session item must be JSON: {error}")
    return ValueError(f"a session item must be JSON: {error}")  # NaN or an infinity, or a cycle


def _item_of(episode: Episode) -> dict[str, Any]:
    item = episode.metadata.get(ITEM_KEY)
    if isinstance(item, dict):
        return json_copy(item)
    if episode.metadata.get(ITEM_IN_CONTENT_KEY):
        return json.loads(episode.content)
    # An episode some other writer added to this session: show it as a plain message.
    return {"role": episode.role, "content": episode.content}


def _role_of(item: dict[str, Any]) -> str:
    role = item.get("role")
    if not (isinstance(role, str) and role.strip() and "\x00" not in role):
        kind = item.get("type")
        role = kind if isinstance(kind, str) and kind.strip() and "\x00" not in kind else "item"
    return role[:MAX_ROLE_CHARS]


def _readable_text(item: dict[str, Any]) -> str:
    """What a reader (the summarizer, recall) should see of an item: its words, not its JSON."""
    kind = item.get("type")
    if "role" in item and kind in (None, "message"):
        return _text_of(item.get("content"))
    if kind == "function_call":
        return f"{item.get('name', '')}({item.get('arguments', '')})"
    if isinstance(kind, str) and kind.endswith("_call_output"):
        return _text_of(item.get("output"))
    if kind == "reasoning":
        return _text_of(item.get("summary"))
    return ""


def _text_of(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""
