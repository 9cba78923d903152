"""Standard output whose reader may go away (``memengine demo | head -3``) without cutting the command short.

A command's output is a view of its work, not the work itself: when the pipe
closes, the demo must still finish storing and summarizing its turns rather
than stop halfway (a session cleared and half refilled). So a closed pipe
makes the rest of the output go to ``os.devnull`` (as the Python docs
recommend in the signal module's "Note on SIGPIPE", which also spares the
interpreter a second error when it flushes stdout at exit), and the command
goes on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class _OutputWithoutReader:
    """Wraps stdout: a write or flush that finds the pipe closed sends this and later output to ``os.devnull``."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def _reader_left(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def reader_may_leave() -> Iterator[None]:
    """For the block's duration, a closed stdout pipe no longer raises :class:`BrokenPipeError` in ``print``."""
    original = sys.stdout
    if original is None:  # pythonw, or stdout closed by the caller
        yield
        return
    sys.stdout = _OutputWithoutReader(original)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = original
        try:
            original.flush()
        except BrokenPipeError:
            _OutputWithoutReader(original)._reader_left()
