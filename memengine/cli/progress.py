"""Progress of long command-line work (``replay``, ``reindex``), on stderr, never on stdout.

Shown when stderr is a terminal, or when asked for with ``--progress`` (and
never with ``--no-progress``): a line at most every second, with the count so
far, the rate and the time spent, then one closing line. stdout (what scripts
read, JSON included) carries exactly what it carries without progress.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TextIO

import anyio

#: Seconds between two progress lines, at least.
EVERY = 1.0


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on stderr (default: when stderr is a terminal)",
    )


def stream_for(asked: bool | None) -> TextIO | None:
    """Where progress goes for ``--progress``/``--no-progress``/neither: stderr, or nowhere (None)."""
    if asked is None:
        asked = sys.stderr.isatty()
    return sys.stderr if asked else None


class Progress:
    """Counts work done and says so on ``stream`` (None: says nothing), at most every ``every`` seconds."""

    def __init__(
        self,
        what: str,
        unit: str,
        stream: TextIO | None,
        *,
        total: int | None = None,
        every: float = EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._unit = unit
        self._stream = stream
        self._total = total
        self._every = every
        self._clock = clock
        self._started = self._last_line = clock()
        self.done = 0

    def advance(self, done: int) -> None:
        """``done`` units are done so far; a line if the last one is ``every`` seconds old."""
        self.done = done
        if self._stream is not None and self._clock() - self._last_line >= self._every:
            if self.done == 0 and self._total is None:
                self._say(f"{self._elapsed():.0f} s so far")  # nothing counted yet: say it still works
            else:
                self._say(f"{self._count()}, {self._rate()}, {self._elapsed():.0f} s")

    def tick(self) -> None:
        """Time passes with no count to tell (one long statement): a line if the last one is old enough."""
        self.advance(self.done)

    async def ticking(self) -> None:
        """Call :meth:`tick` every ``every`` seconds, until cancelled."""
        while True:
            await anyio.sleep(self._every)
            self.tick()

    def finish(self, done: int | None = None) -> None:
        """The closing line."""
        if done is not None:
            self.done = done
        if self._stream is not None:
            self._say(f"{self._count()} in {self._elapsed():.1f} s ({self._rate()})")

    def _count(self) -> str:
        if self._total is None:
            return f"{self.done} {self._unit}"
        share = f" ({100 * self.done // self._total}%)" if self._total else ""
        return f"{self.done}/{self._total} {self._unit}{share}"

    def _rate(self) -> str:
        elapsed = self._elapsed()
        return f"{self.done / elapsed:.0f}/s" if elapsed > 0 else "-/s"

    def _elapsed(self) -> float:
        return self._clock() - self._started

    def _say(self, text: str) -> None:
        assert self._stream is not None
        self._last_line = self._clock()
        print(f"{self._what}: {text}", file=self._stream, flush=True)
