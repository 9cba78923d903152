"""How the SQLite store connects: the busy timeout first, then WAL mode.

Every connection the store opens for writing and reading goes through
:func:`connect`; a read-only opening has its own (readonly.py).
"""

from __future__ import annotations

import sqlite3
import time

#: Seconds a write waits for another process's write lock before it fails (default of ``busy_timeout``).
BUSY_TIMEOUT = 10.0


def is_busy(error: sqlite3.OperationalError) -> bool:
    message = str(error)
    return "locked" in message or "busy" in message


def connect(path: str, busy_timeout: float = BUSY_TIMEOUT) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    # First, so that every later statement waits for another process's lock rather than failing.
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    if path != ":memory:":
        # Switching a new file to WAL can meet another process doing the same; SQLite then
        # reports "locked" at once, without the busy timeout: wait for it here instead.
        deadline = time.monotonic() + 10.0
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise
                time.sleep(0.01)
    return conn
