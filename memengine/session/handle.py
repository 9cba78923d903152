"""The client handle: a cheap object that sends messages to a session actor.

The handle knows the engine only as a :class:`SessionHost` (what a handle
needs of whoever made it), so this module does not depend on the engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import anyio
import anyio.lowlevel

from ..actor.reply import Reply
from ..config import SessionConfig
from ..context import Context, handed_out
from ..episode import Episode, encode_metadata, stored_episode
from ..errors import EngineClosedError, SessionClosedError
from ..limits import require_seq
from ..telemetry import NO_OPERATION, Telemetry
from ..tokens import count_large, large_batch
from .large_entry import ENTER_SLICE
from .messages import AddEpisodes, ClearSession, ClientMessage, CloseSession, DeleteEpisodes, ReadContext
from .window import tokenizer_of

T = TypeVar("T")


class SessionHost(Protocol):
    """What a :class:`Session` needs of the engine that made it (an :class:`~memengine.Engine`)."""

    @property
    def config(self) -> SessionConfig:
        """The limits a handle checks its arguments against."""

    @property
    def _telemetry(self) -> Telemetry:
        """Where a handle's calls are traced."""

    async def _send(self, session_id: str, message: ClientMessage) -> None:
        """Put ``message`` in the session's mailbox (activating it if needed); wait only for room."""

    def _send_now(self, session_id: str, message: ClientMessage) -> bool:
        """:meth:`_send` if the mailbox has room (True); else send nothing and return False."""

    def _check_caller(self) -> None:
        """Raise :class:`~memengine.ForeignLoopError` unless called from the engine's event loop."""


