"""Argument types shared by the subcommand parsers."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """Parse a whole number of at least 1, for argparse's ``type=``.

    argparse turns the ``ArgumentTypeError`` into its usual usage message and
    exit status 2.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
