"""Adds that wait in a row go to the store as one append: one commit, each caller answered with its own part.

A session handles its messages in order, and an append waits for the one
before it (its seqs follow). Under many writers on one session, the adds that
queued behind the append in flight would each wait for a commit of their own,
so add latency grew with the number of writers. Instead, when the actor takes
an add, the adds right behind it in the mailbox join it, up to a bound: one
transaction stores them all, in mailbox order, and each caller gets exactly the
episodes it sent (with their seqs) once that transaction has committed.

Adds join across the reads queued between them: a read is answered from
memory, which holds only acknowledged adds, so a read answered while the batch
is in flight sees none of it, whether it was queued before or after those adds
(each of them was still unacknowledged). The reads stay in the mailbox and are
answered at their turn, right after the batch was submitted, without waiting
for its commit (client_handlers.py, ``_on_read``): a read never waits behind
an add that arrived after it, nor for more than the one append that was in
flight when it was taken. A delete, clear or close ends the batch: an
add queued after one is never stored before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs

from ..actor.mailbox import Ahead, Mailbox
from ..episode import Episode
from ..store.base import AppendResult
from .messages import AddEpisodes, ReadContext, SessionMessage

#: The most episodes one batch of adds takes (a single larger add goes alone).
MAX_BATCH_EPISODES = 500
#: The most characters of content one batch of adds takes (a single larger add goes alone).
MAX_BATCH_CHARS = 1_000_000
#: The most queued messages looked at for adds to join a batch.
MAX_LOOK_AHEAD = 1000


@attrs.define
class AddBatch:
    """Adds stored by one append, in mailbox order."""

    messages: list[AddEpisodes]

    @classmethod
    def gather(cls, first: AddEpisodes, mailbox: Mailbox[SessionMessage], number: int) -> AddBatch:
        """``first``, and the adds queued behind it (taken out of the mailbox) while within the bounds.

        Reads are passed over (they stay where they are, marked as passed by
        append ``number``); any other message ends the batch.
        """
        if mailbox.empty:
            return cls([first])  # the usual case with one writer per session: nothing to weigh
        episodes = len(first.episodes)
        chars = _chars(first)

        def decide(message: SessionMessage) -> Ahead:
            nonlocal episodes, chars
            if isinstance(message, ReadContext):
                message.passed_by = number
                return Ahead.PASS
            if not isinstance(message, AddEpisodes):
                return Ahead.STOP
            episodes += len(message.episodes)
            chars += _chars(message)
            return Ahead.STOP if episodes > MAX_BATCH_EPISODES or chars > MAX_BATCH_CHARS else Ahead.TAKE

        return cls([first, *mailbox.take_ahead(decide, MAX_LOOK_AHEAD)])  # type: ignore[list-item]

    @property
    def counted(self) -> dict[str, int]:
        """Token counts of large contents, made by the callers (see ``AddEpisodes.counted``)."""
        if len(self.messages) == 1:
            return self.messages[0].counted
        return {text: tokens for message in self.messages for text, tokens in message.counted.items()}

    @property
    def metadata_json(self) -> tuple[str | None, ...] | None:
        """Each episode's metadata JSON where its caller made it (``AddEpisodes.metadata_json``); None if none did."""
        if len(self.messages) == 1:
            return self.messages[0].metadata_json
        if all(message.metadata_json is None for message in self.messages):
            return None
        return tuple(
            encoded
            for message in self.messages
            for encoded in (message.metadata_json or (None,) * len(message.episodes))
        )

    @property
    def episodes(self) -> tuple[Episode, ...]:
        if len(self.messages) == 1:
            return self.messages[0].episodes
        return tuple(episode for message in self.messages for episode in message.episodes)

    def split(self, results: AppendResult) -> Iterable[tuple[AddEpisodes, AppendResult]]:
        """Each add with the results of its own episodes."""
        if len(self.messages) == 1:
            assert len(self.messages[0].episodes) == len(results), (len(self.messages[0].episodes), len(results))
            return ((self.messages[0], results),)
        return self._split(results)

    def _split(self, results: AppendResult) -> Iterator[tuple[AddEpisodes, AppendResult]]:
        start = 0
        for message in self.messages:
            end = start + len(message.episodes)
            yield message, results[start:end]
            start = end
        assert start == len(results), (start, len(results))


def _chars(message: AddEpisodes) -> int:
    return sum(len(episode.content) for episode in message.episodes)
