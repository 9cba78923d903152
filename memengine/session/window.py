"""The raw window: which live episodes are shown raw, and which await a summary.

Pure state, no I/O. ``raw`` holds the live episodes after the summary, in
order; the first ``evicted`` of them have left the window (it holds at most
``max_episodes`` episodes and ``max_chars`` characters) and wait for their
summary. Appending costs time proportional to what it evicts, not to the
window or the history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..episode import Episode


def window_start(raw: Sequence[Episode], max_episodes: int, max_chars: int) -> int:
    """Index of the first episode of the window: ``raw[:index]`` is evicted.

    The window is the longest run of newest episodes holding at most
    ``max_episodes`` episodes and ``max_chars`` characters.
    """
    count = 0
    chars = 0
    index = len(raw)
    while index > 0 and count < max_episodes:
        length = len(raw[index - 1].content)
        if chars + length > max_chars:
            break
        count += 1
        chars += length
        index -= 1
    return index


class RawWindow:
    """The live episodes after the summary, split into evicted and windowed."""

    __slots__ = ("_max_chars", "_max_episodes", "_window_chars", "evicted", "raw")

    def __init__(self, max_episodes: int, max_chars: int) -> None:
        self._max_episodes = max_episodes
        self._max_chars = max_chars
        self.raw: list[Episode] = []
        self.evicted = 0
        self._window_chars = 0

    def reset(self, episodes: Iterable[Episode]) -> None:
        """Start over from the given live episodes (activation, clear, delete)."""
        self.raw = list(episodes)
        self.evicted = window_start(self.raw, self._max_episodes, self._max_chars)
        self._window_chars = sum(len(episode.content) for episode in self.raw[self.evicted :])

    def append(self, episodes: Iterable[Episode]) -> None:
        """Add new episodes at the end, evicting the oldest ones that no longer fit."""
        raw = self.raw
        for episode in episodes:
            raw.append(episode)
            self._window_chars += len(episode.content)
        while len(raw) - self.evicted > self._max_episodes or self._window_chars > self._max_chars:
            self._window_chars -= len(raw[self.evicted].content)
            self.evicted += 1

    def drop_through(self, seq: int) -> int:
        """Forget the episodes now covered by a summary through ``seq``; return how many."""
        covered = 0
        raw = self.raw
        while covered < self.evicted and raw[covered].seq <= seq:  # type: ignore[operator]
            covered += 1
        del raw[:covered]
        self.evicted -= covered
        return covered

    @property
    def pending(self) -> list[Episode]:
        """Evicted episodes waiting for their summary, oldest first."""
        return self.raw[: self.evicted]

    @property
    def evicted_through(self) -> int | None:
        """Seq of the newest evicted episode, or ``None`` when none waits."""
        return self.raw[self.evicted - 1].seq if self.evicted else None
