"""Privacy operations: forgetting a scope (through each session's own activation) and exporting it."""

from __future__ import annotations

import logging

from ..actor.reply import Reply
from ..errors import EngineClosedError
from ..privacy import forget as forgetting
from ..privacy.export import ExportStream
from ..privacy.report import ForgetReport
from ..scope import Scope
from ..session.messages import ForgetSession
from ..store.base import Erased
from .activations import Activations

log = logging.getLogger("memengine")


class PrivacyOperations(Activations):
    """``forget`` and ``export`` of one session, one tenant or a prefix."""

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
