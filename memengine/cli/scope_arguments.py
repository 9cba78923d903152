"""The scope options of ``memengine export`` and ``forget``: ``--tenant``, ``--prefix`` or ``--session``."""

from __future__ import annotations

import argparse

from ..scope import Scope


def add_scope_options(parser: argparse.ArgumentParser, verb: str) -> None:
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant", metavar="T", help=f"{verb} the sessions 'T/...' (the part before the first /)")
    scope.add_argument("--prefix", metavar="P", help=f"{verb} the sessions whose ids start with P (exactly)")
    scope.add_argument("--session", metavar="S", help=f"{verb} the session S")


def scope_of(command: str, options: argparse.Namespace) -> Scope:
    """The scope the options name (``ValueError`` for a bad tenant or prefix, reported as a usage error)."""
    return Scope.of(command, session_id=options.session, tenant=options.tenant, prefix=options.prefix, allow_all=False)
