"""Dead only on proof, with real processes (issue 26; store/liveness.py, store/owners.py).

A process that holds a session (tests/liveness_worker.py ``hold``: a summary in
flight for ever, so it never hands the session over) must keep it against
another process that reaches the same store another way: by a symlink, by a
hard link, from another working directory, after its liveness directory was
removed. The other process (``want``) must get ``SessionBusyError``: if it took
the holder for dead, it would release the holder's lease and take the session
while the holder still serves it. Where liveness cannot tell, the holder is
alive and its lease decides; where it can prove death (kill -9), takeover stays
prompt.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from memengine.store.liveness import FileLiveness
from memengine.store.owners import Incarnation

from .processes import lines

ROOT = Path(__file__).resolve().parent.parent
#: Generous: a shared, loaded machine. Nothing is asserted on time.
WORKER_TIMEOUT = 90


class Worker:
    """A tests/liveness_worker.py process, killed at the end of the test whatever happens."""

    def __init__(
        self,
        *args: str,
        cwd: Path | None = None,
        python: str = sys.executable,
        prefix: Sequence[str] = (),
        env: Any = None,
        **popen: Any,
    ) -> None:
        self.process = subprocess.Popen(
            [python, *prefix, "-m", "tests.liveness_worker", *args],
            cwd=cwd or ROOT,
            env=env or {**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **popen,
        )
        self.seen: list[dict[str, Any]] = []
        self.stderr = ""

    def wait_for(self, op: str, timeout: float = WORKER_TIMEOUT) -> dict[str, Any]:
        for line in lines(self.process, timeout):
            record = json.loads(line)
            self.seen.append(record)
            if record["op"] == op:
                return record
        self.kill()
        raise AssertionError(f"no {op!r} from the worker: {self.process.communicate(timeout=30)[1][-3000:]}")

    def outcome(self, timeout: float = WORKER_TIMEOUT) -> dict[str, Any]:
        """The last record of a worker that exits by itself (``want``)."""
        try:
            out, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.process.communicate()
            raise AssertionError(f"the worker did not finish in {timeout} s: {err[-3000:]}") from None
        assert self.process.returncode == 0, err[-3000:]
        self.stderr = err
        return json.loads(out.splitlines()[-1])

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Killed, with every child it forked, and its pipes closed."""
        self.kill()
        for record in self.seen:
            if record["op"] == "forked":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record["child"], signal.SIGKILL)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def holding(workers: list[Worker], store: str, *args: str, **popen: Any) -> dict[str, Any]:
    holder = Worker("hold", store, *args, **popen)
    workers.append(holder)
    return holder.wait_for("holding")


def wanting(workers: list[Worker], store: str, *args: str, **popen: Any) -> dict[str, Any]:
    wanter = Worker("want", store, *args, **popen)
    workers.append(wanter)
    return wanter.outcome()


def registered(database: Path) -> list[Incarnation]:
    conn = sqlite3.connect(database, timeout=10)
    try:
        rows = conn.execute("SELECT incarnation, lock_key, host, pid FROM engine_owners").fetchall()
    finally:
        conn.close()
    return [Incarnation(name, int(key), host, int(pid)) for name, key, host, pid in rows]


def found_alive(alias: str | Path, incarnations: Sequence[Incarnation]) -> set[str]:
    """What an engine that opened the store as ``alias`` (from the current directory) finds alive."""
    liveness = FileLiveness.beside(str(alias))
    assert liveness is not None
    return liveness.alive(None, incarnations)  # type: ignore[arg-type]  # a file lock needs no transaction


# -- SQLite: the same file, reached another way ---------------------------------


def test_a_symlink_to_the_file_does_not_make_its_holder_look_dead(tmp_path: Path, workers: list[Worker]) -> None:
    database = tmp_path / "memory.db"
    holding(workers, str(database))
    (tmp_path / "link.db").symlink_to(database)
    assert wanting(workers, str(tmp_path / "link.db")) == {"op": "busy", "owner": "holder"}


