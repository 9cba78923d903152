"""The PostgreSQL schema and its migrations.

Migrations only add. Each runs in one transaction that first takes a
transaction-scoped advisory lock, so any number of processes booting against
a fresh database at once migrate it exactly once (the others wait, then find
it done). ``memengine_schema`` records how far a database has come and the
lowest code version that may run against it (as ``compatible_back``, how many
versions older that code may be; see schema_window.py): a database newer than this code is refused unless its
window reaches back to this code.

Opening a store reads the version first, without the lock, and runs no DDL
and no write at all when the database is current: a role with only data
rights (SELECT, INSERT, UPDATE, DELETE on the tables, USAGE on the schema and
its sequences) can serve. A database that is behind is migrated at open by a
role that may (the quick start), else the open fails with a
:class:`~memengine.errors.StoreError` that says to run ``memengine migrate
URL`` as a role that owns the schema.

Which schema: :func:`find_schema` looks once, when the store opens, for the
first schema of the connection's ``search_path`` that holds
``memengine_schema`` (or, if none does, takes ``current_schema()`` to create
the tables in), refuses a ``search_path`` in which two schemas hold
memengine's tables, and the store pins every connection to that schema.

Locks: a migration runs with the connection's ``lock_timeout`` (5 s by
default), so a migration that must wait for a lock fails (retry it) instead
of queueing every replica's statements behind its own. Each migration
below says what it locks; run the ones that lock tables the replicas use
(``ALTER TABLE``) with ``memengine migrate`` at a quiet moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ...errors import StoreError
from ..handover import WANTED_COLUMN
from ..leases import TOKEN_FLOOR_TABLE
from ..owners import OWNERS_INDEX, OWNERS_TABLE
from ..schema_window import check_newer, compatible_from
from ..segments import SEGMENTS_SCHEMA

#: The advisory lock key every memengine process takes while migrating ("memengine" in ASCII, truncated).
MIGRATION_LOCK = 0x6D656D656E67696E & 0x7FFFFFFFFFFFFFFF
#: How long a process waits for another's migration to finish (its statements keep their lock_timeout).
MIGRATION_LOCK_WAIT = "60s"

_JOURNAL = (
    "CREATE TABLE sessions ("
    "  session_id text PRIMARY KEY,"
    "  generation bigint NOT NULL DEFAULT 0,"  # changes on every clear/delete; fences stale summaries
    "  seq_floor bigint NOT NULL DEFAULT 0,"  # highest seq ever assigned, kept across clear
    "  retained_through bigint NOT NULL DEFAULT 0)",  # retain watermark
    "CREATE TABLE episodes ("
    "  session_id text NOT NULL, seq bigint NOT NULL, id text NOT NULL, role text NOT NULL,"
    "  content text NOT NULL, created_at text NOT NULL, metadata text NOT NULL,"
    "  PRIMARY KEY (session_id, seq))",
    # Idempotency of add, per session (the id leads: default ids are time-ordered).
    "CREATE UNIQUE INDEX episodes_by_id ON episodes (id, session_id)",
    # Full-text recall; GIN's pending list keeps inserts cheap.
    "CREATE INDEX episodes_text ON episodes USING gin (to_tsvector('simple', content))",
    "CREATE TABLE summaries ("
    "  session_id text NOT NULL, through_seq bigint NOT NULL, generation bigint NOT NULL,"
    "  summary text NOT NULL, created_at text NOT NULL,"
    "  PRIMARY KEY (session_id, through_seq))",
    "CREATE TABLE retain_outbox ("
    "  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    "  session_id text NOT NULL, first_seq bigint NOT NULL, last_seq bigint NOT NULL,"
    "  mode text NOT NULL, key text NOT NULL, episodes text NOT NULL,"
    "  created_at double precision NOT NULL, attempts integer NOT NULL DEFAULT 0, last_error text,"
    "  claimed_by text, claim_until double precision)",
    "CREATE INDEX retain_outbox_by_session ON retain_outbox (session_id, id)",
    "CREATE TABLE session_leases ("
    "  session_id text PRIMARY KEY, owner text, token bigint NOT NULL, expires_at double precision NOT NULL)",
    "CREATE INDEX session_leases_by_owner ON session_leases (owner)",
    # The leases still held (not released), by expiry: where the orphan sweep looks.
    "CREATE INDEX session_leases_held ON session_leases (expires_at) WHERE owner IS NOT NULL",
)


@attrs.frozen
class Migration:
    """One step of the schema: its statements, whether older code survives it, and what it locks."""

    statements: tuple[str, ...]
    #: Code from before this migration keeps working, unchanged, against the schema it leaves.
    additive: bool
    #: What the migration locks while it runs (for whoever runs it on a live database).
    locks: str

    def __call__(self, conn: Any) -> None:
        for statement in self.statements:
            conn.execute(statement)


_UNFINISHED_APPENDS = (
    # Adds too large for one transaction, while their parts are being stored (see store/unfinished.py).
    "CREATE TABLE unfinished_appends (session_id text NOT NULL, first_seq bigint NOT NULL,"
    "  PRIMARY KEY (session_id, first_seq))",
)

_RETAIN_RETRY_TIMES = (
    # When a refused batch may be tried again (unix seconds, the database's clock;
    # NULL: at once). Every process sharing the store leaves it alone until then.
    "ALTER TABLE retain_outbox ADD COLUMN retry_at double precision",
)

_EVICTION_BOUNDARIES = (
    # The newest seq evicted from each session's raw window (session/window.py): a reload shows the same window.
    "ALTER TABLE sessions ADD COLUMN evicted_through bigint NOT NULL DEFAULT 0",
)

#: Characters of an episode that PostgreSQL's recall index covers: a tsvector holds at most 1 MB, which
#: text of short distinct words reaches from about 340,000 characters (3 bytes each, measured).
RECALL_PREFIX_CHARS = 200_000

_BOUNDED_RECALL_INDEX = (
    "DROP INDEX episodes_text",
    f"CREATE INDEX episodes_text ON episodes USING gin (to_tsvector('simple', left(content, {RECALL_PREFIX_CHARS})))",
)

_ENGINE_OWNERS = (OWNERS_TABLE, OWNERS_INDEX, WANTED_COLUMN)

_SET_ASIDE = (
    # Work given up on after too many failed rounds (store/set_aside.py): a session's summary batch
    # (valid for one generation of the session), and a retain batch (set_aside_at: unix seconds).
    "CREATE TABLE summaries_set_aside (session_id text PRIMARY KEY, generation bigint NOT NULL,"
    "  through_seq bigint NOT NULL, attempts integer NOT NULL, error text NOT NULL,"
    "  set_aside_at double precision NOT NULL)",
    "ALTER TABLE retain_outbox ADD COLUMN set_aside_at double precision",
)

_FORGETS = (
    # How far the session's episodes may have reached the sink: the newest seq of a batch ever claimed
    # for sending. A delete or clear of an episode up to here records a forget (store/outbox.py).
    # Existing sessions count every recorded episode as handed on: a forget too many does no harm.
    "ALTER TABLE sessions ADD COLUMN handed_through bigint NOT NULL DEFAULT 0",
    "UPDATE sessions SET handed_through = retained_through",
    # A forget's seqs (JSON list; NULL: the whole session), on rows whose mode is 'forget'.
    "ALTER TABLE retain_outbox ADD COLUMN forget_seqs text",
)

MIGRATIONS: list[Migration] = [
    # Everything: there is no older code to keep working.
    Migration(_JOURNAL, additive=False, locks="nothing that exists (creates the tables)"),
    # Older code would neither finish nor clean up an add left in parts.
    Migration(_UNFINISHED_APPENDS, additive=False, locks="nothing that exists (creates a table)"),
    # Older code would send a refused batch again at once, ignoring the delay.
    Migration(
        _RETAIN_RETRY_TIMES,
        additive=False,
        locks="retain_outbox, ACCESS EXCLUSIVE, briefly (a nullable column without a default: no rewrite)",
    ),
    # Older code ignores the boundary (it is a hint: the window's rules apply again on load).
    Migration(
        _EVICTION_BOUNDARIES,
        additive=True,
        locks="sessions, ACCESS EXCLUSIVE, briefly (a constant default: no rewrite since PostgreSQL 11)",
    ),
    # Older code searches with the whole content: correct, without the index's help.
    Migration(
        _BOUNDED_RECALL_INDEX,
        additive=True,
        locks="episodes, SHARE while the text index is rebuilt (writes wait; minutes on a large journal)",
    ),
    # Older code ignores the running engines (its owners are never found dead: their leases expire)
    # and the wanted marks (it never hands a session over; a takeover by newer code clears the mark).
    Migration(
        _ENGINE_OWNERS,
        additive=True,
        locks="session_leases, ACCESS EXCLUSIVE, briefly (a nullable column without a default: no rewrite)",
    ),
    # Older code ignores the marks: it retries set-aside work for ever, as it always did.
    Migration(
        _SET_ASIDE,
        additive=True,
        locks="retain_outbox, ACCESS EXCLUSIVE, briefly (a nullable column without a default: no rewrite)",
    ),
    # Older code ignores the floor of new lease tokens (Engine.forget): a session newer code erased and older
    # code then takes starts its tokens at 1 again, which matters only to a process paused across the erasure.
    Migration((TOKEN_FLOOR_TABLE,), additive=True, locks="nothing that exists (creates a table)"),
    # Older code would hand a forget to the sink as an empty retain batch, and keep no track of what was
    # handed on.
    Migration(
        _FORGETS,
        additive=False,
        locks="sessions, ROW EXCLUSIVE on every row (one UPDATE of them all) and ACCESS EXCLUSIVE briefly; "
        "retain_outbox, ACCESS EXCLUSIVE, briefly (a nullable column: no rewrite)",
    ),
    # Segment summaries (store/segments.py), and where a set-aside summary batch starts when it is a repair of
    # one of them (NULL: after the summary). Older code would leave a segmented session's segments behind on
    # a delete, a clear or an erasure.
    Migration(
        (*SEGMENTS_SCHEMA, "ALTER TABLE summaries_set_aside ADD COLUMN first_seq bigint"),
        additive=False,
        locks="summaries_set_aside, ACCESS EXCLUSIVE, briefly (a nullable column: no rewrite)",
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)

_SCHEMA_TABLE = (
    "CREATE TABLE memengine_schema (id integer PRIMARY KEY CHECK (id = 1), version integer NOT NULL,"
    "  compatible_back integer)"
)
# Schemas of search_path (in its order) that hold memengine's bookkeeping table.
_SCHEMAS_WITH_TABLES = (
    "SELECT s.name FROM unnest(current_schemas(false)) WITH ORDINALITY AS s(name, position)"
    " JOIN pg_namespace n ON n.nspname = s.name"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = 'memengine_schema' AND c.relkind IN ('r', 'p')"
    " ORDER BY s.position"
)
_INSUFFICIENT_PRIVILEGE = "42501"


@attrs.frozen
class SchemaState:
    """How far a database has come: its version (0: no tables) and ``compatible_from`` (``None``: not recorded)."""

    version: int
    compatible_from: int | None


def find_schema(conn: Any) -> str:
    """The schema memengine's tables are in (or are to be created in), for ``conn``'s ``search_path``."""
    found = [name for (name,) in conn.execute(_SCHEMAS_WITH_TABLES).fetchall()]
    if len(found) > 1:
        listed = ", ".join(found)
        raise StoreError(
            f"memengine's tables are in more than one schema of the search_path ({listed}); "
            "refusing to guess which holds the sessions: name one schema in the URL "
            "(?options=-csearch_path%3D<schema>) or drop the tables that are not in use"
        )
    if found:
        return str(found[0])
    (current,) = conn.execute("SELECT current_schema()").fetchone()
    if current is None:
        (search_path,) = conn.execute("SHOW search_path").fetchone()
        raise StoreError(
            f"no schema of the search_path ({search_path}) exists (or this role has USAGE on none of them) "
            "to find or create memengine's tables in: create one (or grant USAGE on it), or name one in "
            "the URL (?options=-csearch_path%3D<schema>)"
        )
    return str(current)


def read_state(conn: Any) -> SchemaState:
    """The version recorded in ``conn``'s (pinned) schema, without locking or writing anything."""
    if not _has_schema_table(conn):
        return SchemaState(0, None)
    row = conn.execute("SELECT to_jsonb(s) FROM memengine_schema s WHERE id = 1").fetchone()
    if row is None:
        return SchemaState(0, None)
    version = int(row[0]["version"])
    back = row[0].get("compatible_back")
    return SchemaState(version, None if back is None else version - int(back))


