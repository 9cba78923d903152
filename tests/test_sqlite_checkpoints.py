"""SQLite's WAL is checkpointed beside the commits (store/sqlite/checkpoints.py), so the log stays small.

The writer connection does not checkpoint; if nothing else did, the log would
hold every page written since the store opened. Observed from outside: the
``-wal`` file's size, and that the database file itself holds the rows.
"""

from __future__ import annotations

import os
import sqlite3

import anyio
import pytest

from memengine import Episode, SessionConfig, open_engine
from memengine.store.sqlite.checkpoints import CHECKPOINT_DELAY

pytestmark = pytest.mark.anyio

CHUNKS = 8
PER_CHUNK = 100
TEXT = "word " * 400  # 2,000 characters


async def test_the_wal_is_copied_back_while_the_engine_runs(db_path) -> None:
    wal = f"{db_path}-wal"
    sizes = []
    config = SessionConfig(max_episodes=10_000, passivate_after=None)
    async with open_engine(db_path, config=config) as engine:
        session = engine.session("s")
        for chunk in range(CHUNKS):
            await session.add([Episode("user", f"{chunk} {n} {TEXT}") for n in range(PER_CHUNK)])
            await anyio.sleep(CHECKPOINT_DELAY * 3)  # the checkpoint after this commit has run
            sizes.append(os.stat(wal).st_size)
        # The rows are in the database file itself, not only in the log: a reader that
        # ignores the log (immutable) sees every one of them.
        immutable = sqlite3.connect(f"file:{db_path}?immutable=1", uri=True)
        try:
            (in_file,) = immutable.execute("SELECT count(*) FROM episodes").fetchone()
        finally:
            immutable.close()
    assert in_file == CHUNKS * PER_CHUNK
    # The log is started over once copied back: it stays about one chunk's size, not all of them.
    assert max(sizes) < 3 * sizes[0], sizes


async def test_the_wal_stays_small_under_writes_that_never_pause(db_path, monkeypatch) -> None:
    """One add right after another, never a pause: the log is still started over, not grown with every commit.

    A checkpoint on a connection of its own, beside the writes, copied the log
    back but was always behind the newest commit, so the writer never started
    the log over: it grew by every commit's pages for as long as the writes
    went on (and, at ``synchronous=FULL``, every commit's fsync also grew the
    file). Written here: adds for at least 40 checkpoint delays; the log's
    header counts how often it was started over (its size, by how many adds
    came in the last delay, depends on the machine's speed).
    """
    from memengine.store.sqlite import checkpoints

    monkeypatch.setattr(checkpoints, "CHECKPOINT_DELAY", 0.01)
    config = SessionConfig(max_episodes=10_000, passivate_after=None)
    adds = 0
    wal = f"{db_path}-wal"
    async with open_engine(db_path, config=config) as engine:
        session = engine.session("s")
        started = anyio.current_time()
        while adds < 200 or anyio.current_time() - started < 40 * checkpoints.CHECKPOINT_DELAY:
            await session.add([Episode("user", f"{adds} {TEXT}")])
            adds += 1
        header = (await anyio.Path(wal).read_bytes())[:32]
    started_over = int.from_bytes(header[12:16], "big")  # the header's checkpoint sequence number
    assert started_over >= 5, (started_over, adds)


def test_the_checkpoint_beside_the_commits_says_whether_a_reader_held_part_of_the_log_back(tmp_path) -> None:
    """Only a checkpoint that copied all of the log is followed by the one between commits.

    With a reader still reading from the log as it was, the rest waits for it;
    copied between two commits once the reader let go, it would hold up the
    writes for as long as copying all of it takes.
    """
    from memengine.store.sqlite.checkpoints import Checkpointer

    path = str(tmp_path / "log.db")
    writer = sqlite3.connect(path, isolation_level=None)
    reader = sqlite3.connect(path, isolation_level=None)
    checkpointer = Checkpointer(path, lambda: None)  # type: ignore[arg-type,return-value]
    checkpointer.open()
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("CREATE TABLE t (x)")
        writer.execute("INSERT INTO t VALUES (1)")
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (1,)  # its snapshot: the log as of now
        writer.execute("INSERT INTO t VALUES (2)")
        assert checkpointer._checkpoint() is False  # the reader holds back what came after its snapshot
        reader.execute("COMMIT")
        assert checkpointer._checkpoint() is True
    finally:
        checkpointer.close()
        reader.close()
        writer.close()
