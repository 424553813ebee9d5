"""A private PostgreSQL cluster for tests: `initdb` into a temporary directory, its
own port and socket directory, trust auth, user `postgres`.

Used by `_pg` (the suite's throwaway server when the machine has none), by the
tests that stop and start a database under a running server (test_pg_restart),
and by the failover test, which adds a streaming-replication standby
(`Cluster.standby_of`), kills the primary (`kill`) and promotes the standby
(`promote`).
As root, initdb and pg_ctl run as the `postgres` OS user (initdb refuses root),
in a directory under /tmp that user owns (root's pytest directories are private,
and the socket path must stay short).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

PG_BIN_ENV = "TROTH_PG_BIN"
"""Where initdb and pg_ctl are. When set, the only place looked (set it to an empty
directory to hide the machine's binaries)."""


def pg_bindir() -> Path | None:
    """The directory of initdb and pg_ctl: $TROTH_PG_BIN alone when set; else the
    PATH's, pg_config's, or the newest /usr/lib/postgresql/*/bin."""
    given = os.environ.get(PG_BIN_ENV)
    candidates: list[Path] = []
    if given is not None:
        candidates.append(Path(given))
    else:
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(Path(on_path).resolve().parent)
        if shutil.which("pg_config"):
            done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
            if done.returncode == 0:
                candidates.append(Path(done.stdout.strip()))
        versions = Path("/usr/lib/postgresql").glob("*/bin")
        candidates += sorted(versions, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))[
            ::-1
        ]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ClusterUnavailable(Exception):
    """A private cluster cannot be made here (the reason says why and what to do)."""


def owner_prefix() -> tuple[list[str], int | None]:
    """The command prefix that runs initdb/pg_ctl as the cluster's owner, and that
    owner's uid: nothing for a normal user; `runuser -u postgres --` for root."""
    if os.geteuid() != 0:
        return [], None
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        raise ClusterUnavailable(
            "running as root needs a `postgres` OS user to own a private PostgreSQL cluster "
            "(initdb refuses root): create one, or run the tests as a normal user"
        ) from None
    if shutil.which("runuser") is None:
        raise ClusterUnavailable("running as root needs `runuser` to start PostgreSQL as postgres")
    return ["runuser", "-u", "postgres", "--"], uid


@dataclass
class Cluster:
    """A PostgreSQL of the caller's own: trust auth, 127.0.0.1:`port`, user postgres."""

    bindir: Path
    root: Path
    port: int
    as_user: list[str]
    """Command prefix that runs as the cluster's owner (initdb refuses root)."""

    @classmethod
    def create(cls, bindir: Path | None = None) -> Cluster:
        """A new, initialised (not started) cluster in a fresh directory under /tmp."""
        bindir = bindir or pg_bindir()
        if bindir is None:
            raise ClusterUnavailable(
                "needs the PostgreSQL server binaries (initdb, pg_ctl): install postgresql, "
                f"or point {PG_BIN_ENV} at their directory"
            )
        as_user, owner = owner_prefix()
        root = Path(tempfile.mkdtemp(prefix="troth-pg-"))
        if owner is not None:
            os.chown(root, owner, -1)
        made = cls(bindir, root, free_port(), as_user)
        try:
            made.init()
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return made

    @property
    def data(self) -> Path:
        return self.root / "data"

    def command(self, tool: str, *args: str) -> list[str]:
        return [*self.as_user, str(self.bindir / tool), *args]

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            self.command(tool, *args), capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")

    @classmethod
    def standby_of(cls, primary: Cluster) -> Cluster:
        """A streaming-replication standby of the running `primary`, in a fresh
        directory: a base backup with its recovery settings written (`-R`:
        `standby.signal`, and `primary_conninfo` naming the primary's port). Not
        started."""
        if not (primary.bindir / "pg_basebackup").is_file():
            raise ClusterUnavailable(
                f"a standby needs pg_basebackup, which {primary.bindir} lacks: install the "
                f"PostgreSQL client binaries there, or point {PG_BIN_ENV} at a full bin directory"
            )
        as_user, owner = owner_prefix()
        root = Path(tempfile.mkdtemp(prefix="troth-pg-"))
        if owner is not None:
            os.chown(root, owner, -1)
        made = cls(primary.bindir, root, free_port(), as_user)
        try:
            made._run(
                "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
                "-D", str(made.data), "-R", "-X", "stream", "-c", "fast",
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return made

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")

    def start(self) -> None:
        """Returns once the database accepts connections."""
        options = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1"
        log = str(self.root / "postgres.log")
        self._run(
            "pg_ctl", "start", "-D", str(self.data), "-l", log, "-w", "-t", "60", "-o", options
        )

    def start_on_a_free_port(self) -> None:
        """`start`, trying another port when the free one was taken meanwhile."""
        for attempt in range(3):
            try:
                self.start()
                return
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = free_port()

    def stop_command(self, mode: str = "immediate") -> list[str]:
        return self.command("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60")

    def stop(self, mode: str = "immediate") -> None:
        """`immediate`: every backend killed at once, as in a crash (recovery at start)."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60")

    def promote(self) -> None:
        """`pg_ctl promote` a standby: returns once it accepts writes."""
        self._run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "60")

    def kill(self) -> None:
        """SIGKILL the postmaster and every process of it at once, as when its machine
        dies: no backend finishes what it was doing, nothing is flushed or sent."""
        # postmaster.pid: the pid on its first line, "<shm key> <shm id>" on its seventh.
        lines = (self.data / "postmaster.pid").read_text().splitlines()
        postmaster = int(lines[0])
        doomed = [postmaster, *_children_of(postmaster)]
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # A killed postmaster leaves its small System V segment behind (it removes it
        # when it exits): removed here, once every process that held it is gone.
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in doomed):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        shm = lines[6].split() if len(lines) > 6 else []
        if len(shm) == 2 and shutil.which("ipcrm"):
            subprocess.run(["ipcrm", "-m", shm[1]], capture_output=True)

    def execute(self, statement: str) -> list[tuple[object, ...]]:
        """One statement in autocommit on the `postgres` database; its rows."""
        with psycopg.connect(self.url("postgres", "postgresql"), autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def destroy(self) -> None:
        """Stop it (if running) and remove its directory."""
        try:
            self.stop("immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return (self.root / "postgres.log").read_text(errors="replace")

    def url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE `name`; returns its libpq URL."""
        with psycopg.connect(self.url("postgres", "postgresql"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name, "postgresql")

    def new_database(self) -> str:
        """A fresh database; returns the server's `--db` URL for it."""
        name = f"t_{uuid.uuid4().hex[:8]}"
        self.create_database(name)
        return self.url(name)


def _running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children_of(parent: int) -> list[int]:
    """The pids whose parent is `parent` (from /proc: a postmaster's backends)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children
