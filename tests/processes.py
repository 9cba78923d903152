"""Reading the rest of a child process's output after reading some of it line by line.

``Popen.communicate()`` reads the pipes' file descriptors directly, not through
``process.stdout``: lines a ``readline()`` has already pulled into the text
wrapper's buffer are never returned. A line printed right after the one a test
waited for (a sink call logged just after an answer) then went missing or not,
depending on whether both came in one read: the timing between the processes
decided. :func:`communicate` reads through the same file objects instead.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import IO


class _Rest:
    """Everything left in one stream, read to its end by a thread of its own."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.text: str | None = None if stream is None else ""
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        if stream is not None:
            self.thread.start()

    def _read(self, stream: IO[str]) -> None:
        try:
            self.text = stream.read()
        finally:
            stream.close()


def communicate(process: subprocess.Popen[str], timeout: float | None = None) -> tuple[str, str]:
    """``process.communicate(timeout)``, keeping what earlier reads of ``process.stdout`` left buffered.

    Raises :class:`subprocess.TimeoutExpired` as ``communicate`` does; calling it
    again (after a kill, say) goes on where the first call stopped.
    """
    rests: list[_Rest] | None = getattr(process, "_memengine_rests", None)
    if rests is None:
        rests = [_Rest(process.stdout), _Rest(process.stderr)]
        process._memengine_rests = rests  # type: ignore[attr-defined]
    process.wait(timeout)
    for rest in rests:
        if rest.text is None:
            continue  # not a pipe
        rest.thread.join(timeout)
        if rest.thread.is_alive():  # a grandchild still holds the pipe open
            raise subprocess.TimeoutExpired(process.args, timeout or 0)
    out, err = (rest.text for rest in rests)
    return out or "", err or ""


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The next line of ``process.stdout`` (``""`` once it has ended), waiting at most ``timeout`` seconds.

    ``process.stdout.readline()`` alone waits for ever for a child that neither prints nor exits: the test
    then hangs instead of failing. The line is read in a thread of its own; past the deadline this raises
    :class:`subprocess.TimeoutExpired`, and the caller kills the process (its end lets that read return).
    Lines read here are read through ``process.stdout``, so :func:`communicate` still returns the rest
    (after a timeout, the line the abandoned read gets, if any, is not among it: the test is failing then).
    """
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise subprocess.TimeoutExpired(process.args, timeout)
    return got[0] if got else ""


def lines(process: subprocess.Popen[str], timeout: float) -> Iterator[str]:
    """``process.stdout``'s lines as they come, until it ends or ``timeout`` seconds have passed.

    A process still silent at the deadline is killed (so that reading its stderr for a message ends),
    and no more lines come: a test waiting for a line it never gets fails instead of hanging.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = read_line(process, max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            return
        if not line:
            return
        yield line