def test_a_relative_path_and_a_change_of_directory_do_not_make_a_holder_look_dead(
    tmp_path: Path, workers: list[Worker]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    holding(workers, str(tmp_path / "memory.db"))
    # The wanter opened "memory.db" in tmp_path, then moved: relative paths now name nothing.
    assert wanting(workers, "memory.db", "--chdir", str(elsewhere), cwd=tmp_path) == {"op": "busy", "owner": "holder"}


def test_a_holder_that_changed_directory_is_not_taken_for_dead(tmp_path: Path, workers: list[Worker]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    holding(workers, "memory.db", "--chdir", str(elsewhere), cwd=tmp_path)
    assert wanting(workers, str(tmp_path / "memory.db")) == {"op": "busy", "owner": "holder"}


def test_a_removed_liveness_directory_leaves_its_holders_alive(tmp_path: Path, workers: list[Worker]) -> None:
    database = tmp_path / "memory.db"
    holding(workers, str(database))
    shutil.rmtree(tmp_path / "memory.db-owners")  # a tmp cleaner
    assert wanting(workers, str(database)) == {"op": "busy", "owner": "holder"}


def test_a_hard_link_to_the_file_does_not_make_its_holder_look_dead(tmp_path: Path, workers: list[Worker]) -> None:
    # Not the whole engine: SQLite keeps a WAL per file *name*, so two engines on two hard links of one
    # database would not see each other's writes (an unsafe setup for SQLite itself). The verdict is
    # what liveness owes: an engine that opened the hard link finds the holder alive.
    database = tmp_path / "memory.db"
    holding(workers, str(database))
    (tmp_path / "linked").mkdir()
    os.link(database, tmp_path / "linked" / "hard.db")
    (holder,) = registered(database)
    assert found_alive(tmp_path / "linked" / "hard.db", [holder]) == {holder.name}


def test_every_alias_finds_a_killed_holder_dead(tmp_path: Path, workers: list[Worker]) -> None:
    database = tmp_path / "memory.db"
    holding(workers, str(database))
    (tmp_path / "link.db").symlink_to(database)
    (tmp_path / "linked").mkdir()
    os.link(database, tmp_path / "linked" / "hard.db")
    (holder,) = registered(database)
    for alias in (database, tmp_path / "link.db", tmp_path / "linked" / "hard.db"):
        assert found_alive(alias, [holder]) == {holder.name}, alias
    workers[0].kill()
    for alias in (database, tmp_path / "link.db", tmp_path / "linked" / "hard.db"):
        assert found_alive(alias, [holder]) == set(), alias
    assert wanting(workers, str(tmp_path / "link.db"), "--lease-wait", "30") == {"op": "took", "seq": 3}


# -- SQLite: another Unix user on the same file -----------------------------------

SITE_PACKAGES = next(Path(sys.prefix).glob("lib/python3*/site-packages"), None)


@pytest.fixture
def other_user() -> Iterator[tuple[int, int, Path]]:
    """A new Unix user sharing a new group with root, and a setgid directory of that group: (uid, gid, directory)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("groupadd") is None:
        pytest.skip("creating a second Unix user needs root and useradd/groupadd")
    name = f"memengine{os.getpid() % 100000}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        subprocess.run(["useradd", "-M", "-N", "-g", name, name], check=True, capture_output=True)
        try:
            uid, gid = int(_id("-u", name)), int(_id("-g", name))
            directory = Path(f"/tmp/{name}-store")
            directory.mkdir()
            try:
                os.chown(directory, 0, gid)
                directory.chmod(0o2770)
                yield uid, gid, directory
            finally:
                shutil.rmtree(directory)
        finally:
            subprocess.run(["userdel", name], capture_output=True)
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


def _id(option: str, name: str) -> str:
    return subprocess.run(["id", option, name], check=True, capture_output=True, text=True).stdout.strip()


def as_user(uid: int, gid: int) -> dict[str, Any]:
    """Popen options that run a worker as that user, with an interpreter it can reach (the venv's may be private)."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    path = os.pathsep.join(str(p) for p in (ROOT, SITE_PACKAGES) if p is not None)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}
    check = subprocess.run(
        [python or "python3", "-c", "import memengine, anyio, trio, sqlite3"],
        user=uid,
        group=gid,
        env=env,
        cwd="/tmp",
        capture_output=True,
        text=True,
    )
    if python is None or check.returncode != 0 or sys.version_info[:2] != _version(python):
        pytest.skip(f"no interpreter the second user can run memengine with: {check.stderr[-500:]}")
    return {"user": uid, "group": gid, "env": env, "python": python, "umask": SHARING}


def _version(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    major, minor = out.stdout.split()
    return int(major), int(minor)


#: A team's umask: what a user creates, its group may write.
SHARING = 0o002


def group_writable_database(directory: Path, gid: int) -> Path:
    database = directory / "memory.db"
    database.touch()
    os.chown(database, 0, gid)
    database.chmod(0o660)
    return database


def test_a_second_user_opens_a_group_writable_store_another_user_serves(
    other_user: tuple[int, int, Path], workers: list[Worker]
) -> None:
    uid, gid, directory = other_user
    database = group_writable_database(directory, gid)
    holding(workers, str(database), umask=SHARING)  # root
    assert wanting(workers, str(database), **as_user(uid, gid)) == {"op": "busy", "owner": "holder"}


def test_a_store_a_second_user_serves_is_not_taken_from_it(
    other_user: tuple[int, int, Path], workers: list[Worker]
) -> None:
    uid, gid, directory = other_user
    database = group_writable_database(directory, gid)
    holding(workers, str(database), **as_user(uid, gid))
    (holder,) = registered(database)
    lock_file = Path(holder.name)
    assert lock_file.stat().st_uid == uid and lock_file.stat().st_gid == gid
    assert lock_file.stat().st_mode & 0o777 == 0o660  # as the database file
    assert wanting(workers, str(database), umask=SHARING) == {"op": "busy", "owner": "holder"}  # root
    workers[0].kill()
    assert wanting(workers, str(database), "--lease-wait", "30", **as_user(uid, gid)) == {"op": "took", "seq": 3}


def test_a_liveness_directory_a_user_cannot_write_is_a_clear_warning_not_a_failure(
    other_user: tuple[int, int, Path], workers: list[Worker]
) -> None:
    uid, gid, directory = other_user
    database = group_writable_database(directory, gid)
    (directory / "memory.db-owners").mkdir(mode=0o755)  # made by an older version, or by hand
    holding(workers, str(database), umask=SHARING)  # root
    wanter = Worker("want", str(database), **as_user(uid, gid))
    workers.append(wanter)
    assert wanter.outcome() == {"op": "busy", "owner": "holder"}  # it runs, its leases alone say it is alive
    assert f"cannot create this engine's liveness lock file {directory}/memory.db-owners/" in wanter.stderr
    assert f"chmod g+rwx {directory}/memory.db-owners" in wanter.stderr


# -- a forked child --------------------------------------------------------------


def test_a_forked_child_does_not_keep_its_parent_alive(store_url: str, workers: list[Worker]) -> None:
    # The holder's lease lasts 600 s: only proof of its death can free the session within the wanter's wait.
    holding(workers, store_url, "--fork", "--lease-ttl", "600")
    (forked,) = [record for record in workers[0].seen if record["op"] == "forked"]
    workers[0].kill()  # the parent; its child lives on, doing nothing
    os.kill(forked["child"], 0)  # still there
    assert wanting(workers, store_url, "--lease-wait", "60") == {"op": "took", "seq": 3}


# -- PostgreSQL: replicas in separate PID namespaces of one host -----------------


def free_pid() -> int:
    """A pid no process of this namespace has, below the last one given out (so not reused soon)."""
    last = int(Path("/proc/sys/kernel/ns_last_pid").read_text())
    taken = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    return next(pid for pid in range(max(last // 2, 300), last) if pid not in taken)


def in_pid_namespace(pid: int) -> dict[str, Any]:
    """Popen options that run a worker as ``pid`` of a new PID namespace (same host name, same boot)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"new PID namespaces are not allowed here: {probe.stderr.strip()[:300]}")
    # sh is pid 1 of the namespace; it sets the next pid, then forks the worker (never execs it: "; exit").
    script = f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$0" "$@"; exit $?'
    return {
        "python": "unshare",
        "prefix": ["--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script, sys.executable],
    }


def wait_until_gone(pid: int, timeout: float = WORKER_TIMEOUT) -> None:
    """Waits for ``pid`` (this namespace's) to leave the process table: a namespace's pid 1 dies a moment after."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and "State:\tZ" not in _status(pid):
        assert time.monotonic() < deadline, f"process {pid} outlived its namespace for {timeout} s"
        time.sleep(0.05)


def _status(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/status").read_text()
    return ""


def host_pid(namespace_pid: int) -> int:
    """This namespace's pid of the worker that is ``namespace_pid`` in a namespace of its own."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{name}/status").read_text()
                (nspid,) = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
                if len(nspid) == 2 and int(nspid[1]) == namespace_pid:
                    return int(nspid[0])
    raise AssertionError(f"no process is {namespace_pid} of a namespace of its own")


def test_an_owner_in_another_pid_namespace_is_not_judged_by_this_one(workers: list[Worker]) -> None:
    from memengine.store.owners import process_gone

    from .conftest import postgres_schema
    from .test_owner_liveness import terminate_liveness_backend

    with postgres_schema() as url:
        pid = free_pid()
        holder = Worker("hold", url, **in_pid_namespace(pid))
        workers.append(holder)
        assert holder.wait_for("holding")["pid"] == pid
        import psycopg

        with psycopg.connect(url) as conn:
            host, registered_pid, lock_key = conn.execute("SELECT host, pid, lock_key FROM engine_owners").fetchone()
        assert registered_pid == pid and not Path(f"/proc/{pid}").exists()  # no such pid here: it lives elsewhere
        assert not process_gone(host, pid)  # this machine's process table is not the owner's
        # The holder is paused and its lock's connection dropped: its lock is gone, the process is not.
        paused = host_pid(pid)
        os.kill(paused, signal.SIGSTOP)
        try:
            assert terminate_liveness_backend(url, lock_key) == 1
            # The grace (5 s) outlasts the wait (3 s): the session is not taken from a process that may live.
            assert wanting(workers, url, "--lease-wait", "3") == {"op": "busy", "owner": "holder"}
        finally:
            os.kill(paused, signal.SIGCONT)
            # Gone before the schema is dropped: a worker still writing would deadlock the DROP.
            for worker in workers:
                worker.stop()
            wait_until_gone(paused)


# -- a /proc that hides other users' processes (hidepid) ------------------------------


def test_a_process_proc_hides_from_the_checker_is_not_gone() -> None:
    """``mount -o hidepid=2``: another user's live process has no /proc entry for this one; that proves nothing.

    The checker runs as ``nobody`` in a mount namespace of its own with such a /proc;
    the holder is a live process of root's. Both see the same host, boot and PID namespace.
    """
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None or python is None:
        pytest.skip("a /proc with hidepid for another user needs root, unshare, setpriv and /usr/bin/python3")
    path = os.pathsep.join(str(p) for p in (ROOT, SITE_PACKAGES) if p is not None)
    check = (
        "import sys; from memengine.store.owners import process_gone, this_host; "
        "print(process_gone(this_host(), int(sys.argv[1])))"
    )
    holder = subprocess.Popen(["sleep", "600"])
    try:
        as_nobody = "exec setpriv --reuid=65534 --regid=65534 --clear-groups"
        script = f'mount -t proc -o hidepid=2 proc /proc && {as_nobody} "$@"'
        unshared = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
        checker = subprocess.run(
            [*unshared, python, "-c", check, str(holder.pid)],
            env={**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"},
            cwd="/tmp",
            capture_output=True,
            text=True,
            timeout=120,
        )
        if checker.returncode != 0:
            pytest.skip(f"no hidepid /proc for another user here: {checker.stderr[-500:]}")
        assert holder.poll() is None  # alive all along
        assert checker.stdout.split() == ["False"]
    finally:
        holder.kill()
        holder.wait()
