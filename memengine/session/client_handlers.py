"""The handlers of a client's messages to a session: add, read, delete, clear, forget, close, retry.

Each runs in the session actor's task (actor.py maps messages to them), one
at a time; an add's handler submits the append and does not wait for its
commit, whose completion (``_appended``) answers the callers.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import anyio
import anyio.lowlevel

from ..context import handed_out
from ..episode import Episode
from ..errors import LeaseLostError, StoreError
from ..store.base import AppendResult
from .activation_state import ActivationState
from .add_batch import AddBatch
from .hand_on import NotHandled
from .large_entry import LargeEntry, is_large
from .lease import means_reload
from .messages import (
    AddEpisodes,
    ClearSession,
    CloseSession,
    DeleteEpisodes,
    EnterStored,
    ForgetSession,
    ReadContext,
    RetrySummary,
)
from .summary_results import set_aside_error

log = logging.getLogger("memengine.session")

#: The most episodes of an append the window measures while its commit runs (a larger one, after).
MEASURE_AHEAD = 16


class ClientHandlers(ActivationState):
    """What the session actor does for each client message."""

    async def _on_add(self, message: AddEpisodes) -> None:
        # The handler does not wait for the commit, so the actor goes on with
        # its mailbox; a second append waits for the first, whose seqs it follows.
        if self._append_in_flight or self._given_up is not None:  # (the usual add skips a coroutine)
            await self._settle_append()
        self._submit_add(message)

    def _submit_add(self, message: AddEpisodes) -> None:
        """Submit ``message``, and the adds queued right behind it, as one append (no append is in flight)."""
        # No await here: the adds taken out of the mailbox are owned by the append's completion.
        self._appends_submitted += 1
        batch = AddBatch.gather(message, self.mailbox, self._appends_submitted)
        counted = batch.counted
        if counted:
            self._window.expect(counted)  # large contents, counted by their callers off the event loop
        try:
            self._store.submit_append(
                self.session_id,
                self._lease.current(),
                self._last_seq + 1,
                batch.episodes,
                functools.partial(self._appended, batch),
                batch.metadata_json,
            )
        except Exception as exc:
            for joined in batch.messages[1:]:  # the first is failed by the caller, _handle
                self._fail(joined, exc)
            raise
        self._append_in_flight = True  # only once submitted: a refused submit leaves nothing in flight
        episodes = batch.episodes
        if len(episodes) <= MEASURE_AHEAD:
            # While the commit runs in the store's thread (it has started, if the store was idle), not
            # after it: the window's own work on these episodes is off the add's critical path.
            try:
                self._window.measure(episodes)
            except Exception:  # the append is submitted: nothing here may fail the add; it measures on entry
                self._window.forget_measured()

    def _appended(self, batch: AddBatch, results: AppendResult | None, error: BaseException | None) -> None:
        """Completion of an append, run by the store on the event loop right after its commit.

        It is this actor's code, run synchronously between two of the actor's
        own steps (all on one event loop), and no other append of this session
        is in flight; the callers are answered only now that their rows are stored.
        """
        self._append_in_flight = False
        self._settled()
        if error is not None or results is None:
            self._window.forget_measured()
            reload = means_reload(error)
            if reload:
                # Either way this activation's state may no longer be the store's: let it go,
                # before a handler waiting for this append runs on it.
                self._give_up(error)  # type: ignore[arg-type]
            for message in batch.messages:
                if reload and self._handing_on.keep_if_abandoned(message):
                    continue
                self._fail(message, error or StoreError("the append was not stored"))
            return
        if is_large(results):
            # Entered a slice at a time by the actor (large_entry.py): in flight until then.
            self._append_in_flight = True
            entry = LargeEntry(batch, results)
            if self.mailbox.put_if_open(EnterStored()):  # (it wakes the actor if it is idle)
                self._entering = entry
                return
            self._append_in_flight = False  # the activation has stopped: its window is no more
            entry.answer(self._answer)
            return
        new = [episode for episode, is_new in results if is_new]
        if new:
            self._window.append(new)
        else:
            self._window.forget_measured()
        # Stored: answer first (nothing below may leave a caller waiting), then the follow-ups.
        for message, own in batch.split(results):
            stored = tuple([episode for episode, _ in own])
            self._answer(message, handed_out(stored) if message.copies else stored)  # the window keeps its own
        self._entered(new)

    async def _enter_stored(self) -> None:
        """Enter a large append's episodes into the window, a slice at a time; then answer its callers."""
        entry = self._entering
        if entry is None:
            return
        try:
            for _ in entry.slices(self._window):
                await anyio.lowlevel.checkpoint()  # the engine's other tasks run between two slices
        except Exception as exc:
            # (Your tokenizer raising, say.) The window is half entered: let the activation go; the episodes
            # are stored, and its callers are answered as it stops (actor.py, _stop), a new one loads them.
            log.error("session %r: entering a large add into the window failed: %r", self.session_id, exc)
            self._append_in_flight = False
            self._settled()
            self._give_up(exc)
            return
        self._entering = None
        self._append_in_flight = False
        self._settled()
        entry.answer(self._answer)
        self._entered(entry.new)

    def _settled(self) -> None:
        settled, self._append_settled = self._append_settled, None
        if settled is not None:
            settled.set()

    def _entered(self, new: list[Episode]) -> None:
        """The follow-ups of episodes now in the window: the eviction boundary, the summary, the retain batch."""
        window = self._window
        if new:
            self._last_seq = new[-1].seq  # type: ignore[assignment]
            if window.evicted:
                self._keep_boundary()
            if window.evicted and not self._summary.busy:  # (what dispatch checks first, asked here per add)
                self._dispatch_summary()
            if self._retain is not None:
                self._retain.if_due()

    async def _on_read(self, message: ReadContext) -> None:
        if message.reply.abandoned:
            return  # the caller gave up before its turn: a read changes nothing
        if self._append_in_flight and message.passed_by == self._appends_submitted:
            # The append in flight took adds queued behind this read (add_batch.py): none of them is
            # acknowledged, so the read is answered now, as of before them, not one commit later.
            if self._given_up is not None:
                raise NotHandled
        else:
            # After the append in flight, if any: a stream of reads answered from memory never keeps the
            # store's thread from committing (it needs the GIL too); each read waits for at most one commit.
            await self._settle_append()
        await self._lease.ensure_valid()  # memory may be stale if another process took the session over
        if self._given_up is not None:  # (the append in flight, not waited for above, may have failed meanwhile)
            raise NotHandled
        evicted_through = self._window.evicted_through
        # What a waiting read waits to see summarized: the evicted episodes, and a segmented session's holes.
        holes = self._summary.holes
        wait_through = max(evicted_through or 0, holes[-1][1]) if holes else evicted_through
        if message.wait_for_summary and wait_through is not None and self._summary.set_aside is not None:
            self._fail(message, set_aside_error(self.session_id, self._summary.set_aside))  # nothing to wait for
        elif message.wait_for_summary and wait_through is not None:
            self._wait_for_summary(message, wait_through)
        else:
            context = self._context()
            omitted = context.omitted
            # Over the ceiling, a segmented summary's holes were said left out rather than shown (store/segments.py).
            holes_left_out = bool(holes) and context.summary is not self._summary.text
            waits_for = None
            if omitted is not None and evicted_through is not None:
                waits_for = min(omitted.last_seq, evicted_through)
            if holes_left_out:
                waits_for = max(waits_for or 0, holes[-1][1])
            if message.wait_for_ceiling and waits_for is not None and self._summary.set_aside is None:
                # Over the ceiling while the summarizer is behind: wait for the summary of the episodes left
                # out (the caller bounds the wait, then reads again without it).
                self._wait_for_summary(message, waits_for)
            else:
                self._answer(message, context)

    def _wait_for_summary(self, message: ReadContext, through_seq: int) -> None:
        """Keep the read until episodes up to ``through_seq`` are summarized; a summary made meanwhile commits now.

        (A summary waiting to ride along with the next write goes at once; one still being made is
        committed as soon as it is, since the child sees a read waiting: see summarizer/actor.py.)
        """
        self._waiting.add(message, through_seq)
        self._store.hurry_riders()

    async def _on_delete(self, message: DeleteEpisodes) -> None:
        await self._settle_append()
        deleted, snapshot = await self._store.delete_episodes(self.session_id, self._lease.current(), message.seqs)
        if deleted:
            await self._count_large(snapshot)  # what a deleted summary covered is raw again
            self._apply(snapshot)
            if self._retain is not None:
                self._retain.removed()
            await self._erase_recorded(message.seqs)
        self._answer(message, deleted)

    async def _on_clear(self, message: ClearSession) -> None:
        await self._settle_append()
        self._apply(await self._store.clear_session(self.session_id, self._lease.current()))
        if self._retain is not None:
            self._retain.removed()
        await self._erase_recorded(None)
        self._answer(message, None)

    async def _erase_recorded(self, seqs: Sequence[int] | None) -> None:
        """The erased episodes leave the recording too (session/recording.py), before the answer is recorded."""
        if self._recorder is not None:
            await self._recorder.erase(self.session_id, seqs)

    async def _on_forget(self, message: ForgetSession) -> None:
        await self._settle_append()
        erased = await self._store.erase_session(self.session_id, self._lease.current())
        if self._retain is not None:
            self._retain.removed()  # its last step may have recorded a forget for the sink: delivered now
        await self._erase_recorded(None)
        if erased.traces_left:
            # Its row and lease wait for the retain sink (store/erasure.py): an empty session, let go as at close.
            self._apply(await self._store.load_session(self.session_id))
            self._close_requested = True
        else:
            # Nothing of the session is left, its lease included: this activation ends without a retain flush
            # or a lease release, and any message after this one goes to a new activation (a new session).
            self._given_up = LeaseLostError(f"session {self.session_id!r} was forgotten")
        self._answer(message, erased)

    async def _on_close(self, message: CloseSession) -> None:
        # Every earlier message of this session has been handled. Close is a
        # boundary: the partial retain batch goes to the outbox (not to the
        # sink: close never waits for it). Once the summarizer is idle, the
        # activation can go, its state being durable.
        await self._settle_append()
        if self._retain is not None and self._retain.has_unretained():
            await self._retain.flush()
        self._close_requested = True
        self._answer(message, None)

    async def _on_retry_summary(self, message: RetrySummary) -> None:
        await self._settle_append()
        message.reply.set(await self._summary_results.retry())  # an operator's call: not recorded (see RetrySummary)

    async def _settle_append(self) -> None:
        """Wait for this session's append in flight; hand the message on if the session was given up meanwhile."""
        while self._append_in_flight:
            if self._entering is not None:
                await self._enter_stored()  # stored already: the rest is this actor's own work
                continue
            if self._append_settled is None:
                self._append_settled = anyio.Event()
            await self._append_settled.wait()
        if self._given_up is not None:
            raise NotHandled
