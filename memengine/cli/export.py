"""``memengine export``: write every episode and summary of a tenant (or a prefix, or a session) as JSON lines.

The store is opened read-only (nothing is created, migrated or written) and
read a page at a time (memengine/privacy/export.py), so a tenant of any size
is exported in bounded memory. With ``-o FILE`` the lines go to FILE.partial,
renamed to FILE once complete: a failed export leaves no file that looks
whole. A line per record: ``{"type": "session", ...}`` for each session, then
``{"type": "episode", ...}`` for each of its episodes.

A scope that matches no session is a failure (status 1, as an unknown session
is for ``inspect``), said on stderr, and no file is written. For ``--tenant``
the message says whether the store's ids follow the ``tenant/...`` convention
at all: in a store whose ids have no ``/``, no tenant can match.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

import anyio

from ..privacy.export import ExportStream, write_json_lines
from ..scope import TENANT_SEPARATOR, Scope, tenant_prefix
from ..store.open import open_store
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, first_failure, report
from .scope_arguments import add_scope_options, scope_and_store

DESCRIPTION = (
    "Write every stored episode and the latest summary of each session of one tenant (the sessions 'T/...'), "
    "prefix or session as JSON lines: one session line, then its episodes in order. Read-only."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser("export", help="export a tenant's sessions as JSON lines", description=DESCRIPTION)
    parser.add_argument("db", metavar="STORE", help="a memengine SQLite file, or a postgresql:// URL")
    add_scope_options(parser, "export")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE (must not exist) instead of stdout")
    parser.set_defaults(run=run)


async def export(db: str, scope: Scope, out: TextIO) -> tuple[int, int]:
    """Write the scope's records to ``out``; return how many sessions and episodes were written."""
    async with open_store(db, read_only=True) as store:
        return await write_json_lines(ExportStream(store, scope), out)


#: Session ids a "no session matches" message reads at most, looking for one that follows the convention.
_IDS_LOOKED_AT = 10_000
_PAGE = 1000


async def why_nothing_matched(db: str, options: argparse.Namespace) -> str:
    """What to tell a user whose scope matched no session; for a tenant, whether any id follows the convention."""
    if options.session is not None:
        return f"no session {options.session!r} in {redacted(db)}"
    if options.prefix is not None:
        return f"no session id starts with {options.prefix!r} in {redacted(db)}"
    prefix = tenant_prefix(options.tenant)
    found = f"no session of tenant {options.tenant!r} (no session id starts with {prefix!r}) in {redacted(db)}"
    seen: list[str] = []
    async with open_store(db, read_only=True) as store:
        while len(seen) < _IDS_LOOKED_AT:
            page = await store.scope_session_ids(Scope(), seen[-1] if seen else None, _PAGE)
            if any(TENANT_SEPARATOR in session_id for session_id in page):
                return found
            seen += page
            if len(page) < _PAGE:
                break
    if not seen:
        return f"{found}: the store holds no session"
    looked = "of its sessions" if len(seen) < _IDS_LOOKED_AT else f"of its first {len(seen):,} sessions (by id)"
    examples = ", ".join(repr(session_id) for session_id in seen[:3])
    return (
        f"{found}: no session id follows the 'tenant/...' convention (none {looked} contains a "
        f"{TENANT_SEPARATOR!r}; ids such as {examples}); --tenant T matches the sessions 'T/...': "
        "use --prefix P or --session S for ids of another shape"
    )


def run(options: argparse.Namespace) -> int:
    db: str = options.db
    scope = scope_and_store("export", options)
    if not isinstance(scope, Scope):
        return scope
    target = None if options.output is None else Path(options.output)
    if target is not None and target.exists():
        print(f"memengine export: {target} already exists (export never overwrites a file)", file=sys.stderr)
        return exit_status.USAGE
    partial = None if target is None else target.with_name(target.name + ".partial")
    failure: BaseException | None = None
    written: tuple[int, int] | None = None
    try:
        if partial is None:
            written = anyio.run(export, db, scope, sys.stdout)
        else:
            with open(partial, "w", encoding="utf-8") as out:
                written = anyio.run(export, db, scope, out)
            if written[0] == 0:
                partial.unlink()  # nothing to export: no file that looks like an (empty) export
            else:
                os.replace(partial, target)  # type: ignore[arg-type]
        if written[0] == 0:
            failure = LookupError(anyio.run(why_nothing_matched, db, options))
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or written is None:
        if partial is not None:
            partial.unlink(missing_ok=True)
        doing = "" if isinstance(failure, LookupError) else f"exporting {scope}"
        return report("export", failure or RuntimeError("nothing was exported"), doing)
    sessions, episodes = written
    where = "stdout" if target is None else str(target)
    print(
        f"exported {scope} from {redacted(db)}: {sessions} session{'s' if sessions != 1 else ''}, "
        f"{episodes} episode{'s' if episodes != 1 else ''}, to {where}",
        file=sys.stderr,
    )
    return exit_status.OK
