"""Where session state lives: the store interface and its backends."""

from .base import SessionSnapshot, Store
from .sqlite import SQLiteStore, open_sqlite_store

__all__ = ["SQLiteStore", "SessionSnapshot", "Store", "open_sqlite_store"]
