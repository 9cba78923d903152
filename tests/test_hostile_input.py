"""Hostile input: every episode field and session id a caller can get wrong.

The property, for every generated input: EITHER the engine stores it and gives it
back exactly (add's return value, context(), the rows in the store's tables, and
a new engine reopened on that store all agree with what went in), OR it is
refused with a plain ``ValueError``/``TypeError`` that says what is wrong, and
nothing of that add call is in the store. Which of the two happens is checked
against the documented rules (non-blank valid Unicode text without NUL, aware
datetimes, JSON metadata with str keys, ``SessionConfig`` size limits, the
limits of ``memengine.limits``), one oracle for both stores: every test runs on
SQLite and on PostgreSQL, which must accept and refuse alike.

Hypothesis drives the examples synchronously. Each test runs one event loop in
a blocking portal (on asyncio and on trio, for each store) and one engine for
all its examples, with a fresh session per example, so a default run takes
seconds.

``MEMENGINE_SOAK``: set it to an integer N to multiply every example count by N,
e.g. ``MEMENGINE_SOAK=50 python -m pytest tests/test_hostile_input.py``.

Inputs with their own explicit tests at the end of this file are kept out of the
generated strategies; one of those (sub-second UTC offsets, a CPython
``fromisoformat`` limitation) is still a strict xfail.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memengine import Engine, Episode, SessionConfig, open_engine
from memengine.episode import with_seq
from memengine.limits import (
    MAX_EPISODE_ID_BYTES,
    MAX_OWNER_BYTES,
    MAX_RECALL_LIMIT,
    MAX_ROLE_CHARS,
    MAX_SEQ,
    MAX_SESSION_ID_BYTES,
)

from .conftest import StoreRows

SOAK = int(os.environ.get("MEMENGINE_SOAK", "1"))
if SOAK < 1:
    raise ValueError(f"MEMENGINE_SOAK must be a positive integer, got {SOAK}")

BACKENDS = pytest.mark.parametrize("backend", ["asyncio", "trio"])

CONTENT_LIMIT = 300
METADATA_LIMIT = 400
# Small size limits so examples cross them cheaply; a window so large that
# nothing is ever evicted, so context() shows every stored episode raw.
LIMITS = SessionConfig(
    evict_to=1.0,
    max_content_chars=CONTENT_LIMIT,
    max_metadata_bytes=METADATA_LIMIT,
    max_episodes=100_000,
    max_chars=10**9,
    passivate_after=None,
)


def examples(count: int) -> settings:
    return settings(
        max_examples=count * SOAK,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


# -- what "came back exactly" means ------------------------------------------------


def exact(value: Any) -> Any:
    """A typed, order-keeping rendering: equal only for the very same value (1, 1.0 and True differ)."""
    if isinstance(value, dict):
        return ("dict", tuple((exact(key), exact(item)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(exact(item) for item in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def fingerprint(episode: Episode) -> tuple:
    created = episode.created_at
    return (
        episode.id,
        episode.role,
        episode.content,
        created.isoformat(),
        created.utcoffset(),
        exact(episode.metadata),
    )


def row_fingerprint(row: tuple) -> tuple:
    _, episode_id, role, content, created_at, metadata = row
    created = datetime.fromisoformat(created_at)
    return (episode_id, role, content, created_at, created.utcoffset(), exact(json.loads(metadata)))


def rows_of(rows: StoreRows, session_id: str) -> list[tuple]:
    return rows.query(
        "SELECT seq, id, role, content, created_at, metadata FROM episodes WHERE session_id = ? ORDER BY seq",
        session_id,
    )


def episodes_of(rows: StoreRows, session_id: str) -> list[tuple[int, str]]:
    return rows.query("SELECT seq, content FROM episodes WHERE session_id = ? ORDER BY seq", session_id)


class Ledger:
    """Every episode the engine acknowledged, per session: what each later view must show."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[tuple[int, tuple]]] = {}

    def record(self, session_id: str, stored: list[tuple[int, tuple]]) -> None:
        self.sessions.setdefault(session_id, []).extend(stored)

    def of(self, session_id: str) -> list[tuple[int, tuple]]:
        return self.sessions.get(session_id, [])

    @property
    def total(self) -> int:
        return sum(len(episodes) for episodes in self.sessions.values())

    def check_rows(self, rows: StoreRows, session_id: str) -> None:
        assert [(row[0], row_fingerprint(row)) for row in rows_of(rows, session_id)] == self.of(session_id)
        # Nothing anywhere else either: a refused add must not have written under another key.
        assert rows.query("SELECT count(*) FROM episodes") == [(self.total,)]

    async def check_reopened(self, store_url: str) -> None:
        """A new engine on the same store shows every session exactly as acknowledged, and no other."""
        async with open_engine(store_url, config=LIMITS) as engine:
            listed = {row.session_id for row in await engine.store.list_sessions()}
            assert listed == set(self.sessions)
            for session_id, expected in self.sessions.items():
                context = await engine.session(session_id).context()
                assert [(e.seq, fingerprint(e)) for e in context.episodes] == expected
                assert context.summary is None


