"""Where recall differs between the stores, as the README's "Recall" section says.

SQLite's FTS5 folds diacritics and splits e-mail addresses into words;
PostgreSQL's ``simple`` text search configuration does neither. Both find
a word written as it was stored (case aside), and both rank the better
match first, with scores on scales of their own.
"""

from __future__ import annotations

import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store.open import is_postgres_url

pytestmark = pytest.mark.anyio

QUIET = SessionConfig(evict_to=1.0, max_episodes=1_000, passivate_after=None)


async def test_diacritics_are_folded_on_sqlite_only(store_url: str) -> None:
    async with open_engine(store_url, config=QUIET) as engine:
        await engine.session("s").add([Episode("user", "We sailed to Maré"), Episode("user", "Lunch at the café")])

        assert [hit.episode.content for hit in await engine.recall("Maré", all_sessions=True)] == ["We sailed to Maré"]
        assert [hit.episode.content for hit in await engine.recall("maré", all_sessions=True)] == ["We sailed to Maré"]
        unaccented = [hit.episode.content for hit in await engine.recall("mare cafe", all_sessions=True)]

    if is_postgres_url(store_url):
        assert unaccented == []
    else:
        assert sorted(unaccented) == ["Lunch at the café", "We sailed to Maré"]


async def test_email_addresses_are_found_on_sqlite_only(store_url: str) -> None:
    async with open_engine(store_url, config=QUIET) as engine:
        await engine.session("s").add([Episode("user", "write to bob@example.com")])

        by_name = [hit.episode.content for hit in await engine.recall("bob", all_sessions=True)]
        by_address = [hit.episode.content for hit in await engine.recall("bob@example.com", all_sessions=True)]

    if is_postgres_url(store_url):
        # The address is one word there, and a query's words are split at "@" and ".": nothing finds it.
        assert (by_name, by_address) == ([], [])
    else:
        assert by_name == by_address == ["write to bob@example.com"]


async def test_both_rank_the_better_match_first_with_scores_of_their_own(store_url: str) -> None:
    async with open_engine(store_url, config=QUIET) as engine:
        await engine.session("s").add(
            [Episode("user", "the dog barked"), Episode("user", "dog dog dog: the dog's name is Rex, a dog")]
        )

        hits = await engine.recall("dog", all_sessions=True)

    assert hits[0].episode.content.startswith("dog dog dog")
    assert hits[0].score > hits[1].score
    if is_postgres_url(store_url):
        assert 0 < hits[0].score <= 1  # ts_rank
    else:
        assert hits[0].score > 0  # bm25, negated so that higher is better
