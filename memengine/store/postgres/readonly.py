"""Opening an existing PostgreSQL store read-only, for commands that only look (``memengine inspect``).

Every connection runs with ``default_transaction_read_only``, so the server
itself refuses a write; the schema is checked, never created or migrated.
"""

from __future__ import annotations

from typing import Any

from ...errors import StoreError
from ..schema_window import check_readable_version
from .schema import SCHEMA_VERSION, read_state


def check_readable(conn: Any) -> None:
    """Refuse (:class:`StoreError`) a schema this memengine cannot read as it is: without tables, or behind."""
    state = read_state(conn)
    if state.version == 0:
        (schema,) = conn.execute("SELECT current_schema()").fetchone()
        raise StoreError(
            f"schema {schema} has no memengine tables; name the schema that holds them in the URL "
            "(?options=-csearch_path%3D<schema>) (this command never creates them)"
        )
    check_readable_version(
        state.version,
        lambda: state.compatible_from,
        SCHEMA_VERSION,
        f"the schema is at version {state.version} and this memengine reads version {SCHEMA_VERSION}: "
        "run `memengine migrate URL` first (it only adds)",
    )
