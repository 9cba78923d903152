"""The scope options of ``memengine export`` and ``forget``: ``--tenant``, ``--prefix`` or ``--session``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..scope import Scope
from ..store.open import is_postgres_url
from . import exit_status
from .failures import report
from .store_file import foreign_url, store_file_problem


def add_scope_options(parser: argparse.ArgumentParser, verb: str) -> None:
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant", metavar="T", help=f"{verb} the sessions 'T/...' (the part before the first /)")
    scope.add_argument("--prefix", metavar="P", help=f"{verb} the sessions whose ids start with P (exactly)")
    scope.add_argument("--session", metavar="S", help=f"{verb} the session S")


def scope_of(command: str, options: argparse.Namespace) -> Scope:
    """The scope the options name (``ValueError`` for a bad tenant or prefix, reported as a usage error)."""
    return Scope.of(command, session_id=options.session, tenant=options.tenant, prefix=options.prefix, allow_all=False)


def scope_and_store(command: str, options: argparse.Namespace) -> Scope | int:
    """The scope the options name, once the store (``options.db``) looks usable; else the exit status, reported."""
    db: str = options.db
    try:
        scope = scope_of(command, options)
    except ValueError as exc:
        print(f"memengine {command}: {exc}", file=sys.stderr)
        return exit_status.USAGE
    if (foreign := foreign_url(db)) is not None:
        return report(command, foreign)
    problem = None if is_postgres_url(db) else store_file_problem(Path(db))
    if problem is not None:
        print(f"memengine {command}: cannot read {db}: {problem}", file=sys.stderr)
        return exit_status.STORE_UNUSABLE
    return scope
