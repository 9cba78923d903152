"""``memengine set-aside list|retry|discard``: the work set aside after too many failed rounds.

``list`` reads the store read-only. ``retry`` lifts the marks in the store:
a retain batch is due again at once (an engine's delivery sends it within
``retain_retry_later``); a summary batch is tried by the engine that next
activates its session, or, if one holds the session now, at its next idle
tick (no summarizer runs in this command). ``discard`` drops set-aside retain
batches from the outbox (the sink never gets them); without ``--yes`` it only
says what it would drop. A summary batch cannot be discarded: retry it, or
delete its episodes (``Session.delete_episodes``), which lifts its mark.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import anyio

from ..errors import StoreError
from ..store.base import SetAside
from ..store.open import is_postgres_url, open_store
from ..store.open_errors import redacted
from . import exit_status
from .failures import EXPECTED_FAILURES, first_failure, report
from .inspect_json import set_aside_document
from .render import LINE_WIDTH, indented, set_aside_lines
from .store_file import foreign_url, store_file_problem

DESCRIPTION = (
    "Work set aside after too many failed rounds (SessionConfig.summarize_set_aside_after, retain_set_aside_after): "
    "list it, retry it (lifts the marks: engines try it again), or discard set-aside retain batches (the sink never "
    "gets them; without --yes, only says what would be dropped). Summary batches cannot be discarded: retry them, "
    "or delete their episodes."
)


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "set-aside", help="list, retry or discard work set aside after too many failures", description=DESCRIPTION
    )
    parser.add_argument("action", choices=("list", "retry", "discard"), help="what to do")
    parser.add_argument(
        "db", metavar="DB", help="a memengine SQLite file (never created by this command), or a postgresql:// URL"
    )
    parser.add_argument("session", nargs="?", metavar="SESSION", help="only this session's work")
    parser.add_argument("--json", action="store_true", help="list: print one JSON document")
    parser.add_argument("--yes", action="store_true", help="discard: really drop the batches")
    parser.set_defaults(run=run)


def run(options: argparse.Namespace) -> int:
    db: str = options.db
    if (foreign := foreign_url(db)) is not None:
        return report("set-aside", foreign)
    problem = None if is_postgres_url(db) else store_file_problem(Path(db))
    if problem is not None:
        return report("set-aside", StoreError(f"cannot read {db}: {problem}"))
    failure: BaseException | None = None
    outcome: list[SetAside] | tuple[int, int] | None = None
    try:
        outcome = anyio.run(_act, db, options.action, options.session, options.yes)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or outcome is None:
        return report("set-aside", failure or RuntimeError("nothing was done"))
    shown = redacted(db)
    if isinstance(outcome, tuple):
        summaries, retains = outcome
        print(
            f"{shown}: {summaries} summary batch{'es' if summaries != 1 else ''} and {retains} retain "
            f"batch{'es' if retains != 1 else ''} tried again (a summary at its session's next activation or idle "
            "tick, a retain batch within retain_retry_later)"
        )
    elif options.json:
        print(json.dumps({"set_aside": set_aside_document(outcome)}, ensure_ascii=False, indent=2))
    elif options.action == "discard":
        done = "discarded" if options.yes else "would discard (run again with --yes to drop them)"
        print(f"{shown}: {done} {len(outcome)} retain batch{'es' if len(outcome) != 1 else ''}")
        print("\n".join(indented(set_aside_lines(outcome, LINE_WIDTH))))
    else:
        print(f"{shown}: {len(outcome)} set aside")
        print("\n".join(indented(set_aside_lines(outcome, LINE_WIDTH))))
    return exit_status.OK


async def _act(db: str, action: str, session_id: str | None, yes: bool) -> list[SetAside] | tuple[int, int]:
    async with open_store(db, read_only=True) as store:
        listed = await store.list_set_aside(session_id)
    if action == "list" or (action == "discard" and not yes):
        return [work for work in listed if action == "list" or work.kind == "retain"]
    async with open_store(db) as store:
        if action == "discard":
            return await store.discard_set_aside_retains(session_id)
        summaries = 0
        for work in listed:
            if work.kind == "summary":
                summaries += await store.lift_summary_set_aside(work.session_id, None)
        return summaries, await store.retry_set_aside_retains(session_id)
