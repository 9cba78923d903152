"""The Hindsight retain sink, against a local stand-in for the Hindsight HTTP API."""

from __future__ import annotations

import json
import re
import select
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest

pytest.importorskip(
    "hindsight_client", reason="hindsight-client is not installed (pip install 'agent-memengine[hindsight]')"
)

from hindsight_client import Hindsight, RetainResponse
from hindsight_client_api.exceptions import ApiException

from memengine import Episode
from memengine.episode import with_seq
from memengine.retain.batch import (
    ForgetRequest,
    ForgettingSink,
    RetainBatch,
    RetainMode,
    RetainSink,
    forget_key,
    retain_key,
)
from memengine.retain.hindsight import HindsightSink

pytestmark = pytest.mark.anyio

_RETAIN_PATH = re.compile(r"/v1/default/banks/(?P<bank_id>[^/]+)/memories")
_DOCUMENT_PATH = re.compile(r"/v1/default/banks/(?P<bank_id>[^/]+)/documents/(?P<document_id>[^/]+)")
T0 = datetime(2024, 3, 15, 9, 0, tzinfo=UTC)


@attrs.frozen
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def item(self) -> dict[str, Any]:
        (item,) = self.body["items"]
        return item


class FakeHindsight(ThreadingHTTPServer):
    """Records every request and answers it the way the Hindsight API does.

    ``fail_with`` makes it answer with that HTTP status instead. Clear
    ``released`` to hold answers back until it is set again: ``arrived`` is set
    when a request has been read, ``hung_up`` when a client closed its
    connection before its answer was sent.
    """

    daemon_threads = False  # server_close() joins the handler threads

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[Received] = []
        self.fail_with: int | None = None
        self.arrived = threading.Event()
        self.hung_up = threading.Event()
        self.released = threading.Event()
        self.released.set()
        self.documents: set[str] = set()  # ids of the documents stored (retained, not deleted)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def record(self, request: Received) -> None:
        self.received.append(request)
        self.arrived.set()

    def answer(self, request: Received) -> tuple[int, Any]:
        document = _DOCUMENT_PATH.fullmatch(request.path)
        if request.method == "DELETE" and document is not None:
            if self.fail_with is not None:
                return self.fail_with, {"detail": "the memory store is unavailable"}
            if document["document_id"] not in self.documents:
                return 404, {"detail": "Document not found"}
            self.documents.discard(document["document_id"])
            deleted = {"success": True, "message": "Document deleted", "document_id": document["document_id"]}
            return 200, {**deleted, "memory_units_deleted": 3}
        match = _RETAIN_PATH.fullmatch(request.path)
        if request.method != "POST" or match is None:
            return 404, {"detail": "Not Found"}
        if self.fail_with is not None:
            return self.fail_with, {"detail": "the memory store is unavailable"}
        body = request.body
        self.documents.update(item["document_id"] for item in body["items"] if item.get("document_id"))
        retain_async = body.get("async", False)
        # An async retain answers with the operation it queued: the caller's id, if it gave one.
        operation_id = (body.get("operation_id") or str(uuid.uuid4())) if retain_async else None
        response = RetainResponse(
            success=True,
            bank_id=match["bank_id"],
            items_count=len(body["items"]),
            var_async=retain_async,
            operation_id=operation_id,
        )
        return 200, response.to_dict()


class _Handler(BaseHTTPRequestHandler):
    server: FakeHindsight

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length) if length else b""
        request = Received(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=json.loads(raw) if raw else None,
        )
        self.server.record(request)
        while not self.server.released.wait(0.01):
            if self._client_hung_up():
                self.server.hung_up.set()
                return
        status, answer = self.server.answer(request)
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _client_hung_up(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hindsight() -> Iterator[FakeHindsight]:
    server = FakeHindsight()
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), name="fake-hindsight")
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join()


def episode(seq: int, role: str, content: str) -> Episode:
    return with_seq(Episode(role, content, created_at=T0 + timedelta(minutes=seq)), seq)


def batch(session_id: str, *episodes: Episode, mode: RetainMode = "append") -> RetainBatch:
    first, last = episodes[0].seq, episodes[-1].seq
    assert first is not None and last is not None
    return RetainBatch(session_id, first, last, episodes, retain_key(session_id, first, last, mode), mode)


HELLO = episode(1, "user", "Hi, I'm Maria. I moved to Lisbon last month.")
WELCOME = episode(2, "assistant", "Welcome to Lisbon, Maria!")
BILLING = episode(3, "user", "I'm still billed for the Basic plan.")