class Session:
    """A handle on one session. Get one with :meth:`Engine.session`.

    Handles do no I/O until called, and many handles may address the same
    session. Each call is a message to the session's actor, handled in arrival
    order. Every call is a checkpoint, and must come from the engine's event
    loop (:class:`~memengine.ForeignLoopError` otherwise, before anything is
    sent). A call cancelled before it was sent sent
    nothing; a call cancelled while waiting for its answer stops waiting, and
    the actor still carries the operation out (``add`` is idempotent by episode
    id, so retrying it is safe).
    """

    __slots__ = ("_closed", "_engine", "_id")

    def __init__(self, engine: SessionHost, session_id: str) -> None:
        self._engine = engine
        self._id = session_id
        self._closed = False

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Session {self._id!r}{state}>"

    @property
    def id(self) -> str:
        return self._id

    @property
    def closed(self) -> bool:
        return self._closed

    async def add(self, episodes: Iterable[Episode]) -> tuple[Episode, ...]:
        """Store episodes at the end of the session; return them with their seqs.

        Returns when the episodes are committed to the store, whatever the
        summarizer is doing. An episode whose id the session already holds is
        not stored again; the earlier stored episode is returned in its place.
        A rejected argument stores nothing.
        """
        return await self._traced_add(episodes, snapshot=True)

    async def _add_private(
        self, episodes: Iterable[Episode], metadata_json: Sequence[str | None] | None = None
    ) -> tuple[Episode, ...]:
        """:meth:`add` of episodes whose metadata no one else holds (``episode.with_private_metadata``).

        For the engine's own adapters, which build each episode for one add
        and never hand it out: their metadata is not copied again, and the
        episodes returned are the session's own, not copies (the adapters
        drop them; editing them would edit what the session shows).
        ``metadata_json``, one per episode, is its metadata's JSON exactly
        as ``encode_json`` writes it, if the adapter has it at hand (``None``:
        the store encodes that one).
        """
        return await self._traced_add(episodes, snapshot=False, metadata_json=metadata_json)

    def _traced_add(
        self,
        episodes: Iterable[Episode],
        *,
        snapshot: bool,
        metadata_json: Sequence[str | None] | None = None,
    ) -> Awaitable[tuple[Episode, ...]]:
        traced = self._engine._telemetry.operation("create_memory", "add", self._id)
        if traced is NO_OPERATION:  # nothing is traced (the usual case): none of its bookkeeping per add
            return self._add(episodes, snapshot, metadata_json)
        return self._add_traced(traced, episodes, snapshot, metadata_json)

    async def _add_traced(
        self,
        traced: Any,
        episodes: Iterable[Episode],
        snapshot: bool,
        metadata_json: Sequence[str | None] | None,
    ) -> tuple[Episode, ...]:
        with traced:
            stored = await self._add(episodes, snapshot, metadata_json)
            traced.count(len(stored))
            traced.content("gen_ai.memory.content", lambda: [[episode.role, episode.content] for episode in stored])
            return stored

    def _add(
        self, episodes: Iterable[Episode], snapshot: bool, metadata_json: Sequence[str | None] | None = None
    ) -> Awaitable[tuple[Episode, ...]]:
        """The add's request, its argument checked (a plain function: no coroutine of its own per add)."""
        batch = _episodes_argument(episodes)
        if len(batch) > ENTER_SLICE:  # checked a slice at a time, like the window takes it (large_entry.py)
            return self._add_large(batch, None, snapshot)
        batch = _checked_batch(batch, self._engine.config, snapshot)
        if not batch:
            return self._nothing_to_do(())
        contents = [episode.content for episode in batch]
        if large_batch(contents):  # many or long contents
            return self._add_large(batch, contents, snapshot)
        if snapshot:
            return self._request(AddEpisodes, batch)
        # (_checked_batch returns a private batch as it is, or refuses it: one JSON per episode still.)
        return self._request(_uncopied_add, batch, None if metadata_json is None else tuple(metadata_json))

    async def _add_large(
        self, batch: tuple[Episode, ...], contents: list[str] | None, snapshot: bool
    ) -> tuple[Episode, ...]:
        """A large add: its tokens are counted here, long contents in a worker thread, not by the actor.

        The session's actor counts each episode as it enters the window, on the
        event loop; for a large content (a long tool output) that could stall
        every session, so the caller counts it beforehand. Many episodes
        (``contents`` None) are checked and copied first, a slice at a time
        with the engine's other tasks running in between. If cancelled before
        it is sent, nothing was sent.
        """
        if contents is None:
            self._engine._check_caller()  # refused before the work of a large add, as any call is
            if self._closed:
                raise SessionClosedError(f"session handle {self._id!r} is closed")
            checked: list[Episode] = []
            for start in range(0, len(batch), ENTER_SLICE):
                checked += _checked_batch(batch[start : start + ENTER_SLICE], self._engine.config, snapshot)
                await anyio.lowlevel.checkpoint()
            batch = tuple(checked)
            contents = [episode.content for episode in batch]
        count = tokenizer_of(self._engine.config, self._id)
        counted = await count_large(count, contents)
        result: tuple[Episode, ...] = await self._request(
            lambda episodes, reply: AddEpisodes(episodes, reply, counted), batch
        )
        return result

    async def context(self, *, wait_for_summary: bool = False) -> Context:
        """The summary and the raw episodes after it, with no gap and no overlap.

        Within the session's token ceiling (``SessionConfig.max_context_tokens``,
        by default twice ``max_tokens``): a context that would pass it while the
        summarizer is behind first waits up to ``max_context_wait`` seconds for
        it, then leaves the oldest unsummarized episodes out and says so in
        ``Context.omitted``. The episodes are the caller's copies: editing them
        changes nothing the session holds.

        With ``wait_for_summary=True``, first wait until every episode evicted
        before this call is covered by a stored summary (with
        ``SessionConfig.segment_summaries``, also every range a delete left to
        summarize again: ``Context.resummarizing``). Cancelling this wait
        affects no one else: the summarizer keeps going. ``wait_for_summary``
        must be a bool (``TypeError`` otherwise: ``"no"`` would be true).
        """
        with self._engine._telemetry.operation("search_memory", "context", self._id) as traced:
            if not isinstance(wait_for_summary, bool):
                raise TypeError(f"wait_for_summary must be a bool, not {type(wait_for_summary).__name__}")
            if wait_for_summary:
                context: Context = await self._request(ReadContext, True, False)
            else:
                context = await self._within_ceiling()
            context = context.handed_out()
            if traced is not NO_OPERATION:  # (len(context.episodes) makes the caller's copies)
                traced.count(len(context.episodes))
            traced.content("gen_ai.memory.content", context.to_openai_chat)
            return context

    async def _within_ceiling(self) -> Context:
        """A read that waits up to ``max_context_wait`` for the summarizer rather than leave episodes out.

        The session answers at once when the context fits its ceiling (or
        waiting cannot help); else it keeps the read until the summary of the
        episodes it would leave out is stored. Past the wait, that read is
        abandoned (which leaves nothing behind) and a second one takes the
        ceiling's view as it is then, the left-out episodes in ``omitted``.
        """
        config = self._engine.config
        if config.max_context_wait and config.context_ceiling is not None:
            with anyio.move_on_after(config.max_context_wait):
                context: Context = await self._request(ReadContext, False, True)
                return context
        return await self._request(ReadContext, False, False)  # type: ignore[no-any-return]

    async def delete_episodes(self, seqs: Iterable[int]) -> int:
        """Delete episodes by seq; return how many existed and were deleted.

        Takes any number of seqs, each an int from 1 to ``MAX_SEQ`` (2**63 - 1);
        a seq given twice counts once, and one never stored is ignored.
        Every summary that covered a deleted episode is dropped, and the
        remaining episodes are summarized again in the background.
        """
        with self._engine._telemetry.operation("delete_memory", "delete_episodes", self._id) as traced:
            wanted = _seqs_argument(seqs)
            deleted: int
            if wanted:
                deleted = await self._request(DeleteEpisodes, wanted)
            else:
                deleted = await self._nothing_to_do(0)
            traced.count(deleted)
            return deleted

    async def clear(self) -> None:
        """Delete every episode and summary of the session, in memory and in the store.

        A summary being computed at that moment can never be stored.
        """
        with self._engine._telemetry.operation("delete_memory", "clear", self._id):
            await self._request(ClearSession)

    async def close(self) -> None:
        """Close this handle; every later call on it raises :class:`SessionClosedError`.

        The handle is closed before the first checkpoint, so even a cancelled
        close leaves it closed. The session survives: ``engine.session(id)``
        returns a working handle. Closing twice is a no-op.
        """
        self._engine._check_caller()
        if self._closed:
            await anyio.lowlevel.checkpoint()
            return
        self._closed = True
        await anyio.lowlevel.checkpoint_if_cancelled()
        reply: Reply[None] = Reply()
        try:
            await self._engine._send(self._id, CloseSession(reply))
        except EngineClosedError:
            return
        try:
            await reply.wait()
        except EngineClosedError:
            pass

    async def _request(self, make: Callable[..., ClientMessage], *fields: Any) -> Any:
        """Send the message ``make(*fields, reply)`` and wait for its reply."""
        self._engine._check_caller()
        if self._closed:
            raise SessionClosedError(f"session handle {self._id!r} is closed")
        await anyio.lowlevel.checkpoint_if_cancelled()
        reply: Reply[Any] = Reply()
        message = make(*fields, reply)
        if not self._engine._send_now(self._id, message):
            await self._engine._send(self._id, message)  # waits only while the session's mailbox is full
        return await reply.wait()

    async def _nothing_to_do(self, answer: T) -> T:
        """A call that needs no message: refused on a closed handle (or from another loop) all the same."""
        self._engine._check_caller()
        if self._closed:
            raise SessionClosedError(f"session handle {self._id!r} is closed")
        await anyio.lowlevel.checkpoint()
        return answer