def prepare_schema(conn: Any, migrate_url: str) -> None:
    """Make sure code of :data:`SCHEMA_VERSION` can run on ``conn``'s schema, migrating only if it is behind.

    A current (or newer, compatible) database sees no DDL and no write. One
    that is behind is migrated if the role may; else the :class:`StoreError`
    names ``memengine migrate <migrate_url>`` (pass the URL without its password).
    """
    state: SchemaState | None = None
    try:
        state = read_state(conn)
        if state.version > SCHEMA_VERSION:
            check_newer(state.version, state.compatible_from, SCHEMA_VERSION)
        elif state.version < SCHEMA_VERSION:
            migrate(conn)
    except Exception as exc:
        if getattr(exc, "sqlstate", None) != _INSUFFICIENT_PRIVILEGE:
            raise
        (schema, user) = conn.execute("SELECT current_schema(), current_user").fetchone()
        reason = getattr(getattr(exc, "diag", None), "message_primary", None) or str(exc).splitlines()[0]
        if state is None:
            raise StoreError(
                f"role {user} may not read {schema}.memengine_schema ({reason}): grant it SELECT, INSERT, "
                f"UPDATE, DELETE on all tables in schema {schema} and USAGE on its sequences"
            ) from exc
        if state.version == 0:
            state_said = "has no memengine tables"
        else:
            state_said = f"is at schema version {state.version}"
        raise StoreError(
            f"schema {schema} {state_said}, this memengine needs version {SCHEMA_VERSION}, and role {user} "
            f"may not migrate it ({reason}): run `memengine migrate {migrate_url}` "
            "as a role that owns the schema"
        ) from exc


