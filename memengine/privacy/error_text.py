"""What memengine says of a summarizer's or a retain sink's error: its type in logs, its text where erasure reaches.

A summarizer or a sink may quote the episodes it was handed in its error's
message (a model refusing "my passport number X1234567"). A log line cannot
be taken back by a later delete, clear or forget, so memengine's log lines
name such an error by its type only. Its text is kept with its batch in the
store (``retain_outbox.last_error``, ``summaries_set_aside.error``: shown by
``list_set_aside`` and ``memengine set-aside list``), which a delete, clear or
forget of the batch's session erases in its own transaction. The text and the
traceback also go to the ``memengine.content`` logger at DEBUG, which is off
unless that logger is given a level of DEBUG itself: like OpenTelemetry's
content capture, turn it on only where logs may hold users' data.
"""

from __future__ import annotations

import logging

#: The logger of what may quote users' content: silent unless set to DEBUG explicitly.
CONTENT_LOG = logging.getLogger("memengine.content")
CONTENT_LOG.setLevel(logging.INFO)


def error_label(error: BaseException | None) -> str:
    """How a log line names a summarizer's or sink's error: its type (its text may quote episodes)."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def error_text(error: BaseException | None) -> str:
    """The error's own text on one line: for the store, where erasure reaches it, never for a log line."""
    return " ".join(repr(error).split())


def log_content(what: str, *args: object, error: BaseException | None = None) -> None:
    """``what`` with the error's text and traceback, to :data:`CONTENT_LOG` at DEBUG (off by default)."""
    if CONTENT_LOG.isEnabledFor(logging.DEBUG):
        CONTENT_LOG.debug(what + ": %s", *args, error_text(error), exc_info=error)