@contextmanager
def engine_in_portal(backend: str, store_url: str) -> Iterator[tuple[BlockingPortal, Engine]]:
    """One event loop (in a thread) and one engine, driven from synchronous hypothesis examples."""
    with (
        start_blocking_portal(backend) as portal,
        portal.wrap_async_context_manager(open_engine(store_url, config=LIMITS)) as engine,
    ):
        yield portal, engine


def assert_clear_refusal(error: BaseException) -> None:
    """A plain ValueError/TypeError (not a UnicodeEncodeError from deep inside) naming what is wrong."""
    assert type(error) in (ValueError, TypeError), f"refused with {type(error).__name__}: {error}"
    message = str(error)
    assert any(word in message for word in ("Episode.", "add()", "session id", "max_content_chars", "max_metadata")), (
        message
    )


# -- the documented rules, as an oracle ------------------------------------------------


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_ok(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\x00" not in value and encodable(value)


def utf8_size(value: str) -> int:
    return len(value.encode("utf-8"))


def role_ok(value: object) -> bool:
    return text_ok(value) and len(value) <= MAX_ROLE_CHARS  # type: ignore[arg-type]


def id_ok(value: object) -> bool:
    return text_ok(value) and utf8_size(value) <= MAX_EPISODE_ID_BYTES  # type: ignore[arg-type]


def content_ok(value: object) -> bool:
    return text_ok(value) and len(value) <= CONTENT_LIMIT  # type: ignore[arg-type]


def created_at_ok(value: object) -> bool:
    return isinstance(value, datetime) and value.utcoffset() is not None


def seq_ok(value: object) -> bool:
    return value is None  # the store assigns seqs: an Episode is never given one


def metadata_ok(value: object) -> bool:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        return False
    try:
        text = json.dumps(dict(value), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError):
        return False
    return encodable(text) and len(text.encode("utf-8")) <= METADATA_LIMIT


def session_id_ok(value: object) -> bool:
    return text_ok(value) and utf8_size(value) <= MAX_SESSION_ID_BYTES  # type: ignore[arg-type]


DEFAULT = object()  # the field is left out: the Episode's own default applies
CHECKS = {"role": role_ok, "content": content_ok, "id": id_ok, "created_at": created_at_ok, "seq": seq_ok}


def spec_ok(spec: dict[str, Any]) -> bool:
    for name, value in spec.items():
        if value is DEFAULT:
            continue
        check = metadata_ok if name == "metadata" else CHECKS[name]
        if not check(value):
            return False
    return True


def build(spec: dict[str, Any]) -> Episode:
    keywords = {name: value for name, value in spec.items() if value is not DEFAULT and name not in ("role", "content")}
    return Episode(spec["role"], spec["content"], **keywords)


# -- strategies ------------------------------------------------------------------------

SPECIAL_CHARACTERS = [
    "\x00",  # NUL
    "\ud800",  # lone high surrogate
    "\udfff",  # lone low surrogate
    "\udc80",  # what surrogateescape makes of a stray byte
    "\u200b",  # zero-width space (not whitespace to Python)
    "\u202e",  # right-to-left override
    "\ufeff",  # byte order mark
    "\uffff",  # noncharacter
    "\U0010ffff",  # the last code point
    "\U0001f9e0",  # emoji, 4 bytes of UTF-8
    "\u0301",  # a combining accent, alone
    "\t",
    " ",
    "\u3000",  # ideographic space (whitespace)
    "\x1c",  # file separator (whitespace to str.strip)
    "\x85",  # next line (whitespace)
    "'",
    '"',
    "\\",
    "%",
    "_",
]
SPECIAL_FRAGMENTS = ["e\u0301", "\r\n", ";--", "\\u0000", "\ud83e\udde0", "NULL", "{}"]  # last but two: a split pair
characters = st.one_of(
    st.characters(exclude_categories=()),  # every code point, surrogates included
    st.characters(categories=["Cs"]),  # surrogates, which the line above rarely picks
    st.sampled_from(SPECIAL_CHARACTERS),
)
short_text = st.lists(st.one_of(characters, st.sampled_from(SPECIAL_FRAGMENTS)), max_size=12).map("".join)


def _repeat(unit: str, length: int) -> str:
    return (unit * (length // len(unit) + 1))[:length]


def text_of_length(lengths: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    return st.builds(_repeat, st.text(characters, min_size=1, max_size=3), lengths)


def _of_bytes(unit: str, size: int) -> str:
    """``unit`` repeated while it fits in ``size`` bytes of UTF-8 (a surrogate counted as 3)."""
    text, used = [], 0
    for character in itertools.cycle(unit):
        width = len(character.encode("utf-8", "surrogatepass"))
        if used + width > size:
            return "".join(text)
        text.append(character)
        used += width
    raise AssertionError("unreachable")


def text_of_bytes(sizes: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    return st.builds(_of_bytes, st.text(characters, min_size=1, max_size=3), sizes)


long_text = st.one_of(
    text_of_length(st.integers(CONTENT_LIMIT - 2, CONTENT_LIMIT + 2)),  # right at the limit
    text_of_length(st.integers(CONTENT_LIMIT * 3, CONTENT_LIMIT * 30)),  # far beyond it
)
wrong_types = st.one_of(
    st.none(),
    st.binary(max_size=8),
    st.builds(bytearray, st.binary(max_size=4)),
    st.integers(),
    st.booleans(),
    st.floats(),
    st.lists(st.text(max_size=3), max_size=2),
    st.tuples(st.just("user")),
    st.builds(object),
)

roles = st.one_of(
    st.sampled_from(["user", "assistant", "system", "tool"]),
    short_text,
    text_of_length(st.integers(MAX_ROLE_CHARS - 2, MAX_ROLE_CHARS + 2)),
    long_text,
    wrong_types,
)
contents = st.one_of(short_text, long_text, wrong_types)
ids = st.one_of(
    st.just(DEFAULT),
    short_text,
    text_of_bytes(st.integers(MAX_EPISODE_ID_BYTES - 4, MAX_EPISODE_ID_BYTES + 4)),
    long_text,
    wrong_types,
)


class NoOffset(tzinfo):
    """A tzinfo that does not know its offset: the datetime is not really aware."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        return None


LARGEST_OFFSET = timedelta(hours=24) - timedelta(microseconds=1)
zones = st.one_of(
    st.just(UTC),
    st.timedeltas(min_value=-LARGEST_OFFSET, max_value=LARGEST_OFFSET)
    .filter(lambda offset: not timedelta(0) < abs(offset) < timedelta(seconds=1))  # a known bug, pinned below
    .map(timezone),
    st.sampled_from(["Europe/Lisbon", "America/St_Johns", "Asia/Kathmandu", "Pacific/Chatham"]).map(ZoneInfo),
)
created_ats = st.one_of(
    st.just(DEFAULT),
    st.datetimes(timezones=zones),  # datetime.min .. datetime.max, any offset
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(NoOffset())),
    st.dates(),
    st.datetimes(timezones=zones).map(datetime.isoformat),
    st.integers(),
    st.floats(),
)
seqs = st.one_of(
    st.just(DEFAULT),
    st.none(),
    st.integers(-2, 2**70),
    st.integers(MAX_SEQ - 2, MAX_SEQ + 2),
    st.booleans(),
    st.floats(),
    st.text(max_size=2),
)

json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    short_text,
)
# Only str keys and lists below the top level: nested non-str keys and tuples are
# known to change on the way through the store (see the xfail tests below).
json_values = st.recursive(
    json_leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(short_text, inner, max_size=4)),
    max_leaves=12,
)
not_json = st.one_of(
    st.sets(st.integers(), min_size=1, max_size=2),
    st.frozensets(st.text(max_size=2), max_size=2),
    st.binary(max_size=4),
    st.datetimes(),
    st.builds(object),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.builds(pow, st.just(10), st.integers(4300, 4400)),  # more digits than int -> str conversion allows
    st.dictionaries(st.tuples(st.integers()), json_leaves, min_size=1, max_size=1),  # tuple keys
)
hostile_values = st.recursive(
    st.one_of(json_leaves, not_json),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(short_text, inner, max_size=3)),
    max_leaves=6,
)


def nested(depth: int) -> dict[str, Any]:
    value: Any = "bottom"
    for level in range(depth):
        value = {f"level {level}": value} if level % 2 else [value]
    return {"deep": value}


def sized(unit: str, length: int) -> dict[str, str]:
    return {"k": _repeat(unit, length)}


metadatas = st.one_of(
    st.just(DEFAULT),
    st.dictionaries(short_text, json_values, max_size=5),
    st.dictionaries(short_text, hostile_values, min_size=1, max_size=3),
    st.dictionaries(
        st.one_of(st.integers(), st.none(), st.booleans(), st.floats(), st.tuples(st.integers()), st.binary()),
        json_leaves,
        min_size=1,
        max_size=2,
    ),
    # Around max_metadata_bytes, which counts UTF-8 bytes of the JSON, not characters.
    st.builds(sized, st.sampled_from(["v", "é", "\U0001f9e0", "\x00", '"']), st.integers(0, METADATA_LIMIT)),
    st.integers(0, 150).map(nested),
    st.builds(MappingProxyType, st.dictionaries(st.text(max_size=5), json_leaves, max_size=3)),
    st.one_of(st.lists(json_leaves, max_size=2), st.text(max_size=5), st.none(), st.integers(), st.just([("k", "v")])),
)

HOSTILE = {"role": roles, "content": contents, "id": ids, "created_at": created_ats, "metadata": metadatas, "seq": seqs}
SANE = {
    "role": st.sampled_from(["user", "assistant"]),
    "content": st.text(st.characters(), min_size=1, max_size=20).filter(str.strip),
    "id": st.just(DEFAULT),
    "created_at": st.one_of(st.just(DEFAULT), st.datetimes(timezones=zones)),
    "metadata": st.one_of(st.just(DEFAULT), st.dictionaries(st.text(max_size=5), json_leaves, max_size=3)),
    "seq": st.just(DEFAULT),
}
all_hostile = st.fixed_dictionaries(HOSTILE)
one_hostile = st.sampled_from(sorted(HOSTILE)).flatmap(
    lambda name: st.fixed_dictionaries({**SANE, name: HOSTILE[name]})
)
sane = st.fixed_dictionaries(SANE)
# One episode with one hostile field (or every field hostile, or none), between sane ones.
batches = st.tuples(
    st.lists(sane, max_size=1), st.one_of(one_hostile, all_hostile, sane), st.lists(sane, max_size=1)
).map(lambda parts: [*parts[0], parts[1], *parts[2]])

session_ids = st.one_of(
    short_text,
    st.sampled_from(
        ["s", "alice/chat-1", " s", "s ", "S", "\x00", "a\x00b", "e\u0301", "\u00e9", "'; DROP TABLE x; --"]
    ),
    text_of_bytes(st.integers(MAX_SESSION_ID_BYTES - 4, MAX_SESSION_ID_BYTES + 4)),
    st.integers(MAX_SESSION_ID_BYTES - 2, MAX_SESSION_ID_BYTES + 2).map(lambda length: "s" * length),
    wrong_types,
)


# -- the properties --------------------------------------------------------------------


Seen = list[tuple[int, tuple]]  # (seq, fingerprint) of each episode, in order


def expected_after_add(batch: list[Episode], first_seq: int) -> tuple[Seen, Seen]:
    """What a fresh session must store for ``batch``, and what add must return (a repeated id is stored once)."""
    stored: dict[str, tuple[int, tuple]] = {}
    returned = []
    for episode in batch:
        if episode.id not in stored:
            stored[episode.id] = (first_seq + len(stored), fingerprint(episode))
        returned.append(stored[episode.id])
    return list(stored.values()), returned


@BACKENDS
def test_every_episode_is_stored_exactly_or_refused_whole(backend: str, store_url: str, rows: StoreRows) -> None:
    ledger = Ledger()
    fresh = itertools.count()
    outcomes = {"stored": 0, "refused": 0}

    with engine_in_portal(backend, store_url) as (portal, engine):

        @examples(150)
        @given(specs=batches)
        def add_batch(specs: list[dict[str, Any]]) -> None:
            session_id = f"episodes-{next(fresh)}"
            session = engine.session(session_id)
            should_store = all(spec_ok(spec) for spec in specs)
            try:
                batch = [build(spec) for spec in specs]
                returned = portal.call(session.add, batch)
            except (ValueError, TypeError) as refusal:
                assert not should_store, f"a valid batch was refused: {refusal!r}"
                assert_clear_refusal(refusal)
                outcomes["refused"] += 1
                assert rows.query("SELECT count(*) FROM sessions WHERE session_id = ?", session_id) == [(0,)]
                ledger.check_rows(rows, session_id)
                return
            assert should_store, f"an invalid batch was stored: {specs!r}"
            outcomes["stored"] += 1
            expected, expected_return = expected_after_add(batch, first_seq=1)
            assert [(e.seq, fingerprint(e)) for e in returned] == expected_return
            context = portal.call(session.context)
            assert [(e.seq, fingerprint(e)) for e in context.episodes] == expected
            ledger.record(session_id, expected)
            ledger.check_rows(rows, session_id)

        add_batch()

    anyio.run(ledger.check_reopened, store_url, backend=backend)
    assert outcomes["stored"] and outcomes["refused"]  # the strategies reach both sides


@BACKENDS
def test_metadata_is_stored_exactly_or_refused(backend: str, store_url: str, rows: StoreRows) -> None:
    ledger = Ledger()
    fresh = itertools.count()

    with engine_in_portal(backend, store_url) as (portal, engine):

        @examples(150)
        @given(metadata=metadatas.filter(lambda value: value is not DEFAULT))
        def add_metadata(metadata: Any) -> None:
            session_id = f"metadata-{next(fresh)}"
            try:
                episode = Episode("user", "metadata probe", metadata=metadata)
                (returned,) = portal.call(engine.session(session_id).add, [episode])
            except (ValueError, TypeError) as refusal:
                assert not metadata_ok(metadata), f"valid metadata was refused: {refusal!r}"
                assert_clear_refusal(refusal)
                ledger.check_rows(rows, session_id)
                return
            assert metadata_ok(metadata), f"invalid metadata was stored: {metadata!r}"
            assert exact(returned.metadata) == exact(dict(metadata))
            ledger.record(session_id, [(1, fingerprint(episode))])
            ledger.check_rows(rows, session_id)

        add_metadata()

    anyio.run(ledger.check_reopened, store_url, backend=backend)


@BACKENDS
def test_every_session_id_is_used_exactly_or_refused(backend: str, store_url: str, rows: StoreRows) -> None:
    ledger = Ledger()
    probes = itertools.count()

    with engine_in_portal(backend, store_url) as (portal, engine):

        @examples(100)
        @given(session_id=session_ids)
        def add_to(session_id: Any) -> None:
            # The same id may come up twice: the ledger knows what it already holds.
            episode = Episode("user", f"probe {next(probes)}")
            try:
                session = engine.session(session_id)
            except (ValueError, TypeError) as refusal:
                assert not session_id_ok(session_id), f"a valid session id was refused: {refusal!r}"
                assert_clear_refusal(refusal)
                assert rows.query("SELECT count(*) FROM episodes") == [(ledger.total,)]
                return
            assert session_id_ok(session_id), f"an invalid session id was accepted: {session_id!r}"
            (returned,) = portal.call(session.add, [episode])
            seq = len(ledger.of(session_id)) + 1
            assert (returned.seq, fingerprint(returned)) == (seq, fingerprint(episode))
            ledger.record(session_id, [(seq, fingerprint(episode))])
            context = portal.call(session.context)
            assert context.session_id == session_id
            assert [(e.seq, fingerprint(e)) for e in context.episodes] == ledger.of(session_id)
            ledger.check_rows(rows, session_id)

        add_to()

    anyio.run(ledger.check_reopened, store_url, backend=backend)


def _not_empty(argument: Any) -> bool:
    # An empty iterable is a valid (empty) batch, whatever its type.
    return not (isinstance(argument, (list, tuple, dict, bytearray)) and len(argument) == 0)


not_a_batch = st.one_of(
    wrong_types.filter(_not_empty),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2),
    st.builds(lambda: Episode("user", "a bare episode, not a list")),
    st.lists(
        st.one_of(st.builds(lambda: Episode("user", "fine")), wrong_types, st.text(max_size=3)), min_size=1
    ).filter(lambda items: not all(isinstance(item, Episode) for item in items)),
)


@BACKENDS
def test_add_refuses_anything_but_an_iterable_of_episodes(backend: str, store_url: str, rows: StoreRows) -> None:
    fresh = itertools.count()

    with engine_in_portal(backend, store_url) as (portal, engine):

        @examples(50)
        @given(argument=not_a_batch)
        def add_wrongly(argument: Any) -> None:
            session_id = f"arguments-{next(fresh)}"
            with pytest.raises(TypeError) as refusal:
                portal.call(engine.session(session_id).add, argument)
            assert_clear_refusal(refusal.value)
            assert rows.query("SELECT count(*) FROM episodes") == [(0,)]
            assert rows.query("SELECT count(*) FROM sessions") == [(0,)]

        add_wrongly()


@pytest.mark.anyio
async def test_default_limits_are_exact_at_the_boundary(store_url: str, rows: StoreRows) -> None:
    limits = SessionConfig(evict_to=1.0, max_chars=10**8)  # default size limits; a window that keeps everything raw
    at_limit = Episode("user", "\U0001f9e0" * limits.max_content_chars)  # characters, not bytes
    # {"k": "..."} is 9 bytes of JSON around the value; "é" is 2 bytes of UTF-8.
    metadata_at_limit = Episode("user", "m", metadata={"k": "é" * ((limits.max_metadata_bytes - 9) // 2) + "v"})
    async with open_engine(store_url, config=limits) as engine:
        session = engine.session("limits")
        returned = await session.add([at_limit, metadata_at_limit])
        assert [fingerprint(e) for e in returned] == [fingerprint(at_limit), fingerprint(metadata_at_limit)]
        with pytest.raises(ValueError, match="max_content_chars=4000000"):
            await session.add([Episode("user", "fits"), Episode("user", "x" * (limits.max_content_chars + 1))])
        with pytest.raises(ValueError, match="max_metadata_bytes=16384"):
            await session.add([Episode("user", "m", metadata={"k": "é" * ((limits.max_metadata_bytes - 8) // 2)})])
    assert [content for _, content in episodes_of(rows, "limits")] == [at_limit.content, "m"]
    async with open_engine(store_url, config=limits) as engine:
        restored = (await engine.session("limits").context()).episodes
    assert [fingerprint(e) for e in restored] == [fingerprint(at_limit), fingerprint(metadata_at_limit)]


# -- known bugs ------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "metadata",
    [
        {"scores": {1: "one", 2: "two"}},
        {"flags": {None: "unset", True: "yes"}},
        {"ids": {1: "int key", "1": "str key"}},  # two keys before, one after
        {"point": (3, 4)},
    ],
    ids=["int-keys", "none-and-bool-keys", "colliding-keys", "tuple"],
)
async def test_nested_metadata_comes_back_as_it_went_in_or_is_refused(store_url: str, metadata: dict) -> None:
    async with open_engine(store_url) as engine:
        try:
            episode = Episode("user", "nested metadata", metadata=metadata)
            (returned,) = await engine.session("s").add([episode])
        except (ValueError, TypeError):
            return  # refusing it would be fine too
        assert exact(returned.metadata) == exact(metadata)
    async with open_engine(store_url) as engine:
        (restored,) = (await engine.session("s").context()).episodes
    assert exact(restored.metadata) == exact(metadata)


def test_too_deeply_nested_metadata_is_refused_with_a_value_error() -> None:
    with pytest.raises((ValueError, TypeError)):
        Episode("user", "deep", metadata=nested(10_000))


@pytest.mark.anyio
async def test_metadata_made_invalid_after_construction_is_refused_without_harm(
    store_url: str, rows: StoreRows
) -> None:
    try:
        async with open_engine(store_url) as engine:
            await engine.session("s").add([Episode("user", "before")])
            poisoned = Episode("user", "poisoned", metadata={"score": 0.5})
            poisoned.metadata["score"] = math.nan  # the dict is the caller's to change
            with anyio.fail_after(60), pytest.raises(ValueError):
                await engine.session("s").add([poisoned])
            await engine.session("other").add([Episode("user", "after")])
    except ExceptionGroup as group:
        crash = group.subgroup(ValueError)
        if crash is not None:
            raise AssertionError(f"the engine went down with {crash!r}") from None
        raise
    assert episodes_of(rows, "s") == [(1, "before")]
    assert episodes_of(rows, "other") == [(1, "after")]


@pytest.mark.anyio
async def test_context_shows_what_was_stored_not_later_edits(store_url: str) -> None:
    tags = ["first"]
    async with open_engine(store_url) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "tagged", metadata={"tags": tags})])
        tags.append("edited after add")  # the caller reuses its own list
        (shown,) = (await session.context()).episodes
    assert shown.metadata == {"tags": ["first"]}


@pytest.mark.anyio
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="created_at is stored as isoformat() and read back with datetime.fromisoformat(), which (CPython "
    "3.11-3.13) reads an offset under one second, like +00:00:00.000001, as +00:00: the instant moves",
)
async def test_created_at_with_a_sub_second_offset_comes_back_exactly(store_url: str) -> None:
    created_at = datetime(2000, 1, 1, tzinfo=timezone(timedelta(microseconds=1)))
    async with open_engine(store_url) as engine:
        await engine.session("s").add([Episode("user", "odd offset", created_at=created_at)])
    async with open_engine(store_url) as engine:
        (restored,) = (await engine.session("s").context()).episodes
    assert (restored.created_at, restored.created_at.utcoffset()) == (created_at, created_at.utcoffset())


# -- the hardening issue's cases, on both stores ------------------------------------------


def four_byte_text(length: int, seed: int) -> str:
    """``length`` random 4-byte characters: text PostgreSQL cannot compress inside an index entry."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x10000, 0x110000)) for _ in range(length))


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["role", "id"])
async def test_a_huge_role_or_id_is_refused_and_nothing_is_stored(store_url: str, rows: StoreRows, field: str) -> None:
    huge = "r" * 5_000_000
    async with open_engine(store_url) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "kept")])
        with pytest.raises(ValueError, match=rf"Episode\.{field}"):
            await session.add([Episode(huge, "x") if field == "role" else Episode("user", "x", id=huge)])
        assert [e.content for e in (await session.context()).episodes] == ["kept"]
    assert rows.query("SELECT seq, content FROM episodes") == [(1, "kept")]


@pytest.mark.anyio
@pytest.mark.parametrize("field", ["role", "content", "id", "session id", "owner"])
async def test_nul_is_refused_in_every_text_field_on_every_store(
    store_url: str, rows: StoreRows, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite could store NUL and PostgreSQL cannot: both refuse it, before anything is stored."""
    with_nul = "a\x00b"
    if field == "owner":
        with pytest.raises(ValueError, match=r"owner.*NUL"):
            async with open_engine(store_url, owner=with_nul):
                pass
        return
    async with open_engine(store_url) as engine:
        await engine.session("s").add([Episode("user", "kept")])
        with pytest.raises(ValueError, match=rf"{field}.*NUL"):
            if field == "session id":
                await engine.session(with_nul).add([Episode("user", "x")])
            else:
                fields = {"role": "user", "content": "x", "id": "e1", field: with_nul}
                await engine.session("s").add([Episode(fields["role"], fields["content"], id=fields["id"])])
    assert rows.query("SELECT session_id, content FROM episodes") == [("s", "kept")]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.anyio
async def test_an_id_of_1024_four_byte_characters_is_refused_not_failed_in_the_store(
    store_url: str, rows: StoreRows
) -> None:
    """4,096 bytes of UTF-8 exceed PostgreSQL's btree entry limit: a ValueError, on both stores alike."""
    too_long = four_byte_text(1024, seed=1)
    async with open_engine(store_url) as engine:
        with pytest.raises(ValueError, match=r"Episode\.id"):
            await engine.session("s").add([Episode("user", "x", id=too_long)])
        with pytest.raises(ValueError, match="session id"):
            await engine.session(too_long).add([Episode("user", "x")])
    assert rows.query("SELECT count(*) FROM episodes") == [(0,)]


@pytest.mark.anyio
async def test_seqs_and_recall_limits_beyond_64_bits_are_refused_with_a_value_error(
    store_url: str, rows: StoreRows
) -> None:
    async with open_engine(store_url) as engine:
        session = engine.session("s")
        await session.add([Episode("user", "kept")])
        with pytest.raises(ValueError, match="seq"):
            await session.delete_episodes([1, 2**63])
        with pytest.raises(ValueError, match="limit"):
            await engine.recall("kept", all_sessions=True, limit=2**63)
        assert [hit.episode.content for hit in await engine.recall("kept", all_sessions=True)] == ["kept"]
    assert rows.query("SELECT seq, content FROM episodes") == [(1, "kept")]


@pytest.mark.anyio
async def test_names_of_four_byte_characters_at_their_limit_are_stored_and_one_more_is_refused(
    store_url: str,
    rows: StoreRows,
) -> None:
    """Both names at their byte limits in one row: the largest entry of PostgreSQL's (id, session_id) index."""
    session_id = four_byte_text(MAX_SESSION_ID_BYTES // 4, seed=2)
    episode_id = four_byte_text(MAX_EPISODE_ID_BYTES // 4, seed=3)
    role = four_byte_text(MAX_ROLE_CHARS, seed=4)
    async with open_engine(store_url, owner=four_byte_text(MAX_OWNER_BYTES // 4, seed=5)) as engine:
        session = engine.session(session_id)
        (stored,) = await session.add([Episode(role, "at every limit", id=episode_id)])
        assert (stored.seq, stored.id, stored.role) == (1, episode_id, role)
        with pytest.raises(ValueError, match=f"session id is at most {MAX_SESSION_ID_BYTES} bytes"):
            engine.session(session_id + "\U0001f9e0")
        with pytest.raises(ValueError, match=rf"Episode\.id is at most {MAX_EPISODE_ID_BYTES} bytes"):
            Episode("user", "x", id=episode_id + "x")
        with pytest.raises(ValueError, match=rf"Episode\.role is at most {MAX_ROLE_CHARS} characters"):
            Episode(role + "x", "x")
    with pytest.raises(ValueError, match=f"owner is at most {MAX_OWNER_BYTES} bytes"):
        async with open_engine(store_url, owner="o" * (MAX_OWNER_BYTES + 1)):
            pass
    assert rows.query("SELECT session_id, id, role, content FROM episodes") == [
        (session_id, episode_id, role, "at every limit")
    ]
    async with open_engine(store_url) as engine:
        (restored,) = (await engine.session(session_id).context()).episodes
    assert (restored.id, restored.role) == (episode_id, role)


@pytest.mark.anyio
async def test_seqs_and_recall_limits_are_exact_at_their_bounds(store_url: str, rows: StoreRows) -> None:
    async with open_engine(store_url) as engine:
        session = engine.session("s")
        await session.add([with_seq(Episode("user", "a dog barked"), MAX_SEQ)])  # the seq of one read back is not used
        assert await session.delete_episodes([MAX_SEQ]) == 0  # a seq that was never stored
        with pytest.raises(ValueError, match=f"a seq must be between 1 and {MAX_SEQ}"):
            await session.delete_episodes([MAX_SEQ + 1])
        with pytest.raises(TypeError, match=r"Episode\.seq is assigned by the store"):
            Episode("user", "x", seq=MAX_SEQ)
        assert [hit.episode.seq for hit in await engine.recall("dog", all_sessions=True, limit=MAX_RECALL_LIMIT)] == [1]
        for limit in (0, MAX_RECALL_LIMIT + 1):
            with pytest.raises(ValueError, match=f"limit must be between 1 and {MAX_RECALL_LIMIT}"):
                await engine.recall("dog", all_sessions=True, limit=limit)
        with pytest.raises(TypeError, match="limit must be an int"):
            await engine.recall("dog", all_sessions=True, limit=True)
    assert rows.query("SELECT seq, content FROM episodes") == [(1, "a dog barked")]


@pytest.mark.anyio
async def test_nul_in_metadata_is_stored_as_a_json_escape_on_every_store(store_url: str, rows: StoreRows) -> None:
    metadata = {"NUL \x00 key": "NUL \x00 value"}
    async with open_engine(store_url) as engine:
        await engine.session("s").add([Episode("user", "x", metadata=metadata)])
    assert rows.query("SELECT metadata FROM episodes") == [(json.dumps(metadata, ensure_ascii=False),)]
    async with open_engine(store_url) as engine:
        (restored,) = (await engine.session("s").context()).episodes
    assert restored.metadata == metadata
