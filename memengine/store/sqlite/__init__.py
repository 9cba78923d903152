"""The SQLite backend: one file, WAL mode; the same module names as the PostgreSQL backend's.

``store.py`` the store (connecting, appending, recall), ``connection.py`` how it
connects, ``schema.py`` its tables and migrations, ``recall.py`` FTS5 recall,
``readonly.py`` opening a store only to read it, ``checkpoints.py`` its side
work (WAL checkpoints beside the commits). Only :mod:`memengine.store` imports it.
"""

from .store import SQLiteStore, open_sqlite_store

__all__ = ["SQLiteStore", "open_sqlite_store"]
