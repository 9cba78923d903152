"""What a forget erased: :class:`ForgetReport`.

A value of its own, apart from forgetting itself (forget.py): the error that
carries a report (:class:`~memengine.errors.ForgetIncompleteError`) names it
without depending on how forgetting is done.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class ForgetReport:
    """What ``Engine.forget`` erased (or, with ``dry_run``, would erase): counts over every session of the scope.

    ``waiting_for_sink``: sessions erased whose row and lease (no content) stay until the retain sink has
    what their clear left for it; a later ``forget`` removes them.
    """

    scope: str
    sessions: int
    episodes: int
    summaries: int
    outbox_batches: int
    dry_run: bool = False
    waiting_for_sink: int = 0