def _uncopied_add(
    episodes: tuple[Episode, ...], metadata_json: tuple[str | None, ...] | None, reply: Reply[tuple[Episode, ...]]
) -> AddEpisodes:
    return AddEpisodes(episodes, reply, copies=False, metadata_json=metadata_json)


def _episodes_argument(episodes: Iterable[Episode]) -> tuple[Episode, ...]:
    kind = type(episodes)
    if kind is not tuple and kind is not list:  # (the usual arguments skip the slower checks)
        if isinstance(episodes, (Episode, str, bytes)) or not isinstance(episodes, Iterable):
            raise TypeError(f"add() takes an iterable of Episode, not {type(episodes).__name__}")
    batch = tuple(episodes)
    for episode in batch:
        if type(episode) is not Episode and not isinstance(episode, Episode):
            raise TypeError(f"add() takes Episode objects, not {type(episode).__name__}")
    return batch


def _checked_batch(batch: tuple[Episode, ...], config: SessionConfig, snapshot: bool = True) -> tuple[Episode, ...]:
    """Check every episode against the limits; snapshot metadata edited since construction.

    The session stores and shows the snapshot, so editing an episode's
    metadata after ``add`` changes nothing stored or read. Without
    ``snapshot``, the metadata is private to this add and was checked
    against the limit by whoever made it: only the contents are checked.
    """
    for episode in batch:
        if (snapshot and episode.metadata) or len(episode.content) > config.max_content_chars:
            break
    else:
        # The usual case: nothing to refuse, no metadata to snapshot, but the caller's empty dicts
        # are not shared with the session either (handed_out copies them). Private metadata is
        # this add's alone: not copied (a deep copy of every adapter item, for nothing).
        return handed_out(batch) if snapshot else batch
    checked = []
    for episode in batch:
        if len(episode.content) > config.max_content_chars:
            raise ValueError(
                f"episode {episode.id} has {len(episode.content)} characters of content; "
                f"the limit is SessionConfig.max_content_chars={config.max_content_chars}"
            )
        if snapshot and episode.metadata:
            metadata, encoded = encode_metadata(episode.metadata)
            size = len(encoded.encode("utf-8"))
            if size > config.max_metadata_bytes:
                raise ValueError(
                    f"episode {episode.id} has {size} bytes of metadata; "
                    f"the limit is SessionConfig.max_metadata_bytes={config.max_metadata_bytes}"
                )
            episode = stored_episode(
                episode.role,
                episode.content,
                episode.id,
                episode.created_at,
                metadata,
                episode.seq,  # type: ignore[arg-type]
            )
        elif snapshot:
            (episode,) = handed_out((episode,))  # its empty dict is the caller's, not the session's
        checked.append(episode)
    return tuple(checked)


def _seqs_argument(seqs: Iterable[int]) -> tuple[int, ...]:
    if isinstance(seqs, (int, str, bytes)) or not isinstance(seqs, Iterable):
        raise TypeError(f"delete_episodes() takes an iterable of seqs, not {type(seqs).__name__}")
    wanted = tuple(seqs)
    for seq in wanted:
        require_seq("a seq", seq)
    return wanted
