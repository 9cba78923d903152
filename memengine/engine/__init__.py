"""The engine: owns the store, the task group, and the session activations.

:class:`Engine` is a composition of parts of one concern each, in this
package: core.py (what they share), activations.py (the activation table),
owner_watch.py (liveness, reaping, orphans), privacy.py (forget, export),
set_aside.py (work set aside), figures.py (stats and gauges). This module
holds the class that puts them together, and :func:`open_engine`, which
wires the store, the retain delivery and the background tasks.
"""

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

from ..config import SessionConfig
from ..errors import EngineClosedError, EngineFailedError, MemEngineError
from ..limits import MAX_OWNER_BYTES, MAX_RECALL_LIMIT, require_int, require_text
from ..retain.batch import RetainMode, RetainSink
from ..retain.delivery import RetainDelivery
from ..scope import Scope
from ..session.actor import SessionServices
from ..session.recording import MessageRecorder
from ..session.retain_flush import RetainPlan
from ..store.base import Recalled, Store
from ..store.committer import INTERRUPT_SECONDS
from ..store.open import open_store
from ..summarizer.extractive import ExtractiveSummarizer
from ..summarizer.protocol import Summarizer
from ..telemetry import Telemetry, capture_content_default
from ..tokens import checked
from .figures import EngineFigures
from .owner_watch import OwnerWatch
from .privacy import PrivacyOperations
from .set_aside import SetAsideOperations

log = logging.getLogger("memengine")


class Engine(PrivacyOperations, SetAsideOperations, EngineFigures, OwnerWatch):
    """A running memory engine. Get one from :func:`open_engine`.

    Sessions are virtual actors: one is activated (its state recovered from the
    store) by the first message sent to it, and passivated after it has been
    idle for ``SessionConfig.passivate_after`` seconds or closed.

    Every call must come from the event loop that opened the engine: a call
    from another (another thread's, ``Runner.run_sync``'s) raises
    :class:`ForeignLoopError` before doing anything. Run the engine behind a
    portal to call it from other threads (see the error).
    """

    def __repr__(self) -> str:
        active = len(self._actors)
        state = "closed, " if self._closed else ""
        return (
            f"<Engine {state}store={self._services.store!r} summarizer={self._services.summarizer!r} "
            f"{active} active session{'s' if active != 1 else ''}>"
        )

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
    :mod:`memengine.store.postgres.connection`).

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
