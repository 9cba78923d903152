"""The PostgreSQL backend (psycopg 3); the same module names as the SQLite backend's.

``store.py`` the store (reconnecting, appending, recall), ``connection.py`` how it
connects, ``schema.py`` its tables and migrations, ``recall.py`` full-text
recall, ``readonly.py`` opening a store only to read it, ``renewals.py`` its
side work (lease renewals on a connection of their own), ``replies.py``
connections that stop waiting for a silent server. Only :mod:`memengine.store`
imports it, and only for a ``postgresql://`` URL (psycopg is optional).
"""

from .store import PostgresStore, open_postgres_store

__all__ = ["PostgresStore", "open_postgres_store"]