async def test_append_batch_adds_the_new_turns_to_the_session_document(hindsight: FakeHindsight) -> None:
    sent = batch("chat-7", WELCOME, BILLING)
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        await sink.retain(sent)

    (request,) = hindsight.received
    assert (request.method, request.path) == ("POST", "/v1/default/banks/support/memories")
    assert request.body["async"] is False
    item = request.item
    assert item["update_mode"] == "append"
    assert item["document_id"] == "chat-7"
    assert item["content"] == (
        "assistant (2024-03-15T09:02:00Z): Welcome to Lisbon, Maria!\n"
        "user (2024-03-15T09:03:00Z): I'm still billed for the Basic plan."
    )
    assert item["timestamp"] == "2024-03-15T09:02:00+00:00"  # when the first of these turns happened
    assert item["metadata"] == {
        "memengine_key": sent.key,
        "memengine_session_id": "chat-7",
        "memengine_first_seq": "2",
        "memengine_last_seq": "3",
    }
    assert "operation_id" not in request.body


async def test_replace_batch_retains_the_whole_session_under_the_same_document(hindsight: FakeHindsight) -> None:
    sent = batch("chat-7", HELLO, WELCOME, BILLING, mode="replace")
    async with HindsightSink("support", base_url=hindsight.url, mode="replace") as sink:
        assert sink.mode == "replace"
        await sink.retain(sent)

    item = hindsight.received[0].item
    assert item.get("update_mode") is None  # a plain retain: Hindsight replaces the document
    assert item["document_id"] == "chat-7"
    assert item["content"].splitlines() == [
        "user (2024-03-15T09:01:00Z): Hi, I'm Maria. I moved to Lisbon last month.",
        "assistant (2024-03-15T09:02:00Z): Welcome to Lisbon, Maria!",
        "user (2024-03-15T09:03:00Z): I'm still billed for the Basic plan.",
    ]
    assert item["metadata"]["memengine_key"] == sent.key


async def test_successive_batches_arrive_in_order_with_context_and_derived_document_id(
    hindsight: FakeHindsight,
) -> None:
    async with HindsightSink(
        "support", base_url=hindsight.url, document_id=lambda session: f"memengine/{session}", context="support chat"
    ) as sink:
        await sink.retain(batch("chat-7", HELLO))
        await sink.retain(batch("chat-7", WELCOME, BILLING))

    first, second = (request.item for request in hindsight.received)
    assert first["document_id"] == second["document_id"] == "memengine/chat-7"
    assert first["context"] == second["context"] == "support chat"
    assert [first["content"].count("\n"), second["content"].count("\n")] == [0, 1]
    assert first["content"].endswith(HELLO.content) and second["content"].endswith(BILLING.content)


async def test_server_error_propagates_so_the_engine_retries(hindsight: FakeHindsight) -> None:
    hindsight.fail_with = 500
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        with pytest.raises(ApiException) as failure:
            await sink.retain(batch("chat-7", HELLO))
        assert failure.value.status == 500
        assert len(hindsight.received) == 1  # the client does not retry writes: that is the engine's job

        hindsight.fail_with = None
        await sink.retain(batch("chat-7", HELLO))  # the sink still works after a failure
    assert len(hindsight.received) == 2


async def test_async_retain_passes_an_operation_id_derived_from_the_key(hindsight: FakeHindsight) -> None:
    async with HindsightSink("support", base_url=hindsight.url, retain_async=True) as sink:
        await sink.retain(batch("chat-7", HELLO))
        await sink.retain(batch("chat-7", HELLO))  # redelivered: the same operation id
        await sink.retain(batch("chat-7", WELCOME))

    bodies = [request.body for request in hindsight.received]
    assert all(body["async"] is True for body in bodies)
    ids = [body["operation_id"] for body in bodies]
    assert ids[0] == ids[1] != ids[2]
    assert all(uuid.UUID(operation_id).version == 5 for operation_id in ids)


async def test_concurrent_sessions_share_one_client(hindsight: FakeHindsight) -> None:
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        async with anyio.create_task_group() as tasks:
            for n in range(8):
                tasks.start_soon(sink.retain, batch(f"chat-{n}", HELLO))
    assert sorted(request.item["document_id"] for request in hindsight.received) == [f"chat-{n}" for n in range(8)]


async def test_cancellation_aborts_the_request_in_flight(hindsight: FakeHindsight) -> None:
    hindsight.released.clear()  # Hindsight takes its time to answer
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(sink.retain, batch("chat-7", HELLO))
                await anyio.to_thread.run_sync(hindsight.arrived.wait)
                tasks.cancel_scope.cancel()
            assert await anyio.to_thread.run_sync(hindsight.hung_up.wait, 5)
        hindsight.released.set()
        await sink.retain(batch("chat-7", WELCOME))  # the next batch goes through
    assert [request.item["content"].endswith(WELCOME.content) for request in hindsight.received] == [False, True]


