"""Liveness through PgBouncer in transaction mode (issue 26, item 1; store/liveness.py).

A transaction pooler hands each transaction whichever server connection is
free. A session-level advisory lock taken through it stays on one server
connection, where another engine's probe, run on that same server
connection, gets it too (advisory locks are re-entrant per backend) and takes
the live holder for dead. The lock must live where no other client can run:
in a transaction of its own, which the pooler pins to one server connection.

A real PgBouncer (the Debian package) is started here on a free port, in
front of the test server, in transaction mode; the tests skip where it is
absent.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memengine import SessionConfig

from .conftest import POSTGRES_SERVER, postgres_unreachable
from .test_false_death import assert_a_live_engine_keeps_its_session

pytestmark = pytest.mark.anyio

#: Enough server connections for two engines' locks and their work, few enough to share them.
POOL_SIZE = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def pgbouncer_url() -> Iterator[str]:
    """A URL through a new PgBouncer in transaction mode, to a new database of the test server."""
    binary = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if os.path.exists(p)), None)
    if binary is None:
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")
    reason = postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    server = conninfo_to_dict(POSTGRES_SERVER)
    database = f"memengine_pooled_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    directory = Path(tempfile.mkdtemp(prefix="memengine-pgbouncer-"))
    directory.chmod(0o755)
    port = _free_port()
    user = server.get("user", "postgres")
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{database} = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)} dbname={database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 200\n"
        "ignore_startup_parameters = options,extra_float_digits\n"
        f"logfile = {directory / 'pgbouncer.log'}\npidfile = {directory / 'pgbouncer.pid'}\n"
    )
    command = [binary, str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer will not run as root: as postgres, writing its log and pid here
        import pwd

        account = pwd.getpwnam("postgres")
        os.chown(directory, account.pw_uid, account.pw_gid)
        command[1:1] = ["-u", "postgres"]
    bouncer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"postgresql://{user}@127.0.0.1:{port}/{database}?prepare_threshold=none"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(url.split("?")[0], connect_timeout=3).close()
                break
            except psycopg.Error as exc:
                if bouncer.poll() is not None or time.monotonic() > deadline:
                    log = directory / "pgbouncer.log"
                    pytest.skip(f"PgBouncer did not start: {exc}; {log.read_text() if log.exists() else ''}")
                time.sleep(0.1)
        yield url
    finally:
        bouncer.terminate()
        try:
            bouncer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            bouncer.kill()
            bouncer.wait()
        if bouncer.stdout is not None:
            bouncer.stdout.close()
        shutil.rmtree(directory, ignore_errors=True)
        with psycopg.connect(POSTGRES_SERVER, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


#: Many of the other engine's heartbeats: each probes on whichever server connection the pooler hands it.
WANTING = SessionConfig(passivate_after=None, lease_wait=20.0)


async def test_a_live_engine_behind_a_transaction_pooler_keeps_its_session(pgbouncer_url: str) -> None:
    await assert_a_live_engine_keeps_its_session(pgbouncer_url, WANTING)


def test_a_killed_engine_behind_a_transaction_pooler_is_taken_over_at_once(pgbouncer_url: str) -> None:
    """The pooler ends the server connection of a client gone mid-transaction: the lock ends with the process."""
    from .test_liveness_proof import Worker

    holder = Worker("hold", pgbouncer_url, "--lease-ttl", "600")  # only proof of death frees its session
    wanter = None
    try:
        holder.wait_for("holding")
        holder.kill()
        wanter = Worker("want", pgbouncer_url, "--lease-wait", "60")
        assert wanter.outcome() == {"op": "took", "seq": 3}
    finally:
        for worker in (holder, wanter):
            if worker is not None:
                worker.stop()
