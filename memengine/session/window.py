"""Which episodes fit the raw window: a pure function, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from ..episode import Episode


def window_start(raw: Sequence[Episode], max_episodes: int, max_chars: int) -> int:
    """Index of the first episode of the window.

    The window is the longest run of newest episodes holding at most
    ``max_episodes`` episodes and ``max_chars`` characters; ``raw[:index]``
    has been evicted. Runs in time proportional to the window, not to ``raw``.
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