async def test_api_key_and_user_agent(hindsight: FakeHindsight) -> None:
    async with HindsightSink("support", base_url=hindsight.url, api_key="secret") as sink:
        await sink.retain(batch("chat-7", HELLO))
    headers = hindsight.received[0].headers
    assert headers["authorization"] == "Bearer secret"
    assert headers["user-agent"].startswith("memengine/")


async def test_a_ready_client_is_used_and_closed_with_the_sink(hindsight: FakeHindsight) -> None:
    client = Hindsight(base_url=hindsight.url, user_agent="my-app/2.0")
    async with HindsightSink("support", client=client) as sink:
        assert sink.client is client
        await sink.retain(batch("chat-7", HELLO))
    assert hindsight.received[0].headers["user-agent"].startswith("my-app/2.0")
    with pytest.raises(RuntimeError, match="Session is closed"):
        await client.aretain("support", "after the sink closed it")


async def test_a_closed_sink_refuses_batches(hindsight: FakeHindsight) -> None:
    sink = HindsightSink("support", base_url=hindsight.url)
    await sink.retain(batch("chat-7", HELLO))
    await sink.aclose()
    await sink.aclose()  # closing again does nothing
    with pytest.raises(anyio.ClosedResourceError):
        await sink.retain(batch("chat-7", WELCOME))
    assert len(hindsight.received) == 1


