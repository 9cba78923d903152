"""The engine: owns the store, the task group, and the session activations."""

from __future__ import annotations

import inspect
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

import anyio
import anyio.abc

from .actor.reply import Reply
from .actor.wakeup import current_loop
from .config import SessionConfig
from .errors import EngineClosedError, EngineFailedError, ForeignLoopError, LeaseLostError, MemEngineError
from .limits import MAX_OWNER_BYTES, MAX_RECALL_LIMIT, MAX_SESSION_ID_BYTES, require_int, require_text
from .privacy import forget as forgetting
from .privacy.export import ExportStream
from .privacy.report import ForgetReport
from .retain.batch import RetainMode, RetainSink
from .retain.delivery import RetainDelivery, RetainMetrics
from .scope import Scope
from .session.actor import SessionActor, SessionServices
from .session.handle import Session
from .session.messages import ClientMessage, ForgetSession, HandOver, LeaseLost, RetrySummary, Tick
from .session.recording import MessageRecorder
from .session.retain_flush import RetainPlan
from .stats import EngineStats
from .store.base import Erased, Recalled, SetAside, SetAsideCounts, Store
from .store.committer import INTERRUPT_SECONDS
from .store.liveness import HEARTBEAT_SECONDS
from .store.open import open_store
from .summarizer.extractive import ExtractiveSummarizer
from .summarizer.protocol import Summarizer
from .telemetry import Telemetry, capture_content_default
from .tokens import checked

log = logging.getLogger("memengine")

#: How often an engine looks for sessions another process waits for (store/handover.py).
HAND_OVER_SECONDS = 0.25

#: How often the outbox and set-aside gauges' figures are read from the store (with opentelemetry installed).
OUTBOX_SAMPLE_SECONDS = 5.0
#: Set-aside work listed (and retried together) at most.
MAX_SET_ASIDE_LISTED = 10_000


