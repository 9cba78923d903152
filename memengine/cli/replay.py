"""``memengine replay``: play a recorded message log into a fresh store.

A log comes from an engine opened with ``open_engine(..., record_to=LOG)``
(one JSON line per handled message, after a line with the engine's config;
see :mod:`memengine.replay`). Replay opens an engine with the recorded
``SessionConfig`` (``--default-config`` for the defaults) and the offline
summarizer, on a new SQLite file or an empty PostgreSQL schema, sends each
message again, in order, waits for every summary, and reports where an
outcome (reads included) differed from the log. A replay that fails leaves
no store behind: the new file is removed, the tables it created in the
schema are dropped.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TextIO

import anyio

from ..config import SessionConfig
from ..engine import open_engine
from ..replay import RecordedEngine, ReplayReport, read_log, recorded_config, replay
from ..store.migration import connect_postgres
from ..store.open import is_postgres_url
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, STORE_FAILURES, first_failure
from .failures import report as report_failure
from .progress import Progress, add_option, stream_for
from .store_file import foreign_url

DESCRIPTION = (
    "Replay a message log (recorded with open_engine(..., record_to=LOG)) into a new store, with the recorded "
    "SessionConfig, and report where an outcome (an add's seqs, a delete's count, a read's window and summary) "
    "differs from the recording. A failed replay leaves no store behind."
)
OFFLINE_SUMMARIZER = "memengine.summarizer.extractive.ExtractiveSummarizer"
# Tables a store may hold: a schema that has any of them is not fresh.
STORE_MARKERS = ("memengine_schema", "episodes", "sessions")


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "replay", help="replay a recorded message log into a fresh store", description=DESCRIPTION
    )
    parser.add_argument("log", type=Path, metavar="LOG", help="a JSON-lines message log")
    parser.add_argument(
        "--db",
        required=True,
        metavar="NEW",
        help="the SQLite file to create (must not exist), or a postgresql:// URL of a schema without memengine tables",
    )
    parser.add_argument(
        "--default-config",
        action="store_true",
        help="replay with the default SessionConfig instead of the one recorded in LOG",
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio", help="async library to run on")
    add_option(parser)
    parser.set_defaults(run=run)


async def replay_into(log: Path, db: str, config: SessionConfig, progress_to: TextIO | None = None) -> ReplayReport:
    """Replay ``log`` into ``db``, with progress on ``progress_to`` (None: none)."""
    async with open_engine(db, config=config, resume_pending_summaries=False) as engine:
        total = None if progress_to is None else _message_count(log)  # an extra pass, only to be shown
        messages = Progress("memengine replay", "messages", progress_to, total=total)
        report = await replay(log, engine, on_handled=messages.advance)
        messages.finish()
        waiting = "memengine replay: waiting for summaries"
        summaries = Progress(waiting, "sessions", progress_to, total=len(report.sessions))
        for waited, session_id in enumerate(report.sessions, 1):
            await engine.session(session_id).context(wait_for_summary=True)
            summaries.advance(waited)
        summaries.finish()
        return report


def _message_count(log: Path) -> int:
    return sum(1 for record in read_log(log) if record["type"] != "engine")


def run(options: argparse.Namespace) -> int:
    """Replay LOG into NEW; 0 if every outcome matched, 1 if some differed, 2 if LOG or NEW is unusable as given,
    3 if the new store cannot be written (see exit_status.py)."""
    log: Path = options.log
    db: str = options.db
    if (foreign := foreign_url(db)) is not None:
        return report_failure("replay", foreign)
    if not log.is_file():
        print(f"memengine replay: cannot read {log}: no such file", file=sys.stderr)
        return exit_status.USAGE
    try:
        recorded = recorded_config(log)
    except ValueError as exc:
        print(f"memengine replay: {exc}", file=sys.stderr)
        return exit_status.USAGE
    postgres = is_postgres_url(db)
    try:
        existing = _postgres_tables(db) if postgres else None
    except EXPECTED_FAILURES as exc:
        return report_failure("replay", exc)
    if (existing is not None and set(STORE_MARKERS) & existing) or (not postgres and Path(db).exists()):
        print(f"memengine replay: {redacted(db)} already holds a store; replay needs a fresh store", file=sys.stderr)
        return exit_status.USAGE
    config = SessionConfig() if recorded is None or options.default_config else recorded.config
    report: ReplayReport | None = None
    failure: BaseException | None = None
    try:
        progress_to = stream_for(options.progress)
        report = anyio.run(replay_into, log, db, config, progress_to, backend=options.backend)
    except* (*EXPECTED_FAILURES, ValueError) as group:
        failure = first_failure(group)
    except* BaseException:
        _remove_new_store(db, existing)
        raise
    if failure is not None or report is None:
        _remove_new_store(db, existing)
        if isinstance(failure, STORE_FAILURES):
            return report_failure("replay", failure)  # the new store could not be written: status 3, as elsewhere
        print(f"memengine replay: {failure}; nothing was kept of {redacted(db)}", file=sys.stderr)
        return exit_status.USAGE
    _print_setup(recorded, options.default_config)
    print(f"replayed {report.messages} messages over {len(report.sessions)} sessions into {redacted(db)}")
    for mismatch in report.mismatches:
        print(f"  differs: {mismatch}")
    if report.mismatches:
        return exit_status.FAILED
    print(f"every outcome matched the log; look at the result with: memengine inspect {redacted(db)}")
    return exit_status.OK


def _print_setup(recorded: RecordedEngine | None, default_config: bool) -> None:
    if recorded is None:
        print("the log records no config (written before memengine recorded it): replaying with the defaults")
        return
    if default_config:
        print("replaying with the default config (--default-config), not the recorded one")
    for note in recorded.notes:
        print(f"note: {note}")
    if recorded.summarizer not in (None, OFFLINE_SUMMARIZER):
        print(
            f"note: recorded with {recorded.summarizer}; replayed with the offline summarizer "
            "(summaries' text differs; what they cover is compared)"
        )


def _postgres_tables(url: str) -> set[str]:
    """The tables visible through ``url``'s search_path; read-only, creates nothing."""
    with connect_postgres(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname = ANY (current_schemas(false))"
        ).fetchall()
    return {name for (name,) in rows}


def _remove_new_store(db: str, existing: set[str] | None) -> None:
    """Undo a failed replay: the new SQLite file (and its companions), or the tables it added to the schema."""
    if existing is None:
        for companion in ("", "-wal", "-shm", "-journal"):
            Path(db + companion).unlink(missing_ok=True)
        shutil.rmtree(db + "-owners", ignore_errors=True)
        return
    try:
        with connect_postgres(db) as conn:
            (schema,) = conn.execute("SELECT current_schema()").fetchone()
            added = _postgres_tables(db) - existing
            for table in sorted(added):
                conn.execute(f'DROP TABLE IF EXISTS "{schema}"."{table}" CASCADE')
    except EXPECTED_FAILURES as exc:
        print(f"memengine replay: could not drop the tables the failed replay created: {exc}", file=sys.stderr)
