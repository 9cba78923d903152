"""The compatibility window: which code may run against a schema newer than itself.

Migrations only add, but not every addition leaves older code correct (a new
table that older code would not clean up, a column whose meaning older code
would ignore). Each migration therefore declares whether it is *additive*:
code written before it keeps working, unchanged, against the schema it
leaves. A database records, beside its version, the lowest code version that
may run against it (``compatible_from``), which reaches back over the
additive migrations at its top. A replica whose schema version is at least
``compatible_from`` runs against the newer database; any other refuses to.

It is stored as a distance, ``compatible_back = version - compatible_from``,
so that a version changed without it (by hand, or by a tool that knows
nothing of the window) falls back to the strict rule: only code of exactly
that version.
So during a rolling upgrade across additive migrations, replicas not yet
upgraded keep restarting, and rolling back stays possible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..errors import StoreError


def compatible_from(additive: Sequence[bool], version: int) -> int:
    """The lowest code version that may run against schema ``version``.

    ``additive[i]`` says whether migration ``i + 1`` (the one that makes
    version ``i + 1``) leaves code of version ``i`` working.
    """
    lowest = version
    while lowest > 0 and additive[lowest - 1]:
        lowest -= 1
    return lowest


def check_newer(version: int, lowest: int | None, understood: int) -> None:
    """Refuse a database at ``version`` (newer than ``understood``) unless its window reaches this code."""
    if lowest is not None and lowest <= understood:
        return
    raise StoreError(
        f"database schema version {version} is newer than this memengine understands ({understood}) "
        f"and is not compatible with it (compatible from version {lowest if lowest is not None else version}); "
        "upgrade memengine"
    )


def check_readable_version(version: int, lowest: Callable[[], int | None], understood: int, behind: str) -> None:
    """For a read-only opening (either backend): refuse a schema behind this code, or newer beyond its window.

    ``behind`` is the error for a schema to migrate first (read-only never
    migrates); ``lowest`` reads the schema's ``compatible_from``, asked only
    for a newer schema.
    """
    if version < understood:
        raise StoreError(behind)
    if version > understood:
        check_newer(version, lowest(), understood)
