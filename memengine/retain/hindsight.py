"""A retain sink that hands sessions to Hindsight (https://hindsight.vectorize.io).

Needs the ``hindsight-client`` package: ``pip install 'agent-memengine[hindsight]'``.

Each session is one Hindsight document in one memory bank. A batch becomes one
retain item: a transcript with a line per episode, ``role (time): content``,
the layout Hindsight recommends for conversations. In ``"append"`` mode the
item carries ``update_mode="append"``, so Hindsight adds the new turns to the
session's document; in ``"replace"`` mode it carries the whole session and a
plain retain under the same document id replaces the document.

It implements ``forget`` too: a clear deletes the session's document, and a
delete rewrites it from the episodes it keeps (one plain retain, which
replaces the document), or deletes it if none are left.

The client is built on aiohttp, which runs only on asyncio, and its
connections belong to the event loop that opened them. So the sink gives the
client an asyncio loop of its own, on a thread of its own, and works the same
whether the engine runs on asyncio or trio. Close the sink (``async with`` or
:meth:`HindsightSink.aclose`) to close the client and stop that thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from datetime import UTC, datetime
from threading import Lock
from types import TracebackType
from typing import Any, get_args

import anyio
import anyio.to_thread
from anyio.from_thread import BlockingPortal, start_blocking_portal

from .._version import installed_version
from ..episode import Episode
from ..errors import MemEngineError
from .batch import ForgetRequest, RetainBatch, RetainMode

__all__ = ["HindsightRetainError", "HindsightSink"]

_INSTALL_HINT = "HindsightSink needs the hindsight-client package: pip install 'agent-memengine[hindsight]'"
# Operation ids are UUIDv5s of bank and batch key in this namespace: the bank too,
# because an operation id is a primary key across all banks of a server. Never
# change it, or a batch redelivered after an upgrade would get a new id.
_OPERATION_NAMESPACE = uuid.UUID("beb09342-3a20-4c0a-a0e8-2d4cda38194b")


class HindsightRetainError(MemEngineError):
    """Hindsight answered a retain request without reporting success.

    Raised by :meth:`HindsightSink.retain`; the engine retries the batch.
    """


class HindsightSink:
    """Sends retain batches to one Hindsight memory bank, one document per session.

    Pass a base URL (and an API key, if the server wants one)::

        async with HindsightSink("support-agent", base_url="http://localhost:8888") as sink:
            async with open_engine("memory.db", retain_sink=sink) as engine:
                ...

    or a ready ``hindsight_client.Hindsight`` as ``client``. The sink takes the
    client over: the client must not have made a request yet (its connections
    would belong to another event loop), and closing the sink closes it.

    ``mode`` is ``"append"`` (the default: each batch adds the session's new
    episodes to its document) or ``"replace"`` (each batch carries the whole
    session and replaces the document). ``document_id`` maps a session id to
    its document id; the default is the session id itself. ``context`` is
    Hindsight's optional description of the source (say ``"support chat"``),
    sent with every batch to guide fact extraction.

    Every item's metadata carries the batch's ``key`` (``memengine_key``), its
    session and its seq range, so a batch stored twice can be recognised. With
    ``retain_async=True`` the sink also passes an ``operation_id`` derived from
    the key, Hindsight's own idempotency key: a redelivered batch is not queued
    again. Hindsight then answers as soon as it has queued the batch: a failure
    while it processes the batch no longer reaches the engine, and Hindsight,
    not the engine, decides when queued batches are processed. By default the
    sink waits until Hindsight has processed the batch.

    Episode metadata is not sent: Hindsight's metadata belongs to the whole
    item, not to a line of it.
    """

    mode: RetainMode

    def __init__(
        self,
        bank_id: str,
        *,
        client: Any | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        mode: RetainMode = "append",
        document_id: Callable[[str], str] | None = None,
        context: str | None = None,
        retain_async: bool = False,
    ) -> None:
        if not isinstance(bank_id, str) or not bank_id:
            raise ValueError("bank_id must be a non-empty string")
        if mode not in get_args(RetainMode):
            raise ValueError(f"mode must be 'append' or 'replace', not {mode!r}")
        if client is None:
            if not base_url:
                raise ValueError("pass base_url (or a ready client)")
            try:
                from hindsight_client import Hindsight
            except ImportError as exc:
                raise ImportError(_INSTALL_HINT) from exc
            client = Hindsight(base_url=base_url, api_key=api_key, user_agent=_user_agent())
        elif base_url is not None or api_key is not None:
            raise ValueError("pass either client or base_url/api_key, not both")
        self.bank_id = bank_id
        self.client = client
        self.mode = mode
        self.document_id: Callable[[str], str] = document_id if document_id is not None else _same_id
        self.context = context
        self.retain_async = retain_async
        # Held only in worker threads, never in an event loop: it orders the
        # start of the client's loop, submissions and the shutdown.
        self._state_lock = Lock()
        self._portal: BlockingPortal | None = None
        self._portal_exit = ExitStack()
        self._closed = False

    async def retain(self, batch: RetainBatch) -> None:
        """Store ``batch`` in the session's document; return once Hindsight has accepted it.

        The request follows ``batch.mode`` (the engine sets it from
        :attr:`mode`). A batch without episodes sends nothing.

        Errors propagate so the engine can retry: what the client raises (an
        HTTP error answer is a ``hindsight_client_api.exceptions.ApiException``
        with its ``status``; a network failure or timeout an ``aiohttp`` or
        ``asyncio`` error), :class:`HindsightRetainError` for an answer without
        success, and :class:`anyio.ClosedResourceError` once the sink is closed.

        Cancellation aborts the request in flight without waiting for its
        answer. The request may already have reached Hindsight, so the batch
        may or may not be stored; a redelivery carries the same key (and, with
        ``retain_async``, the same operation id).
        """
        if not batch.episodes:
            return
        request = self._arguments(batch)
        future = await anyio.to_thread.run_sync(self._submit, request)
        try:
            await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            # After a cancellation, stop the request on the client's loop; once
            # the request has finished this does nothing.
            future.cancel()

    async def forget(self, request: ForgetRequest) -> None:
        """Erase what a delete or clear removed from the session's document; return once Hindsight has done it.

        A clear (``request.seqs is None``) deletes the document, with every
        memory Hindsight extracted from it. A delete rewrites the document
        from ``request.kept`` (a plain retain under the same document id,
        which replaces it, carrying ``request.key``), or deletes it when
        nothing is kept. A document already gone counts as deleted.

        Errors and cancellation are as for :meth:`retain`: the engine retries
        the request, with the same key, until it succeeds. With
        ``retain_async``, a batch Hindsight has queued but not processed yet
        is processed in Hindsight's own time, possibly after a deletion of
        the document: erasure is in order only without ``retain_async``.
        """
        if request.seqs is None or not request.kept:
            future = await anyio.to_thread.run_sync(
                self._submit_call, self._delete, self.document_id(request.session_id)
            )
        else:
            kept = request.kept
            first = kept[0].seq if kept[0].seq is not None else 0
            rewrite = RetainBatch(request.session_id, first, request.through_seq, kept, request.key, "replace")
            future = await anyio.to_thread.run_sync(self._submit, self._arguments(rewrite))
        try:
            await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            future.cancel()

    def _arguments(self, batch: RetainBatch) -> dict[str, Any]:
        """The keyword arguments of the client's ``aretain`` call for ``batch``."""
        episodes = batch.episodes
        request: dict[str, Any] = {
            "bank_id": self.bank_id,
            "content": "\n".join(_line(episode) for episode in episodes),
            "timestamp": episodes[0].created_at.astimezone(UTC),
            "document_id": self.document_id(batch.session_id),
            "metadata": {
                "memengine_key": batch.key,
                "memengine_session_id": batch.session_id,
                "memengine_first_seq": str(batch.first_seq),
                "memengine_last_seq": str(batch.last_seq),
            },
        }
        if self.context is not None:
            request["context"] = self.context
        if batch.mode == "append":
            request["update_mode"] = "append"
        if self.retain_async:
            request["retain_async"] = True
            request["operation_id"] = str(uuid.uuid5(_OPERATION_NAMESPACE, f"{self.bank_id}\x00{batch.key}"))
        return request

    async def aclose(self) -> None:
        """Close the client and stop its event loop thread. Closing twice does nothing.

        A retain still in flight fails. Cancellation does not interrupt the
        close: the sink is closed when this returns, even if it then raises
        the cancellation.
        """
        await anyio.to_thread.run_sync(self._shut_down)

    async def __aenter__(self) -> HindsightSink:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _submit(self, request: dict[str, Any]) -> Future[None]:
        """Start the retain ``request`` on the client's event loop (worker thread)."""
        return self._submit_call(self._send, request)

    def _submit_call(self, call: Callable[[Any], Any], argument: Any) -> Future[None]:
        """Start ``call(argument)`` on the client's event loop, starting the loop first if needed (worker thread)."""
        with self._state_lock:
            if self._closed:
                raise anyio.ClosedResourceError("this HindsightSink is closed")
            if self._portal is None:
                self._portal = self._portal_exit.enter_context(start_blocking_portal("asyncio"))
            return self._portal.start_task_soon(call, argument)

    async def _delete(self, document_id: str) -> None:
        """Delete the document (runs on the client's event loop); one that is not there is deleted already."""
        from hindsight_client_api.exceptions import NotFoundException

        try:
            await self.client.documents.delete_document(bank_id=self.bank_id, document_id=document_id)
        except NotFoundException:
            pass

    async def _send(self, request: dict[str, Any]) -> None:
        """Make the request (runs on the client's event loop)."""
        response = await self.client.aretain(**request)
        if not response.success:
            raise HindsightRetainError(f"Hindsight did not store the batch {request['metadata']['memengine_key']}")

    def _shut_down(self) -> None:
        """Close the client on its loop, then stop the loop (worker thread)."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            portal, self._portal = self._portal, None
            if portal is None:
                return  # the client never made a request: it holds no connections
            try:
                portal.call(self.client.aclose)
            finally:
                self._portal_exit.close()


def _line(episode: Episode) -> str:
    return f"{episode.role} ({_utc(episode.created_at)}): {episode.content}"


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _same_id(session_id: str) -> str:
    return session_id


def _user_agent() -> str:
    # Hindsight asks integrations to name themselves in front of its client's own token; the
    # version is the installed distribution's, whatever its name (agent-memengine).
    return f"memengine/{installed_version()}"
