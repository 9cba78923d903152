"""What :meth:`Engine.stats` reports: the figures memengine's OpenTelemetry gauges show too."""

from __future__ import annotations

import attrs


@attrs.frozen
class EngineStats:
    """A snapshot of one engine, read by :meth:`Engine.stats`.

    ``mailbox_depth`` is the sum over active sessions of the messages waiting
    in their mailboxes (client calls and the engine's own traffic, such as
    summary acknowledgements); ``mailbox_depth_max`` the largest of them.
    ``episodes_waiting_for_summary`` counts, over active sessions, the evicted
    episodes no stored summary covers yet. The outbox figures are the store's
    (every process on it): batches not yet delivered to the retain sink, and
    the age in seconds of the oldest (None when empty). ``summaries_set_aside``
    and ``retains_set_aside`` are the store's too: summary batches (one per
    session at most) and retain batches set aside after too many failed rounds,
    waiting for :meth:`Engine.retry_set_aside` (set-aside retain batches count in
    ``outbox_depth`` as well). ``summary_holes`` counts, over active sessions
    with segment summaries, the ranges of summarized episodes whose summary a
    delete erased and that are being summarized again (``Context.resummarizing``;
    their live episodes are shown as they were said meanwhile).
    """

    active_sessions: int
    mailbox_depth: int
    mailbox_depth_max: int
    episodes_waiting_for_summary: int
    outbox_depth: int
    oldest_undelivered_age: float | None
    summaries_set_aside: int = 0
    retains_set_aside: int = 0
    summary_holes: int = 0