def migrate(conn: Any, migrations: Sequence[Migration] = MIGRATIONS) -> tuple[int, int]:
    """Bring ``conn``'s schema up to ``len(migrations)``; return the version before and after.

    ``conn`` is a psycopg connection in autocommit mode. Everything happens in
    one transaction under the advisory lock :data:`MIGRATION_LOCK`. A database
    newer than ``migrations`` is left as it is (and refused unless its window
    reaches this code).
    """
    target = len(migrations)
    with conn.transaction():
        _take_migration_lock(conn)
        table = _has_schema_table(conn)
        if not table:
            conn.execute(_SCHEMA_TABLE)
        state = read_state(conn)
        if state.version > target:
            check_newer(state.version, state.compatible_from, target)
            return state.version, state.version
        lowest = compatible_from([migration.additive for migration in migrations], target)
        if state.version == target and state.compatible_from == lowest:
            return target, target
        if table and "compatible_back" not in _columns(conn):
            # Not there in databases migrated before the window existed.
            conn.execute("ALTER TABLE memengine_schema ADD COLUMN compatible_back integer")
        for migration in migrations[state.version :]:
            migration(conn)
        conn.execute(
            "INSERT INTO memengine_schema (id, version, compatible_back) VALUES (1, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET version = excluded.version, compatible_back = excluded.compatible_back",
            (target, target - lowest),
        )
    return state.version, target


def _take_migration_lock(conn: Any) -> None:
    # Waiting for another process's migration blocks nobody else: it may wait longer than the
    # connection's lock_timeout (meant for the locks replicas queue behind), then the timeout is back.
    (lock_timeout,) = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    if lock_timeout != "0":
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (MIGRATION_LOCK_WAIT,))
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (lock_timeout,))


# Both read pg_class with the statement's snapshot, not through the backend's catalog cache (which
# to_regclass and ::regclass use): a table another process created while this one waited for the
# migration lock is seen.
_SCHEMA_TABLE_OID = (
    "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname = current_schema() AND c.relname = 'memengine_schema'"
)


def _has_schema_table(conn: Any) -> bool:
    return conn.execute(f"SELECT EXISTS ({_SCHEMA_TABLE_OID})").fetchone()[0] is True


def _columns(conn: Any) -> set[str]:
    rows = conn.execute(
        f"SELECT attname FROM pg_attribute WHERE attrelid = ({_SCHEMA_TABLE_OID}) AND attnum > 0 AND NOT attisdropped"
    ).fetchall()
    return {name for (name,) in rows}
