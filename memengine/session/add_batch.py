"""Adds that wait in a row go to the store as one append: one commit, each caller answered with its own part.

A session handles its messages in order, and an append waits for the one
before it (its seqs follow). Under many writers on one session, the adds that
queued behind the append in flight would each wait for a commit of their own,
so add latency grew with the number of writers. Instead, when the actor takes
an add, the adds right behind it in the mailbox join it, up to a bound: one
transaction stores them all, in mailbox order, and each caller gets exactly the
episodes it sent (with their seqs) once that transaction has committed.

Only adds that are next in the mailbox join: a read, delete, clear or close
between two adds stays between them, so no message overtakes another and a read
is never starved by a stream of adds.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from ..actor.mailbox import Mailbox
from ..episode import Episode
from ..store.base import AppendResult
from .messages import AddEpisodes, SessionMessage

#: The most episodes one batch of adds takes (a single larger add goes alone).
MAX_BATCH_EPISODES = 500
#: The most characters of content one batch of adds takes (a single larger add goes alone).
MAX_BATCH_CHARS = 1_000_000


@attrs.define
class AddBatch:
    """Adds stored by one append, in mailbox order."""

    messages: list[AddEpisodes]

    @classmethod
    def gather(cls, first: AddEpisodes, mailbox: Mailbox[SessionMessage]) -> AddBatch:
        """``first``, and the adds right behind it in ``mailbox`` (taken out of it) while within the bounds."""
        messages = [first]
        episodes = len(first.episodes)
        chars = _chars(first)
        while isinstance(following := mailbox.peek(), AddEpisodes):
            episodes += len(following.episodes)
            chars += _chars(following)
            if episodes > MAX_BATCH_EPISODES or chars > MAX_BATCH_CHARS:
                break
            mailbox.take()
            messages.append(following)
        return cls(messages)

    @property
    def episodes(self) -> tuple[Episode, ...]:
        return tuple(episode for message in self.messages for episode in message.episodes)

    def split(self, results: AppendResult) -> Iterator[tuple[AddEpisodes, AppendResult]]:
        """Each add with the results of its own episodes."""
        start = 0
        for message in self.messages:
            end = start + len(message.episodes)
            yield message, results[start:end]
            start = end
        assert start == len(results), (start, len(results))


def _chars(message: AddEpisodes) -> int:
    return sum(len(episode.content) for episode in message.episodes)