class Engine:
    """A running memory engine. Get one from :func:`open_engine`.

    Sessions are virtual actors: one is activated (its state recovered from the
    store) by the first message sent to it, and passivated after it has been
    idle for ``SessionConfig.passivate_after`` seconds or closed.

    Every call must come from the event loop that opened the engine: a call
    from another (another thread's, ``Runner.run_sync``'s) raises
    :class:`ForeignLoopError` before doing anything. Run the engine behind a
    portal to call it from other threads (see the error).
    """

    def __init__(
        self, services: SessionServices, tasks: anyio.abc.TaskGroup, delivery: RetainDelivery | None = None
    ) -> None:
        self._services = services
        self._telemetry = services.telemetry
        self._outbox_sample: tuple[int, float | None] | None = None  # for the outbox gauges
        self._set_aside_sample: SetAsideCounts | None = None  # for the set-aside gauges
        self._tasks = tasks
        self._delivery = delivery
        self._actors: dict[str, SessionActor] = {}
        self._closed = False
        self._others_running = anyio.Event()  # set while other engines are registered on the store
        self._loop = current_loop()  # the only event loop whose calls the engine can answer

    def __repr__(self) -> str:
        active = len(self._actors)
        state = "closed, " if self._closed else ""
        return (
            f"<Engine {state}store={self._services.store!r} summarizer={self._services.summarizer!r} "
            f"{active} active session{'s' if active != 1 else ''}>"
        )

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

    async def recall(
        self,
        query: str,
        *,
        session_id: str | None = None,
        tenant: str | None = None,
        prefix: str | None = None,
        all_sessions: bool = False,
        limit: int = 10,
    ) -> list[Recalled]:
        """Full-text search over the stored episodes of one scope, best match first.

        The scope is exactly one of: ``session_id`` (one session), ``tenant``
        (the sessions ``"tenant/..."``: ids that start with the tenant and a
        ``/``), ``prefix`` (ids that start with it, exactly: no wildcards, case
        counts) or ``all_sessions=True`` (every session of the store). None or
        several raise ``ValueError`` naming the options: a search across users
        is never the default. Hits of other sessions are never returned.

        Matches any of the first 1,000 distinct words of ``query`` (case aside;
        later words are ignored), ranked by bm25 (SQLite) or ``ts_rank``
        (PostgreSQL); returns at most ``limit`` hits (1 to ``MAX_RECALL_LIMIT``,
        10,000), each with its session id. Every episode stored before the call
        is searched; deleted and cleared ones, and the parts of an add still
        being stored, are never found. A damaged index is rebuilt from the
        stored episodes first. Works with or without a retain sink. A
        checkpoint; if cancelled, nothing changes.
        """
        self._check_caller()
        with self._telemetry.operation(
            "search_memory", "recall", session_id if isinstance(session_id, str) else None
        ) as traced:
            if not isinstance(query, str):
                raise TypeError(f"query must be a str, not {type(query).__name__}")
            scope = Scope.of("recall", session_id=session_id, tenant=tenant, prefix=prefix, all_sessions=all_sessions)
            require_int("recall's limit", limit, 1, MAX_RECALL_LIMIT)
            if self._closed:
                raise EngineClosedError("the engine is closed")
            traced.content("gen_ai.memory.query.text", lambda: query)
            found = await self._services.store.recall(query, scope, limit)
            traced.count(len(found))
            return found

    async def forget(
        self,
        *,
        session_id: str | None = None,
        tenant: str | None = None,
        prefix: str | None = None,
        dry_run: bool = False,
    ) -> ForgetReport:
        """Erase every session of one scope: one session, one ``tenant`` (``"tenant/..."``), or a ``prefix``.

        Each session is erased as ``clear()`` clears it, through its own
        activation (a session another process keeps in memory is handed over
        to this one first), and then some: its episodes, summaries, recall
        index entries, undelivered retain batches, its row, an add left
        unfinished, and its lease. The process that held it before cannot keep
        or write it back (fencing tokens). Sessions are erased a few at a time,
        each in transactions no bigger than one add's, so other sessions'
        writers are not held up. Returns the counts erased; with
        ``dry_run=True`` erases nothing and returns what would be erased now.

        A session kept busy by another process past ``lease_wait`` is tried
        once more at the end; if some are still left, raises
        :class:`ForgetIncompleteError` (the sessions erased stay erased: call
        again). Idempotent and resumable. A call for a forgotten session
        afterwards starts a new, empty session. A checkpoint; if cancelled,
        the sessions already sent for erasure are erased, the rest are not.
        """
        self._check_caller()
        scope = Scope.of("forget", session_id=session_id, tenant=tenant, prefix=prefix, allow_all=False)
        if not isinstance(dry_run, bool):
            raise TypeError(f"dry_run must be a bool, not {type(dry_run).__name__}")
        if self._closed:
            raise EngineClosedError("the engine is closed")
        with self._telemetry.operation("delete_memory", "forget", session_id) as traced:
            if dry_run:
                return await forgetting.count(self._services.store, scope)
            report = await forgetting.forget(self._services.store, scope, self._erase)
            traced.count(report.episodes)
            return report

    async def _erase(self, session_id: str) -> Erased:
        reply: Reply[Erased] = Reply()
        await self._send(session_id, ForgetSession(reply))
        return await reply.wait()

    def export(
        self, *, session_id: str | None = None, tenant: str | None = None, prefix: str | None = None
    ) -> ExportStream:
        """Every stored episode and summary of one scope, as JSON-ready records: ``async for record in ...``.

        The scope is one session, one ``tenant`` (``"tenant/..."``) or a
        ``prefix``. For each session (by id), a ``"session"`` record
        (``session_id``, ``episodes``, ``summary``, ``summarized_through``,
        ``summary_created_at``), then one ``"episode"`` record per stored
        episode in seq order (``session_id``, ``seq``, ``id``, ``role``,
        ``content``, ``metadata``, ``created_at``). Read a page at a time
        (bounded memory, whatever the tenant's size), from the store: what was
        acknowledged is there. :func:`memengine.privacy.export.write_json_lines`
        writes them as JSON lines. Each step is a checkpoint.
        """
        scope = Scope.of("export", session_id=session_id, tenant=tenant, prefix=prefix, allow_all=False)
        if self._closed:
            raise EngineClosedError("the engine is closed")
        return ExportStream(self._services.store, scope, self._check_caller)

    async def stats(self) -> EngineStats:
        """Active sessions, mailbox depth, episodes waiting for a summary, and the retain outbox.

        The same figures as memengine's OpenTelemetry gauges, with or without
        opentelemetry installed. Reads the store for the outbox figures: a
        checkpoint; if cancelled, nothing changes.
        """
        self._check_caller()
        outbox = RetainMetrics.of(await self._services.store.outbox_state(), 0, 0)
        set_aside = await self._services.store.set_aside_counts()
        depths = [actor.mailbox.depth for actor in self._actors.values()]
        return EngineStats(
            active_sessions=len(self._actors),
            mailbox_depth=sum(depths),
            mailbox_depth_max=max(depths, default=0),
            episodes_waiting_for_summary=self._episodes_waiting_for_summary(),
            outbox_depth=outbox.outbox_depth,
            oldest_undelivered_age=outbox.oldest_undelivered_age,
            summaries_set_aside=set_aside.summaries,
            retains_set_aside=set_aside.retains,
        )

    async def list_set_aside(self, session_id: str | None = None) -> list[SetAside]:
        """Work set aside after too many failed rounds (of one session, or all), summaries first.

        A read of the store (every process's work): a checkpoint; if cancelled, nothing changes.
        """
        self._check_caller()
        if session_id is not None:
            self.session(session_id)  # the same validation as a handle
        return await self._services.store.list_set_aside(session_id, MAX_SET_ASIDE_LISTED)

    async def retry_set_aside(self, session_id: str | None = None) -> int:
        """Try set-aside work again (of one session, or all); return how many batches were set aside.

        A set-aside summary batch is tried at once by the session, activated
        here if it was not (its mark is lifted in the store first); its
        counting of failed rounds starts afresh. A set-aside retain batch is
        due at once again, with its attempts counted afresh. If cancelled,
        the sessions already told try again; the rest stay set aside.
        """
        self._check_caller()
        if self._closed:
            raise EngineClosedError("the engine is closed")
        store = self._services.store
        if session_id is not None:
            self.session(session_id)  # the same validation as a handle
            sessions = [session_id]
        else:
            listed = await store.list_set_aside(None, MAX_SET_ASIDE_LISTED)
            sessions = [work.session_id for work in listed if work.kind == "summary"]
        retried = 0
        for one in sessions:
            reply: Reply[bool] = Reply()
            await self._send(one, RetrySummary(reply))
            retried += await reply.wait()
        retains = await store.retry_set_aside_retains(session_id)
        if retains:
            log.warning("%d set-aside retain batch%s tried again", retains, "" if retains == 1 else "es")
            if self._delivery is not None:
                self._delivery.notify()
        return retried + retains

    async def discard_set_aside(self, session_id: str | None = None) -> list[SetAside]:
        """Drop set-aside retain batches (of one session, or all) from the outbox; return what was dropped.

        The sink never gets them, and the session's later batches go out
        next. Each is logged at WARNING. Summary batches cannot be discarded
        (a summary must cover every live episode before it): retry them, or
        delete their episodes (:meth:`Session.delete_episodes`, which lifts
        the mark). A checkpoint; if cancelled, the batches may still be dropped.
        """
        self._check_caller()
        if self._closed:
            raise EngineClosedError("the engine is closed")
        if session_id is not None:
            self.session(session_id)
        dropped = await self._services.store.discard_set_aside_retains(session_id)
        for work in dropped:
            log.warning(  # not its error text, which may quote the episodes (privacy/error_text.py)
                "discarded the set-aside retain batch of session %r seqs %d..%d: the sink never gets it",
                work.session_id,
                work.first_seq,
                work.last_seq,
            )
        if dropped and self._delivery is not None:
            self._delivery.notify()
        return dropped

    def _episodes_waiting_for_summary(self) -> int:
        return sum(actor.episodes_waiting_for_summary for actor in self._actors.values())

    def _gauge_figures(self) -> dict[str, float] | None:
        """The figures of memengine's gauges (memengine/telemetry.py), or None once closed.

        The outbox figures are the last sample :meth:`_sample_outbox` took (a gauge cannot await).
        A metric reader may call this from a thread of its own: it only reads, from a copy of the
        activations taken in one step (atomic under the GIL).
        """
        if self._closed:
            return None
        actors = list(self._actors.values())
        figures: dict[str, float] = {
            "memengine.sessions.active": len(actors),
            "memengine.mailbox.depth": sum(actor.mailbox.depth for actor in actors),
            "memengine.summary.waiting_episodes": sum(actor.episodes_waiting_for_summary for actor in actors),
        }
        if self._outbox_sample is not None:
            depth, oldest_age = self._outbox_sample
            figures["memengine.retain.outbox.depth"] = depth
            if oldest_age is not None:
                figures["memengine.retain.outbox.oldest_age"] = oldest_age
        if self._set_aside_sample is not None:
            figures["memengine.summary.set_aside"] = self._set_aside_sample.summaries
            figures["memengine.retain.set_aside"] = self._set_aside_sample.retains
        return figures

    async def _sample_outbox(self) -> None:
        """Read the store's figures for the gauges every :data:`OUTBOX_SAMPLE_SECONDS` (a gauge cannot await).

        The outbox's only with a retain sink (without one, nothing is added to it); the set-aside counts always.
        """
        while True:
            if self._delivery is not None:
                await self._sample_outbox_once()
            await self._sample_set_aside_once()
            await anyio.sleep(OUTBOX_SAMPLE_SECONDS)

    async def _sample_outbox_once(self) -> None:
        try:
            outbox = RetainMetrics.of(await self._services.store.outbox_state(), 0, 0)
        except Exception as exc:
            log.warning("reading the outbox figures for the gauges failed (%s)", exc)
            return
        self._outbox_sample = (outbox.outbox_depth, outbox.oldest_undelivered_age)

    async def _sample_set_aside_once(self) -> None:
        try:
            self._set_aside_sample = await self._services.store.set_aside_counts()
        except Exception as exc:
            log.warning("reading the set-aside counts for the gauges failed (%s)", exc)

    async def retain_metrics(self) -> RetainMetrics:
        """Outbox depth, age of the oldest undelivered batch, deliveries and failures so far."""
        self._check_caller()
        outbox = await self._services.store.outbox_state()
        delivered, failures = (0, 0) if self._delivery is None else (self._delivery.delivered, self._delivery.failures)
        return RetainMetrics.of(outbox, delivered, failures)

    def session(self, session_id: str) -> Session:
        """A handle on the session ``session_id``. Does no I/O.

        A session id is a non-blank str of valid Unicode without NUL, at most
        ``MAX_SESSION_ID_BYTES`` (1,024) bytes of UTF-8; anything else raises
        ``TypeError`` (not a str) or ``ValueError``.
        """
        require_text("a session id", session_id, max_bytes=MAX_SESSION_ID_BYTES)
        return Session(self, session_id)

    def _check_caller(self) -> None:
        """Refuse a call from an event loop other than the engine's: it could never be answered."""
        if current_loop() is not self._loop:
            raise ForeignLoopError(
                "this call came from an event loop other than the engine's (another thread's, or "
                "Runner.run_sync's): the engine could never answer it. Call the engine from the loop "
                "that opened it, or run the engine behind a portal "
                "(anyio.from_thread.start_blocking_portal()) and call through it: portal.call(...), "
                "or MemEngineSession(engine, session_id, portal=portal)"
            )

    async def _send(self, session_id: str, message: ClientMessage) -> None:
        """Put a caller's message in the session's mailbox, activating the session if needed.

        When the mailbox is full (``SessionConfig.mailbox_capacity`` calls
        waiting), wait for room. Cancelled while waiting, nothing was sent.
        """
        while not self._send_now(session_id, message):
            actor = self._actors.get(session_id)
            if actor is not None:
                await actor.mailbox.wait_for_room()  # or the actor stopped: then a new activation

    def _send_now(self, session_id: str, message: ClientMessage) -> bool:
        """:meth:`_send` without waiting: False (nothing sent) when the session's mailbox is full."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        actor = self._actors.get(session_id) or self._activate(session_id)
        if not actor.mailbox.has_room():
            return False
        actor.receive(message)
        return True

    def _hand_on(self, session_id: str, message: ClientMessage) -> None:
        """Give a message an activation that stopped without handling it to a new one (never waits)."""
        if self._closed:
            raise EngineClosedError("the engine is closed")
        actor = self._actors.get(session_id) or self._activate(session_id)
        actor.mailbox.put(message)

    def _activate(self, session_id: str) -> SessionActor:
        actor = SessionActor(session_id, self._services, self._deregister, self._hand_on)
        self._actors[session_id] = actor
        self._tasks.start_soon(self._run_actor, actor, name=f"memengine session {session_id!r}")
        return actor

    def _deregister(self, actor: SessionActor) -> None:
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

        Sessions left by a crashed run or a dead replica (their leases expired,
        or released at once by :meth:`_watch_owners`) get their un-retained
        tails recorded for delivery and, if their evicted episodes are
        unsummarized, are activated to summarize them. Those that need nothing
        more are released (store/orphans.py), so the sweep does not grow with
        every process that ever died.
        """
        config = self._services.config
        if resume_summaries:
            # At start: also sessions a crashed run of this same owner name left.
            await self._resume_pending_summaries(orphaned_only=False)
        while True:
            await anyio.sleep(config.lease_ttl)
            await self._take_on_orphans(resume_summaries, mode)
            try:
                # What was handled (now or by an earlier sweep) is let go: the sweep stays small.
                await self._services.store.release_orphans(
                    config.max_episodes, config.max_chars, retaining=self._delivery is not None
                )
            except Exception:
                log.exception("could not release the leases of sessions whose owner died")

    async def _take_on_orphans(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Record the retain tails of sessions no live process owns, and summarize what they left pending."""
        if resume_summaries:
            await self._resume_pending_summaries(orphaned_only=True)
        if self._delivery is not None:
            try:
                if await self._services.store.enqueue_all_retains(
                    mode, orphaned_only=True, batch_size=self.config.retain_every
                ):
                    self._delivery.notify()
            except Exception:
                log.exception("could not record the retain tails of sessions no process owns")

    def _others_seen(self, others: bool) -> None:
        if others and not self._others_running.is_set():
            self._others_running.set()
        elif not others and self._others_running.is_set():
            self._others_running = anyio.Event()

    async def _hand_over_wanted(self) -> None:
        """Every quarter second, tell the sessions another process waits for to go once idle (store/handover.py).

        Only while other engines are registered on the store (:meth:`_watch_owners` tells).
        """
        while True:
            await self._others_running.wait()
            await anyio.sleep(HAND_OVER_SECONDS)
            if not self._actors:
                continue
            try:
                wanted = await self._services.store.wanted_sessions()
            except Exception as exc:
                log.warning("looking for sessions other processes wait for failed (%s)", exc)
                continue
            for session_id in wanted:
                actor = self._actors.get(session_id)
                if actor is not None:
                    actor.mailbox.put_if_open(HandOver())

    async def _watch_owners(self, resume_summaries: bool, mode: RetainMode) -> None:
        """Every second: keep this engine's liveness lock, and take on at once what dead owners left.

        See store/owners.py. If the lock was lost meanwhile (PostgreSQL: its
        connection dropped), other processes may void this process's retain
        claims after a grace, so every sink call in flight is cancelled now.
        A check that does not answer within two seconds counts as lost.
        """
        store = self._services.store
        period = HEARTBEAT_SECONDS
        while True:
            await anyio.sleep(period)
            held = False
            with anyio.move_on_after(2 * HEARTBEAT_SECONDS):
                try:
                    held = await store.keep_alive()
                except Exception as exc:
                    log.warning("checking this engine's liveness lock failed (%s)", exc)
            if self._delivery is not None:
                if held:
                    self._delivery.alive_moved()  # sink calls are bounded by store.alive_until, just moved
                else:
                    self._delivery.drop_claims()  # reads wait for a renewal by themselves (store.alive_until)
            try:
                reaped = await store.reap_dead_owners()
            except Exception as exc:
                log.warning("looking for engines that died failed (%s); looking again in a second", exc)
                period = HEARTBEAT_SECONDS
                continue
            self._others_seen(reaped.others)
            if self._delivery is not None:
                # What another process records (a batch, or a forget: `memengine forget` has no sink, and may
                # come and go between two heartbeats) wakes only that process: this one looks at each heartbeat.
                self._delivery.notify()
            # Alone on a store whose liveness lock cannot be lost (SQLite), there is nobody to look
            # after often: an engine that registers is found within a third of lease_ttl.
            alone = not reaped.others and store.alive_until() == math.inf
            period = max(HEARTBEAT_SECONDS, self._services.config.lease_ttl / 3) if alone else HEARTBEAT_SECONDS
            if reaped.owners:
                log.info("took over from engines that died: %s", ", ".join(reaped.owners))
                await self._take_on_orphans(resume_summaries, mode)
                if self._delivery is not None:
                    self._delivery.notify()

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
                    actor.mailbox.put_if_open(LeaseLost(lost))

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
    busy_timeout: float = 10.0,
    owner: str | None = None,
    capture_content: bool | None = None,
    tracer_provider: object | None = None,
    meter_provider: object | None = None,
) -> AsyncIterator[Engine]:
    """Open the store at ``path`` and run an engine for the block's duration.

    ``path`` is a SQLite file (created if missing), ``":memory:"``, or a
    PostgreSQL URL (``postgresql://user@host/db``). Several processes may
    serve the same sessions through one PostgreSQL database, or one SQLite
    file on one machine: each session is owned by one process at a time
    (a lease with a fencing token; see ``SessionConfig.lease_ttl``).
    ``owner`` names this process in those leases (default: host, pid and a
    random part; at most ``MAX_OWNER_BYTES``, 1,024 bytes of UTF-8, no NUL).
    A process that restarts under the same name takes its sessions back at
    once instead of waiting for their leases to expire; never give two
    running processes the same name.
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
    start. Whatever the database does (a lock held, a server gone silent),
    leaving takes at most :data:`EXIT_DEADLINE_SECONDS` beyond
    ``retain_grace``: the engine's last store work gets
    :data:`EXIT_STORE_SECONDS`, then what still runs is interrupted and the
    connections closed within ``INTERRUPT_SECONDS`` (see store/committer.py).

    ``synchronous`` is SQLite's durability setting (ignored for PostgreSQL): ``"NORMAL"`` (default)
    keeps every acknowledged write across a crash of the process (kill -9);
    ``"FULL"`` also across a power loss, at the cost of an fsync per commit.
    ``busy_timeout`` is how many seconds a SQLite write waits for another
    process's write lock before it fails with :class:`StoreError` (ignored for
    PostgreSQL: ``lock_timeout`` and ``statement_timeout`` in the URL, see
    :mod:`memengine.store.postgres_connection`).

    With ``record_to``, every message a session handles is appended to that
    JSON-lines file (see :mod:`memengine.session.recording`); ``memengine replay`` plays
    such a log into a fresh store.

    With ``opentelemetry-api`` installed (the ``otel`` extra), the engine emits
    spans and metrics (see :mod:`memengine.telemetry`) through
    ``tracer_provider`` and ``meter_provider``, by default the global ones;
    without it, nothing. Episode text, summaries and queries go into spans
    only with ``capture_content=True`` (None: the environment variable
    ``MEMENGINE_OTEL_CAPTURE_CONTENT=true``; default off).
    """
    if config is None:
        config = SessionConfig()
    elif not isinstance(config, SessionConfig):
        raise TypeError(f"config must be a SessionConfig, not {type(config).__name__}")
    if summarizer is None:
        summarizer = ExtractiveSummarizer()
    else:
        _require_async_method(summarizer, "summarizer", "summarize", "previous, episodes")
    if config.tokenizer is not None:
        _check_tokenizer(config.tokenizer)
    if isinstance(max_concurrent_summaries, bool) or not isinstance(max_concurrent_summaries, int):
        raise TypeError("max_concurrent_summaries must be an int")
    if max_concurrent_summaries < 1:
        raise ValueError("max_concurrent_summaries must be at least 1")
    mode = _retain_mode(retain_sink)
    if isinstance(retain_grace, bool) or not isinstance(retain_grace, (int, float)):
        raise TypeError(f"retain_grace must be a number of seconds, not {type(retain_grace).__name__}")
    if not retain_grace >= 0:
        raise ValueError(f"retain_grace must be >= 0 seconds, not {retain_grace!r}")
    if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, (int, float)):
        raise TypeError(f"busy_timeout must be a number of seconds, not {type(busy_timeout).__name__}")
    if not 0 <= busy_timeout < math.inf:
        raise ValueError(f"busy_timeout must be >= 0 seconds, not {busy_timeout!r}")

    if owner is not None:
        require_text("owner", owner, max_bytes=MAX_OWNER_BYTES)
    telemetry = Telemetry.start(tracer_provider, meter_provider, capture_content_default(capture_content))
    body_error: BaseException | None = None
    failure: BaseException | None
    try:
        async with open_store(path, synchronous=synchronous, owner=owner, busy_timeout=busy_timeout) as store:
            recorder = None if record_to is None else MessageRecorder(record_to, config=config, summarizer=summarizer)
            delivery = None if retain_sink is None else RetainDelivery(store, retain_sink, config, telemetry)
            plan = None if delivery is None else RetainPlan(mode, config.retain_every, delivery)
            slots = anyio.CapacityLimiter(max_concurrent_summaries)
            services = SessionServices(store, summarizer, config, slots, plan, recorder, telemetry)
            try:
                async with anyio.create_task_group() as background:
                    try:
                        # A process that died left its leases and retain claims: released now, not at expiry.
                        await store.start_liveness()
                        reaped_at_start = await store.reap_dead_owners()
                        if delivery is not None:
                            # A crashed run's sessions never reached their exit boundary: hand on their
                            # tails now (leases under this process's own name are a crashed predecessor's).
                            await store.enqueue_all_retains(mode, batch_size=config.retain_every)
                            background.start_soon(delivery.run)
                        async with anyio.create_task_group() as tasks:
                            engine = Engine(services, tasks, delivery)
                            engine._others_seen(reaped_at_start.others)
                            tasks.start_soon(engine._recover_orphans, resume_pending_summaries, mode)
                            if config.passivate_after is not None:
                                tasks.start_soon(engine._sweep_idle_sessions, config.passivate_after)
                            tasks.start_soon(engine._renew_leases)
                            tasks.start_soon(engine._watch_owners, resume_pending_summaries, mode)
                            tasks.start_soon(engine._hand_over_wanted)
                            if telemetry.metering:
                                telemetry.observe(engine)
                                tasks.start_soon(engine._sample_outbox)
                            try:
                                yield engine
                            except BaseException as exc:
                                # The caller's own error (or cancellation) leaves this block as
                                # itself, not wrapped by the engine's task groups: kept for the end.
                                body_error = exc
                            finally:
                                engine._close()
                    finally:
                        # Every session actor has stopped. Shielded and bounded: whatever
                        # cancelled the caller, the way out still runs, and ends in time.
                        with anyio.CancelScope(shield=True):
                            await _leave(store, delivery, background, mode, config.retain_every, retain_grace)
            finally:
                if recorder is not None:
                    recorder.close()
    except BaseExceptionGroup as group:
        failure = _failure(group, body_error)
        if failure is group:
            raise
    else:
        failure = body_error
    if failure is not None:
        raise failure  # outside the handler: the caller's error gets no engine group as its context


#: Seconds the engine's own store work may take on the way out of ``open_engine`` (retain
#: tails, lease release, the last commits), on top of ``retain_grace`` for the sink.
EXIT_STORE_SECONDS = 2.0
#: Seconds leaving ``open_engine`` takes at most beyond ``retain_grace``, whatever the database does:
#: the store work's share, then interrupting what still runs and closing the connections.
EXIT_DEADLINE_SECONDS = EXIT_STORE_SECONDS + INTERRUPT_SECONDS


async def _leave(
    store: Store,
    delivery: RetainDelivery | None,
    background: anyio.abc.TaskGroup,
    mode: RetainMode,
    retain_every: int,
    grace: float,
) -> None:
    """Leaving is a boundary for every session: hand on their tails, give the sink ``grace``, release the leases.

    The store work shares :data:`EXIT_STORE_SECONDS`; what does not fit (a
    locked or unreachable database) is left for the next start, which finds
    the tails unrecorded and the leases expired.
    """
    spent = 0.0

    async def within_budget(what: str, operation: Callable[[], Awaitable[object]]) -> None:
        nonlocal spent
        started = anyio.current_time()
        with anyio.move_on_after(max(EXIT_STORE_SECONDS - spent, 0.0)) as scope:
            try:
                await operation()
            except Exception as exc:
                log.warning("leaving the engine: %s failed (%s); it is done at the next start", what, exc)
        if scope.cancelled_caught:
            log.warning("leaving the engine: %s did not finish in time; it is done at the next start", what)
        spent += anyio.current_time() - started

    if delivery is not None:
        await within_budget(
            "recording the retain tails", lambda: store.enqueue_all_retains(mode, batch_size=retain_every)
        )
        await delivery.drain(grace)
    if delivery is not None:
        delivery.stop()  # no claim is taken after the release below (a claim already queued goes first)
    background.cancel_scope.cancel()
    await within_budget("releasing the leases", store.release_leases)
    await store.aclose(max(EXIT_STORE_SECONDS - spent, 0.0))


def _failure(group: BaseExceptionGroup, body_error: BaseException | None) -> BaseException:
    """What leaves ``open_engine`` when its task groups failed.

    Cancellation passes through unchanged; the caller's own error wins over
    the engine's; otherwise the engine's failure, as one :class:`MemEngineError`.
    """
    _, failed = group.split(anyio.get_cancelled_exc_class())
    if failed is None:
        return group if body_error is None else body_error
    errors = _leaves(failed)
    for error in errors:
        if not isinstance(error, Exception):
            return error  # KeyboardInterrupt, SystemExit: as they are
    for error in errors:
        log.error("the engine failed: %r", error, exc_info=error)
    if body_error is not None and not isinstance(body_error, anyio.get_cancelled_exc_class()):
        return body_error
    if len(errors) == 1 and isinstance(errors[0], MemEngineError):
        return errors[0]
    error = EngineFailedError(f"the engine stopped because of an internal error: {errors[0]!r}")
    error.__cause__ = failed
    return error


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    return [
        leaf
        for inner in group.exceptions
        for leaf in (_leaves(inner) if isinstance(inner, BaseExceptionGroup) else [inner])
    ]


def _check_tokenizer(tokenizer: Callable[[str], int]) -> None:
    """Count a short text at open, so a tokenizer that cannot work fails here, not at the first add."""
    try:
        checked(tokenizer)("memengine checks its tokenizer")
    except Exception as exc:
        raise TypeError(f"SessionConfig.tokenizer failed on a short text: {exc!r}") from exc


def _require_async_method(target: object, what: str, name: str, arguments: str) -> None:
    """Refuse, when the engine opens, an object whose method the engine awaits but which is not async."""
    method = getattr(target, name, None)
    if not callable(method):
        raise TypeError(f"{what} must have an `async def {name}(self, {arguments})` method")
    if (inspect.isfunction(method) or inspect.ismethod(method)) and not inspect.iscoroutinefunction(method):
        raise TypeError(
            f"{what}.{name} is a plain function; the engine awaits it: define it as "
            f"`async def {name}(self, {arguments})`"
        )


def _retain_mode(sink: object) -> RetainMode:
    if sink is None:
        return "append"
    _require_async_method(sink, "retain_sink", "retain", "batch")
    if getattr(sink, "forget", None) is not None:
        _require_async_method(sink, "retain_sink", "forget", "request")
    mode = getattr(sink, "mode", "append")
    if mode not in ("append", "replace"):
        raise ValueError(f"retain_sink.mode must be 'append' or 'replace', not {mode!r}")
    return cast(RetainMode, mode)
