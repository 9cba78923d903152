"""``memengine replay``: play a recorded message log into a fresh store.

A log comes from an engine opened with ``open_engine(..., record_to=LOG)``
(one JSON line per handled message; see :mod:`memengine.replay`). Replay sends
each message again, in order, to an engine on a new SQLite file with the
default offline summarizer, waits for every summary, and reports where an
outcome differed from the log.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from ..engine import open_engine
from ..replay import ReplayReport, replay
from . import exit_status
from .failures import EXPECTED_FAILURES, STORE_FAILURES, first_failure
from .failures import report as report_failure

DESCRIPTION = (
    "Replay a message log (recorded with open_engine(..., record_to=LOG)) into a new SQLite store, "
    "and report where an outcome differs from the recording."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "replay", help="replay a recorded message log into a fresh store", description=DESCRIPTION
    )
    parser.add_argument("log", type=Path, metavar="LOG", help="a JSON-lines message log")
    parser.add_argument(
        "--db", type=Path, required=True, metavar="NEW", help="the SQLite file to create (must not exist)"
    )
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio", help="async library to run on")
    parser.set_defaults(run=run)


async def replay_into(log: Path, db: Path) -> ReplayReport:
    async with open_engine(db, resume_pending_summaries=False) as engine:
        report = await replay(log, engine)
        for session_id in report.sessions:
            await engine.session(session_id).context(wait_for_summary=True)
        return report


def run(options: argparse.Namespace) -> int:
    """Replay LOG into NEW; 0 if every outcome matched, 1 if some differed, 2 if LOG or NEW is unusable as given,
    3 if the new store cannot be written (see exit_status.py)."""
    log: Path = options.log
    db: Path = options.db
    if not log.is_file():
        print(f"memengine replay: cannot read {log}: no such file", file=sys.stderr)
        return 2
    if db.exists():
        print(f"memengine replay: {db} already exists; replay needs a fresh store", file=sys.stderr)
        return 2
    report: ReplayReport | None = None
    failure: BaseException | None = None
    try:
        report = anyio.run(replay_into, log, db, backend=options.backend)
    except* (*EXPECTED_FAILURES, ValueError) as group:
        failure = first_failure(group)
    if isinstance(failure, STORE_FAILURES):
        return report_failure("replay", failure)  # the new store could not be written: status 3, as elsewhere
    if failure is not None or report is None:
        print(f"memengine replay: {failure}", file=sys.stderr)
        return exit_status.USAGE
    print(f"replayed {report.messages} messages over {len(report.sessions)} sessions into {db}")
    for mismatch in report.mismatches:
        print(f"  differs: {mismatch}")
    if report.mismatches:
        return 1
    print(f"every outcome matched the log; look at the result with: memengine inspect {db}")
    return 0