class ThreadRecordingHindsight(Hindsight):
    """The real client, noting the thread each retain runs on."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url=base_url)
        self.threads: set[threading.Thread] = set()

    async def aretain(self, *args: Any, **kwargs: Any) -> RetainResponse:
        self.threads.add(threading.current_thread())
        return await super().aretain(*args, **kwargs)


async def test_the_client_runs_on_one_thread_of_its_own_until_the_sink_closes(hindsight: FakeHindsight) -> None:
    client = ThreadRecordingHindsight(hindsight.url)
    async with HindsightSink("support", client=client) as sink:
        for session in ("chat-1", "chat-2", "chat-3"):
            await sink.retain(batch(session, HELLO))
        (thread,) = client.threads
        assert thread is not threading.current_thread() and thread.is_alive()
    assert not thread.is_alive()


async def test_a_batch_without_episodes_sends_nothing(hindsight: FakeHindsight) -> None:
    empty = RetainBatch("chat-7", 4, 3, (), retain_key("chat-7", 4, 3, "append"))
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        await sink.retain(empty)
    assert hindsight.received == []


def test_is_a_retain_sink_that_appends_by_default() -> None:
    sink = HindsightSink("support", base_url="http://127.0.0.1:9")
    assert isinstance(sink, RetainSink)
    assert sink.mode == "append"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bank_id": "", "base_url": "http://127.0.0.1:9"},
        {"bank_id": "support"},
        {"bank_id": "support", "base_url": "http://127.0.0.1:9", "mode": "upsert"},
        {"bank_id": "support", "client": object(), "base_url": "http://127.0.0.1:9"},
        {"bank_id": "support", "client": object(), "api_key": "secret"},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HindsightSink(**kwargs)


def test_missing_hindsight_client_package_gives_a_clear_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hindsight_client", None)
    with pytest.raises(ImportError, match=r"memengine\[hindsight\]"):
        HindsightSink("support", base_url="http://127.0.0.1:9")


async def test_through_the_engine_each_turn_reaches_the_session_document_once(
    hindsight: FakeHindsight, tmp_path
) -> None:
    from memengine import SessionConfig, open_engine

    async with HindsightSink("support", base_url=hindsight.url) as sink:
        config = SessionConfig(retain_every=3)
        async with open_engine(tmp_path / "memory.db", retain_sink=sink, config=config) as engine:
            session = engine.session("chat-9")
            for i in range(1, 6):
                await session.add([Episode("user", f"turn {i}")])
            await session.close()
    items = [request.item for request in hindsight.received]
    assert [item["document_id"] for item in items] == ["chat-9", "chat-9"]
    assert [item["update_mode"] for item in items] == ["append", "append"]
    lines = [line.split(": ", 1)[1] for item in items for line in item["content"].splitlines()]
    assert lines == [f"turn {i}" for i in range(1, 6)]
    assert [item["metadata"]["memengine_first_seq"] for item in items] == ["1", "4"]


def forgetting(session_id: str, seqs: tuple[int, ...] | None, through_seq: int, *kept: Episode) -> ForgetRequest:
    return ForgetRequest(session_id, seqs, through_seq, kept, forget_key(session_id, 2))


def test_is_a_sink_that_forgets() -> None:
    assert isinstance(HindsightSink("support", base_url="http://127.0.0.1:9"), ForgettingSink)


async def test_forgetting_a_cleared_session_deletes_its_document(hindsight: FakeHindsight) -> None:
    async with HindsightSink("support", base_url=hindsight.url, document_id=lambda s: f"doc-{s}") as sink:
        await sink.retain(batch("chat-7", HELLO, WELCOME))
        await sink.forget(forgetting("chat-7", None, 2))
    assert [(r.method, r.path) for r in hindsight.received][1:] == [
        ("DELETE", "/v1/default/banks/support/documents/doc-chat-7")
    ]
    assert hindsight.documents == set()


@pytest.mark.parametrize("mode", ["append", "replace"])
async def test_forgetting_deleted_episodes_rewrites_the_document_from_the_kept_ones(
    hindsight: FakeHindsight, mode: RetainMode
) -> None:
    request = forgetting("chat-7", (2,), 3, HELLO, BILLING)
    async with HindsightSink("support", base_url=hindsight.url, mode=mode) as sink:
        await sink.forget(request)
    (sent,) = hindsight.received
    assert (sent.method, sent.path) == ("POST", "/v1/default/banks/support/memories")
    item = sent.item
    assert item.get("update_mode") is None  # a plain retain under the document id replaces the document
    assert item["document_id"] == "chat-7"
    assert item["content"] == (
        "user (2024-03-15T09:01:00Z): Hi, I'm Maria. I moved to Lisbon last month.\n"
        "user (2024-03-15T09:03:00Z): I'm still billed for the Basic plan."
    )
    assert item["metadata"]["memengine_key"] == request.key
    assert (item["metadata"]["memengine_first_seq"], item["metadata"]["memengine_last_seq"]) == ("1", "3")


async def test_a_forget_sent_after_a_later_clear_keeps_nothing_and_deletes_the_document(
    hindsight: FakeHindsight,
) -> None:
    # The engine reads what is kept when it sends the request: a clear since the delete leaves nothing.
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        await sink.retain(batch("chat-7", HELLO, WELCOME))
        await sink.forget(forgetting("chat-7", (2,), 2))
        await sink.forget(forgetting("chat-7", None, 2))  # the document is gone already: nothing to do
    assert [r.method for r in hindsight.received] == ["POST", "DELETE", "DELETE"]
    assert hindsight.documents == set()


async def test_forgetting_every_episode_handed_on_deletes_the_document(hindsight: FakeHindsight) -> None:
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        await sink.forget(forgetting("chat-7", (1, 2), 2))  # nothing kept; the document is gone already
    assert [(r.method, r.path) for r in hindsight.received] == [
        ("DELETE", "/v1/default/banks/support/documents/chat-7")
    ]


async def test_a_failed_forget_raises_so_the_engine_retries(hindsight: FakeHindsight) -> None:
    hindsight.fail_with = 503
    async with HindsightSink("support", base_url=hindsight.url) as sink:
        with pytest.raises(ApiException) as raised:
            await sink.forget(forgetting("chat-7", None, 2))
    assert raised.value.status == 503


async def test_through_the_engine_a_delete_rewrites_and_a_clear_deletes_the_document(
    hindsight: FakeHindsight, tmp_path
) -> None:
    from memengine import SessionConfig, open_engine

    async with HindsightSink("support", base_url=hindsight.url) as sink:
        config = SessionConfig(retain_every=3, max_episodes=100)
        async with open_engine(tmp_path / "memory.db", retain_sink=sink, config=config) as engine:
            session = engine.session("chat-9")
            for i in range(1, 4):
                await session.add([Episode("user", f"turn {i}")])
            with anyio.fail_after(60):
                while not hindsight.received:  # noqa: ASYNC110 - the fake server records on its own thread
                    await anyio.sleep(0.01)
            await session.delete_episodes([2])
            with anyio.fail_after(60):
                while len(hindsight.received) < 2:  # noqa: ASYNC110 - the fake server records on its own thread
                    await anyio.sleep(0.01)
            await session.clear()
            await session.close()
    requests = hindsight.received
    assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in requests] == [
        ("POST", "memories"),
        ("POST", "memories"),
        ("DELETE", "chat-9"),
    ]
    appended, rewritten = requests[0].item, requests[1].item
    assert appended["update_mode"] == "append"
    assert rewritten.get("update_mode") is None
    assert [line.split(": ", 1)[1] for line in rewritten["content"].splitlines()] == ["turn 1", "turn 3"]
    assert hindsight.documents == set()
