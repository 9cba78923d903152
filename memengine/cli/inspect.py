"""``memengine inspect``: show what a memengine store holds, without running an engine.

Without a session id, lists every session; with one, shows that session's
latest summary and the raw episodes after it. The store is opened read-only
(SQLite ``mode=ro``; PostgreSQL read-only sessions) and read through
``load_session`` and ``list_sessions`` only: no session is activated, no
summary is computed, no file or table is created, so looking never changes
what is stored. Work set aside after too many failed rounds is shown after
the list (or the session). ``--full`` prints every line whole; ``--json``
prints one JSON document instead (inspect_json.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import anyio
import attrs

from ..store.base import SessionRow, SessionSnapshot, SetAside
from ..store.open import open_store
from ..store.open_errors import redacted
from . import exit_status
from .arguments import positive_int
from .failures import EXPECTED_FAILURES, first_failure, report
from .inspect_json import session_document, sessions_document
from .render import LINE_WIDTH, episode_lines, indented, one_line, set_aside_lines, summary_lines

DESCRIPTION = (
    "Show what a memengine store (a SQLite file or a postgresql:// URL) holds. Without SESSION, list every "
    "session; with SESSION, show its summary and the raw episodes after it. Read-only: never creates a file or "
    "a table, never activates a session or computes a summary."
)


@attrs.frozen
class Findings:
    """What inspect read from the store, in one pass."""

    sessions: list[SessionRow]
    snapshot: SessionSnapshot | None
    set_aside: list[SetAside]


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "inspect", help="list the sessions of a store, or show one session", description=DESCRIPTION
    )
    parser.add_argument(
        "db", metavar="DB", help="a memengine SQLite file (never created by inspect), or a postgresql:// URL"
    )
    parser.add_argument("session", nargs="?", metavar="SESSION", help="the id of the session to show")
    parser.add_argument(
        "--limit",
        type=positive_int,
        metavar="N",
        help="show at most N sessions (the first, by id) or N episodes (the latest); default: all",
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--full", action="store_true", help=f"print summaries and episodes whole, not cut at {LINE_WIDTH} characters"
    )
    shape.add_argument("--json", action="store_true", help="print one JSON document, with every text whole")
    parser.set_defaults(run=run)


def run(options: argparse.Namespace) -> int:
    """Read the store and print the session list or one session (exit statuses: exit_status.py)."""
    db: str = options.db
    failure: BaseException | None = None
    findings: Findings | None = None
    try:
        findings = anyio.run(read_store, db, options.session)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or findings is None:
        return report("inspect", failure or RuntimeError("nothing was read"))
    shown = redacted(db)
    if options.session is None:
        if options.json:
            _print_json(sessions_document(findings.sessions[: options.limit], findings.set_aside))
        else:
            _print_sessions(shown, findings.sessions, options.limit)
            _print_set_aside(findings.set_aside, None if options.full else LINE_WIDTH)
        return exit_status.OK
    row = next((row for row in findings.sessions if row.session_id == options.session), None)
    if row is None or findings.snapshot is None:
        return report("inspect", LookupError(f"session {options.session!r} has no stored episodes in {shown}"))
    if options.json:
        _print_json(session_document(row, findings.snapshot, options.limit, findings.set_aside))
    else:
        _print_session(shown, row, findings.snapshot, options.limit, None if options.full else LINE_WIDTH)
        _print_set_aside(findings.set_aside, None if options.full else LINE_WIDTH)
    return exit_status.OK


async def read_store(db: str | Path, session_id: str | None) -> Findings:
    """The session list and, if ``session_id`` is given, that session's snapshot, from a read-only store."""
    async with open_store(db, read_only=True) as store:
        sessions = await store.list_sessions()
        snapshot = await store.load_session(session_id) if session_id is not None else None
        set_aside = await store.list_set_aside(session_id)
    return Findings(sessions, snapshot, set_aside)


def _print_json(document: object) -> None:
    print(json.dumps(document, ensure_ascii=False, indent=2))


def _print_sessions(db: str, sessions: list[SessionRow], limit: int | None) -> None:
    count = f"{len(sessions)} session{'s' if len(sessions) != 1 else ''}"
    shown = sessions[:limit]
    more = f", showing the first {len(shown)}" if len(shown) < len(sessions) else ""
    print(f"{db}: {count}{more}")
    if not shown:
        return
    header = ("SESSION", "GENERATION", "EPISODES", "SUMMARIZED_THROUGH", "LAST_SEQ")
    rows = [
        (one_line(repr(row.session_id)[1:-1], 40), row.generation, row.episodes, row.summarized_through, row.last_seq)
        for row in shown
    ]
    id_width = max(len(header[0]), *(len(row[0]) for row in rows))
    widths = [id_width, *(len(title) for title in header[1:])]
    print("  ".join(f"{title:<{width}}" for title, width in zip(header, widths, strict=True)).rstrip())
    for row in rows:
        cells = [
            f"{row[0]:<{widths[0]}}",
            *(f"{value:>{width}}" for value, width in zip(row[1:], widths[1:], strict=True)),
        ]
        print("  ".join(cells))


def _print_set_aside(set_aside: list[SetAside], width: int | None) -> None:
    if set_aside:
        print(f"set aside after too many failed rounds ({len(set_aside)}; `memengine set-aside --help`):")
        print("\n".join(indented(set_aside_lines(set_aside, width))))


def _print_session(db: str, row: SessionRow, snapshot: SessionSnapshot, limit: int | None, width: int | None) -> None:
    print(f"session {row.session_id!r} in {db}")
    print(f"  generation {row.generation}, {row.episodes} stored episodes, last seq {row.last_seq}")
    print(f"summary (covers seqs up to {snapshot.summarized_through}):")
    print("\n".join(indented(summary_lines(snapshot.summary, width=width))))
    episodes = snapshot.episodes
    shown = episodes[-limit:] if limit is not None else episodes
    more = f", showing the latest {len(shown)}" if len(shown) < len(episodes) else ""
    print(f"raw episodes after the summary ({len(episodes)}{more}):")
    print("\n".join(indented(episode_lines(shown, width))))
