"""What a recall query asks for, the same on every backend: its first distinct words.

A query matches any of its words. Words are runs of letters, digits and
underscores (``\\w+``), compared case-insensitively. A query uses its first
:data:`MAX_QUERY_WORDS` distinct words and ignores the rest, on SQLite and
PostgreSQL alike, so that any query works on both. How a word matches an
episode still differs (SQLite's tokenizer folds accents and splits e-mail
addresses and URLs into words; PostgreSQL's ``simple`` parser does neither),
so the two stores may find different episodes for such words.

Without a bound, a 70,000-word query overflows PostgreSQL's stack (``stack
depth limit exceeded`` while parsing the tsquery) and takes FTS5 about two
minutes over 100,000 episodes (its OR costs grow with the square of the
words); ranking costs grow with the words on both.
"""

from __future__ import annotations

import re

#: How many distinct words of a query recall uses (the first ones).
MAX_QUERY_WORDS = 1_000

_WORD = re.compile(r"\w+", re.UNICODE)


def query_words(query: str) -> list[str]:
    """The first :data:`MAX_QUERY_WORDS` distinct words of ``query``, lower-cased, in order."""
    words: dict[str, None] = {}
    for match in _WORD.finditer(query):
        words[match.group().lower()] = None
        if len(words) == MAX_QUERY_WORDS:
            break
    return list(words)
