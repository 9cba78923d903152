"""A large append's episodes enter the window a slice at a time: the event loop is never held for long.

An append's completion runs on the event loop right after its commit
(store/committer.py). Entering 100,000 episodes into the window and copying
them for their callers held the loop there for 0.8 s, and every other session
of the engine (its adds, its reads, its lease renewals) waited. An append of
more than :data:`ENTER_SLICE` episodes is entered by the actor instead,
:data:`ENTER_SLICE` episodes at a time with a checkpoint in between (its own
task, so the store's other completions go on meanwhile). Until the last slice
the append counts as in flight: the session's next add, read, delete or
passivation waits for it exactly as it waits for a commit. Its callers are
answered at the end, as after a small append; if the activation stops first
(the engine closing), they are answered then: their episodes are stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..context import handed_out
from ..episode import Episode
from ..store.base import AppendResult
from .add_batch import AddBatch
from .messages import AddEpisodes
from .window import RawWindow

#: Episodes entered into the window (or copied for their callers) between two checkpoints: a few milliseconds.
ENTER_SLICE = 2_000


def is_large(results: AppendResult) -> bool:
    """Whether entering ``results`` at once would hold the event loop for long (more than a slice)."""
    return len(results) > ENTER_SLICE


class LargeEntry:
    """One stored append on its way into the window and back to its callers (see the module's docstring)."""

    def __init__(self, batch: AddBatch, results: AppendResult) -> None:
        self._batch = batch
        self._results = results
        #: The episodes the append stored (those already stored, sent again, are not new).
        self.new: list[Episode] = [episode for episode, is_new in results if is_new]
        self._answers: list[tuple[AddEpisodes, tuple[Episode, ...]]] = []

    def slices(self, window: RawWindow) -> Iterator[None]:
        """Enter the new episodes, then copy each caller's own: one slice per step."""
        new = self.new
        for start in range(0, len(new), ENTER_SLICE):
            window.append(new[start : start + ENTER_SLICE], last=start + ENTER_SLICE >= len(new))
            yield
        for message, own in self._batch.split(self._results):
            if not message.copies:  # an adapter's add: answered with the session's own (see AddEpisodes)
                self._answers.append((message, tuple([episode for episode, _ in own])))
                continue
            copies: list[Episode] = []
            for start in range(0, len(own), ENTER_SLICE):
                copies += handed_out(tuple([episode for episode, _ in own[start : start + ENTER_SLICE]]))
                yield
            self._answers.append((message, tuple(copies)))

    def answer(self, answer: Callable[[AddEpisodes, Any], None]) -> None:
        """Answer the callers, each with copies of its own episodes (those not copied yet are copied now)."""
        done = {id(message) for message, _ in self._answers}
        for message, own in self._batch.split(self._results):
            if id(message) not in done:
                self._answers.append((message, handed_out(tuple([episode for episode, _ in own]))))
        answers, self._answers = self._answers, []
        for message, copies in answers:
            answer(message, copies)
