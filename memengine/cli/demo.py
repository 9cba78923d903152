"""``memengine demo``: replay a sample conversation and watch the window and summary evolve.

The conversation goes, one turn at a time, into session ``demo`` of a local
SQLite file (or of a PostgreSQL database, with ``--db postgresql://...``),
through an engine running the offline ExtractiveSummarizer. Every few turns
the command prints what a context read returns at that moment; at the end,
the final context once every evicted episode is summarized.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
from pathlib import Path

import anyio
import attrs

from ..config import SessionConfig
from ..context import Context
from ..engine import open_engine
from ..episode import Episode
from ..store.open import is_postgres_url
from ..store.open_errors import redacted
from . import exit_status
from .arguments import positive_int
from .conversation import Turn, load_sample_conversation
from .failures import EXPECTED_FAILURES, first_failure, report
from .render import awaiting_summary, context_lines, indented, summary_lines
from .store_file import foreign_url, store_file_problem

DEMO_SESSION = "demo"
DEFAULT_DB = Path("memengine-demo.db")
SUMMARY_PREVIEW_LINES = 4
RULE = "-" * 72
DESCRIPTION = (
    "Replay a bundled sample conversation, one turn at a time, into session 'demo' of a local SQLite file "
    "(or a postgresql:// URL), "
    "with the offline ExtractiveSummarizer. Every few turns, print what a context read returns at that moment "
    "(the raw window, summarized_through, evicted_through and the rolling summary); at the end, the final "
    "context once every evicted episode is summarized."
)


@attrs.frozen
class DemoPlan:
    """What one run of the demo does, decided before the engine starts."""

    db: str  # a SQLite path or a postgresql:// URL
    turns: tuple[Turn, ...]
    config: SessionConfig
    every: int


def add_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = SessionConfig()
    parser = subcommands.add_parser(
        "demo",
        help="replay a sample conversation and show the window and summary evolving",
        description=DESCRIPTION,
    )
    parser.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        metavar="PATH",
        help=(
            f"SQLite file to write (default: ./{DEFAULT_DB}), or a postgresql:// URL; "
            "an earlier demo run in it is cleared first"
        ),
    )
    parser.add_argument(
        "--turns", type=positive_int, metavar="N", help="replay only the first N turns (default: the whole sample)"
    )
    parser.add_argument(
        "--max-episodes",
        type=positive_int,
        default=defaults.max_episodes,
        metavar="N",
        help=f"raw window size in episodes (default: {defaults.max_episodes})",
    )
    parser.add_argument(
        "--max-chars",
        type=positive_int,
        default=defaults.max_chars,
        metavar="N",
        help=f"raw window size in characters (default: {defaults.max_chars})",
    )
    parser.add_argument(
        "--every", type=positive_int, default=50, metavar="N", help="show the state every N turns (default: 50)"
    )
    parser.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="async backend to run on (default: asyncio)"
    )
    parser.set_defaults(run=run)


def run(options: argparse.Namespace) -> int:
    """Check the arguments against the file system, then replay the conversation."""
    if (foreign := foreign_url(options.db)) is not None:
        return report("demo", foreign)
    db: str = options.db
    problem = None if is_postgres_url(db) else _db_problem(Path(db))
    if problem is not None:
        print(f"memengine demo: cannot use {db}: {problem}", file=sys.stderr)
        return exit_status.STORE_UNUSABLE
    if options.backend == "trio" and importlib.util.find_spec("trio") is None:
        print("memengine demo: the trio backend needs trio: pip install 'agent-memengine[trio]'", file=sys.stderr)
        return exit_status.USAGE
    sample = load_sample_conversation()
    plan = DemoPlan(
        db=db,
        turns=sample[: options.turns],
        config=SessionConfig(max_episodes=options.max_episodes, max_chars=options.max_chars),
        every=options.every,
    )
    _print_header(plan, requested=options.turns, available=len(sample))
    failure: BaseException | None = None
    final: Context | None = None
    try:
        final = anyio.run(replay, plan, backend=options.backend)
    except* EXPECTED_FAILURES as group:
        failure = first_failure(group)
    if failure is not None or final is None:
        return report("demo", failure or RuntimeError("no final context"), "failed")
    _print_final(plan, final)
    return exit_status.OK


def _db_problem(db: Path) -> str | None:
    """Why the demo must not write to ``db`` (a new file is fine; an existing one must be a store)."""
    if db.exists():
        return store_file_problem(db)
    if not db.parent.is_dir():
        return f"directory {db.parent} does not exist"
    return None


async def replay(plan: DemoPlan) -> Context:
    """Add the plan's turns one by one, printing checkpoints; return the final summarized context."""
    async with open_engine(plan.db, config=plan.config, resume_pending_summaries=False) as engine:
        session = engine.session(DEMO_SESSION)
        if any(row.session_id == DEMO_SESSION for row in await engine.store.list_sessions()):
            await session.clear()  # reruns start from the same (empty) state
            print(f"Cleared session {DEMO_SESSION!r} from an earlier run (seqs are never reused, so they continue).")
        for number, turn in enumerate(plan.turns, start=1):
            (stored,) = await session.add([Episode(turn.role, turn.content, id=f"turn-{number}")])
            if number % plan.every == 0:
                _print_checkpoint(number, stored, await session.context())
        final = await session.context(wait_for_summary=True)
        await session.close()
    return final


def _print_header(plan: DemoPlan, *, requested: int | None, available: int) -> None:
    short = f" (the sample has only {available})" if requested is not None and requested > available else ""
    print(
        f"memengine demo: replaying {len(plan.turns)} turns{short} into {redacted(plan.db)}, session {DEMO_SESSION!r}"
    )
    print(
        f"Window: at most {plan.config.max_episodes} raw episodes and {plan.config.max_chars} characters; "
        "older episodes are folded into a rolling summary"
    )
    print(f"by the offline ExtractiveSummarizer (deterministic, no model). State shown every {plan.every} turns.")


def _print_checkpoint(number: int, stored: Episode, context: Context) -> None:
    waiting = awaiting_summary(context)
    print(RULE)
    print(f"turn {number} (seq {stored.seq})")
    print(
        f"  raw episodes in context: {len(context.episodes)} "
        f"({len(context.episodes) - waiting} in the window + {waiting} evicted, not summarized yet)"
    )
    print(f"  summarized_through: {context.summarized_through}   evicted_through: {context.evicted_through}")
    print("  summary:")
    print("\n".join(indented(summary_lines(context.summary, max_lines=SUMMARY_PREVIEW_LINES))))


def _print_final(plan: DemoPlan, context: Context) -> None:
    print(RULE)
    print(f"Final context after {len(plan.turns)} turns (read with wait_for_summary=True):")
    print("\n".join(indented(context_lines(context), "  ")))
    print(RULE)
    print(f"Look at what was stored: memengine inspect {shlex.quote(redacted(plan.db))} {DEMO_SESSION}")
