"""The engine: owns the store, the task group, and the session activations."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from .actor.mailbox import MailboxClosed
from .config import SessionConfig
from .episode import require_text
from .errors import EngineClosedError, LeaseLostError
from .replay import MessageRecorder
from .retain.batch import RetainMode, RetainSink
from .retain.delivery import RetainDelivery, RetainMetrics
from .session.actor import RetainPlan, SessionActor, SessionServices
from .session.handle import Session
from .session.messages import ClientMessage, LeaseLost, Tick
from .store.base import Recalled, Store
from .store.open import open_store
from .summarizer.extractive import ExtractiveSummarizer
from .summarizer.protocol import Summarizer

log = logging.getLogger("memengine")

MAX_SESSION_ID_CHARS = 1024


class Engine:
    """A running memory engine. Get one from :func:`open_engine`.

    Sessions are virtual actors: one is activated (its state recovered from the
    store) by the first message sent to it, and passivated after it has been
    idle for ``SessionConfig.passivate_after`` seconds or closed.
    """

    def __init__(
        self, services: SessionServices, tasks: anyio.abc.TaskGroup, delivery: RetainDelivery | None = None
    ) -> None:
        self._services = services
        self._tasks = tasks
        self._delivery = delivery
        self._actors: dict[str, SessionActor] = {}
        self._closed = False

    @property
    def config(self) -> SessionConfig:
        return self._services.config

    @property
    def store(self) -> Store:
        return self._services.store

    @property
    def active_sessions(self) -> int:
        """How many sessions are activated (in memory) right now."""
        return len(self._actors)

    def is_active(self, session_id: str) -> bool:
        return session_id in self._actors

    async def recall(self, query: str, *, session_id: str | None = None, limit: int = 10) -> list[Recalled]:
        """Full-text search over every stored episode (all sessions, or one), best match first.

        Matches any of the first 1,000 distinct words of ``query`` (case aside;
        later words are ignored), ranked by bm25 (SQLite) or ``ts_rank``
        (PostgreSQL); returns at most ``limit`` hits, each with its session id.
        Every episode stored before the call is searched; deleted and cleared
        ones are never found. A damaged index is rebuilt from the stored
        episodes first. Works with or without a retain sink. A checkpoint; if
        cancelled, nothing changes.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, not {type(query).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, not {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if session_id is not None:
            self.session(session_id)  # the same validation as a handle
        if self._closed:
            raise EngineClosedError("the engine is closed")
        return await self._services.store.recall(query, session_id, limit)

    async def retain_metrics(self) -> RetainMetrics:
        """Outbox depth, age of the oldest undelivered batch, deliveries and failures so far."""
        outbox = await self._services.store.outbox_state()
        delivered, failures = (0, 0) if self._delivery is None else (self._delivery.delivered, self._delivery.failures)
        return RetainMetrics.of(outbox, delivered, failures)

    def session(self, session_id: str) -> Session:
        """A handle on the session ``session_id``. Does no I/O.

        Raises ``ValueError`` for an empty id and ``TypeError`` for a non-string.
        """
        require_text("a session id", session_id)
        if len(session_id) > MAX_SESSION_ID_CHARS:
            raise ValueError(f"a session id is at most {MAX_SESSION_ID_CHARS} characters, got {len(session_id)}")
        return Session(self, session_id)

    def _deliver(self, session_id: str, message: ClientMessage) -> None:
        """Put a message in the session's mailbox, activating the session if needed."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        actor = self._actors.get(session_id) or self._activate(session_id)
        actor.mailbox.put(message)

    def _activate(self, session_id: str) -> SessionActor:
        actor = SessionActor(session_id, self._services, self._forget, self._deliver)
        self._actors[session_id] = actor
        self._tasks.start_soon(self._run_actor, actor, name=f"memengine session {session_id!r}")
        return actor

    def _forget(self, actor: SessionActor) -> None:
        if self._actors.get(actor.session_id) is actor:
            del self._actors[actor.session_id]

    async def _run_actor(self, actor: SessionActor) -> None:
        try:
            await actor.run()
        except Exception:
            # A bug in one session must not take the engine (and every other session) down.
            log.exception("session %r stopped with an error", actor.session_id)

    async def _recover_orphans(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Take on what no live process owns: at start, then every ``lease_ttl``.

        Sessions left by a crashed run or a dead replica (their leases expired)
        get their un-retained tails recorded for delivery and, if their evicted
        episodes are unsummarized, are activated to summarize them.
        """
        interval = self._services.config.lease_ttl
        orphaned_only = False  # at start: also sessions a crashed run of this same owner name left
        while True:
            if resume_summaries:
                await self._resume_pending_summaries(orphaned_only)
            await anyio.sleep(interval)
            orphaned_only = True
            if self._delivery is not None:
                try:
                    if await self._services.store.enqueue_all_retains(mode, orphaned_only=True):
                        self._delivery.notify()
                except Exception:
                    log.exception("could not record the retain tails of sessions no process owns")

    async def _resume_pending_summaries(self, orphaned_only: bool) -> None:
        """Activate sessions left with evicted, unsummarized episodes (by a crash or shutdown)."""
        config = self._services.config
        try:
            pending = await self._services.store.sessions_needing_summary(
                config.max_episodes, config.max_chars, orphaned_only=orphaned_only
            )
        except Exception:
            log.exception("could not look for sessions with pending summaries")
            return
        for session_id in pending:
            if not self._closed and session_id not in self._actors:
                self._activate(session_id)

    async def _sweep_idle_sessions(self, passivate_after: float) -> None:
        """Tick every active session a few times per ``passivate_after``.

        A session that saw no client message for ``passivate_after`` seconds
        (measured in ticks) passivates once its summarizer is idle.
        """
        interval = max(passivate_after / 4, 0.001)
        while True:
            await anyio.sleep(interval)
            tick = Tick(anyio.current_time())
            for actor in self._actors.values():
                actor.mailbox.put(tick)

    async def _renew_leases(self) -> None:
        """Every third of ``lease_ttl``, extend the lease of every active session in one statement.

        A session whose lease could not be renewed (it expired while this
        process was paused, and another took it over) is told to give up.
        """
        ttl = self._services.config.lease_ttl
        while True:
            await anyio.sleep(ttl / 3)
            held = [(actor, actor.token) for actor in self._actors.values() if actor.token is not None]
            if not held:
                continue
            asked_at = anyio.current_time()
            try:
                renewed = await self._services.store.renew_leases(
                    [(actor.session_id, token) for actor, token in held], ttl
                )
            except Exception:
                # The writes themselves stay fenced; reads renew on their own once the lease may have lapsed.
                log.exception("renewing session leases failed; retrying in %.1f s", ttl / 3)
                continue
            for actor, token in held:
                if actor.token != token:
                    continue  # activated again meanwhile
                if actor.session_id in renewed:
                    actor.lease_renewed(asked_at)
                else:
                    lost = LeaseLostError(
                        f"session {actor.session_id!r}: this process's lease expired or was taken over"
                    )
                    with contextlib.suppress(MailboxClosed):
                        actor.mailbox.put(LeaseLost(lost))

    def _close(self) -> None:
        self._closed = True
        self._tasks.cancel_scope.cancel()


@asynccontextmanager
async def open_engine(
    path: str | os.PathLike[str] = "memengine.db",
    *,
    summarizer: Summarizer | None = None,
    retain_sink: RetainSink | None = None,
    config: SessionConfig | None = None,
    max_concurrent_summaries: int = 16,
    resume_pending_summaries: bool = True,
    retain_grace: float = 5.0,
    record_to: str | os.PathLike[str] | None = None,
    synchronous: str = "NORMAL",
    owner: str | None = None,
) -> AsyncIterator[Engine]:
    """Open the store at ``path`` and run an engine for the block's duration.

    ``path`` is a SQLite file (created if missing), ``":memory:"``, or a
    PostgreSQL URL (``postgresql://user@host/db``). Several processes may
    serve the same sessions through one PostgreSQL database, or one SQLite
    file on one machine: each session is owned by one process at a time
    (a lease with a fencing token; see ``SessionConfig.lease_ttl``).
    ``owner`` names this process in those leases (default: host, pid and a
    random part). A process that restarts under the same name takes its
    sessions back at once instead of waiting for their leases to expire;
    never give two running processes the same name.
    ``summarizer`` defaults to the offline :class:`ExtractiveSummarizer`.
    ``max_concurrent_summaries`` caps summarizer calls in flight across all
    sessions. With ``resume_pending_summaries`` (default), sessions left with
    unsummarized evicted episodes by an earlier run are summarized now.

    With a ``retain_sink``, every ``config.retain_every`` new episodes of a
    session are handed on to it, and the partial batch at every boundary
    (``close()``, passivation, leaving this block), exactly once and in order
    per session. Batches a crashed run left behind are delivered at start.

    Leaving the block stops every session actor and summarizer: an operation
    already committed stays committed, a summary not yet stored is computed
    again on the next start, and callers still waiting get
    :class:`EngineClosedError`. Delivery to the retain sink then gets up to
    ``retain_grace`` seconds; what is left stays in the outbox for the next
    start.

    ``synchronous`` is SQLite's durability setting (ignored for PostgreSQL): ``"NORMAL"`` (default)
    keeps every acknowledged write across a crash of the process (kill -9);
    ``"FULL"`` also across a power loss, at the cost of an fsync per commit.

    With ``record_to``, every message a session handles is appended to that
    JSON-lines file (see :mod:`memengine.replay`); ``memengine replay`` plays
    such a log into a fresh store.
    """
    if config is None:
        config = SessionConfig()
    elif not isinstance(config, SessionConfig):
        raise TypeError(f"config must be a SessionConfig, not {type(config).__name__}")
    if summarizer is None:
        summarizer = ExtractiveSummarizer()
    elif not callable(getattr(summarizer, "summarize", None)):
        raise TypeError("summarizer must have an async summarize(previous, episodes) method")
    if isinstance(max_concurrent_summaries, bool) or not isinstance(max_concurrent_summaries, int):
        raise TypeError("max_concurrent_summaries must be an int")
    if max_concurrent_summaries < 1:
        raise ValueError("max_concurrent_summaries must be at least 1")
    mode = _retain_mode(retain_sink)
    if isinstance(retain_grace, bool) or not isinstance(retain_grace, (int, float)):
        raise TypeError(f"retain_grace must be a number of seconds, not {type(retain_grace).__name__}")
    if not retain_grace >= 0:
        raise ValueError(f"retain_grace must be >= 0 seconds, not {retain_grace!r}")

    if owner is not None:
        require_text("owner", owner)
    async with open_store(path, synchronous=synchronous, owner=owner) as store, anyio.create_task_group() as background:
        recorder = None if record_to is None else MessageRecorder(record_to)
        delivery = None if retain_sink is None else RetainDelivery(store, retain_sink, config)
        plan = None if delivery is None else RetainPlan(mode, config.retain_every, delivery)
        slots = anyio.CapacityLimiter(max_concurrent_summaries)
        services = SessionServices(store, summarizer, config, slots, plan, recorder)
        try:
            if delivery is not None:
                # A crashed run's sessions never reached their exit boundary: hand on their tails now
                # (leases under this process's own name are a crashed predecessor's).
                await store.enqueue_all_retains(mode)
                background.start_soon(delivery.run)
            async with anyio.create_task_group() as tasks:
                engine = Engine(services, tasks, delivery)
                tasks.start_soon(engine._recover_orphans, resume_pending_summaries, mode)
                if config.passivate_after is not None:
                    tasks.start_soon(engine._sweep_idle_sessions, config.passivate_after)
                tasks.start_soon(engine._renew_leases)
                try:
                    yield engine
                finally:
                    engine._close()
        finally:
            # Every session actor has stopped. Leaving is a boundary for them
            # all; then the sink gets a bounded grace period.
            try:
                with anyio.CancelScope(shield=True):
                    if delivery is not None:
                        await store.enqueue_all_retains(mode)  # a failure here is raised to the caller
                        await delivery.drain(retain_grace)
            finally:
                background.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    # Last: the delivery has stopped, so no claim can be taken after this.
                    try:
                        await store.release_leases()
                    except Exception:
                        log.exception("releasing this process's leases failed; they expire on their own")
                if recorder is not None:
                    recorder.close()


def _retain_mode(sink: object) -> RetainMode:
    if sink is None:
        return "append"
    if not callable(getattr(sink, "retain", None)):
        raise TypeError("retain_sink must have an async retain(batch) method")
    mode = getattr(sink, "mode", "append")
    if mode not in ("append", "replace"):
        raise ValueError(f"retain_sink.mode must be 'append' or 'replace', not {mode!r}")
    return mode  # type: ignore[no-any-return]
