"""An episode as a row of ``episodes`` and back (journal.py, segments.py, scoped.py read it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from ..episode import Episode, stored_episode

EPISODE_COLUMNS = "seq, id, role, content, created_at, metadata"


def episode_from_row(row: Sequence) -> Episode:
    seq, episode_id, role, content, created_at, metadata = row
    return stored_episode(role, content, episode_id, datetime.fromisoformat(created_at), json.loads(metadata), seq)
