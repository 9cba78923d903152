"""``memengine forget``: erase every session of a tenant (or a prefix, or a session), after a confirmation.

First the store is read (read-only) and what would be erased is shown:
sessions, episodes, summaries and undelivered retain batches. ``--dry-run``
stops there. Otherwise the command asks for ``yes`` on stdin (``--yes``
skips the question) and runs ``Engine.forget`` in an engine of its own: each
session is taken over from whichever process holds it (once idle) and
erased in small transactions, so the processes serving other users go on
(memengine/privacy/forget.py). A session kept busy elsewhere is reported
(status 1), and running the command again erases it.
"""

from __future__ import annotations

import argparse
import sys

import anyio

from ..engine import open_engine
from ..errors import ForgetIncompleteError
from ..privacy import forget as forgetting
from ..privacy.report import ForgetReport
from ..scope import Scope
from ..store.open import open_store
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, first_failure, report
from .scope_arguments import add_scope_options, scope_and_store

DESCRIPTION = (
    "Erase every session of one tenant (the sessions 'T/...'), prefix or session: episodes, summaries, recall "
    "index entries, undelivered retain batches, session and lease rows. Shows what it would erase and asks "
    "first (--yes: do not ask; --dry-run: only show)."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser("forget", help="erase a tenant's sessions for good", description=DESCRIPTION)
    parser.add_argument("db", metavar="STORE", help="a memengine SQLite file, or a postgresql:// URL")
    add_scope_options(parser, "erase")
    parser.add_argument("--dry-run", action="store_true", help="show what would be erased; erase nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for a confirmation")
    parser.set_defaults(run=run)


async def planned(db: str, scope: Scope) -> ForgetReport:
    async with open_store(db, read_only=True) as store:
        return await forgetting.count(store, scope)


async def erase(db: str, scope: Scope) -> ForgetReport:
    # No summaries of other sessions are resumed by this engine: it is here to erase, nothing else.
    async with open_engine(db, resume_pending_summaries=False) as engine:
        return await engine.forget(
            session_id=scope.session_id,
            prefix=scope.prefix,
        )


def describe(report: ForgetReport) -> str:
    def counted(number: int, what: str) -> str:
        return f"{number} {what}{'s' if number != 1 else ''}"

    described = ", ".join(
        (
            counted(report.sessions, "session"),
            counted(report.episodes, "episode"),
            counted(report.summaries, "summary").replace("summarys", "summaries"),
            counted(report.outbox_batches, "undelivered retain batch").replace("batchs", "batches"),
        )
    )
    if report.waiting_for_sink:
        described += (
            f" ({report.waiting_for_sink} of the sessions keep their row, without content, until the retain sink "
            "has their forget: run forget again later to remove it)"
        )
    return described


def run(options: argparse.Namespace) -> int:
    db: str = options.db
    scope = scope_and_store("forget", options)
    if not isinstance(scope, Scope):
        return scope
    failure: BaseException | None = None
    plan: ForgetReport | None = None
    try:
        plan = anyio.run(planned, db, scope)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or plan is None:
        return report("forget", failure or RuntimeError("nothing was read"))
    shown = redacted(db)
    print(f"{scope} in {shown}: {describe(plan)}")
    if options.dry_run:
        print("dry run: nothing erased")
        return exit_status.OK
    if plan.sessions == 0:
        print("nothing to erase")
        return exit_status.OK
    if not options.yes and not _confirmed(scope):
        print("nothing erased")
        return exit_status.FAILED
    erased: ForgetReport | None = None
    try:
        erased = anyio.run(erase, db, scope)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if isinstance(failure, ForgetIncompleteError):
        print(f"erased {describe(failure.report)}")
        return report("forget", failure)
    if failure is not None or erased is None:
        return report("forget", failure or RuntimeError("nothing was erased"), f"erasing {scope}")
    print(f"erased {describe(erased)}")
    return exit_status.OK


def _confirmed(scope: Scope) -> bool:
    print(f"Erase {scope} for good? Type yes to go on: ", end="", flush=True)
    answer = sys.stdin.readline()
    return answer.strip() == "yes"
