"""The processes a chaos run owns: a private PostgreSQL, server replicas, worker processes.

PostgreSQL is a cluster of the run's own (``initdb`` into a temporary
directory, trust auth, a free port, its own socket directory), never the
machine's server at :5432: the fault injector stops it with ``pg_ctl stop -m
immediate`` (every backend killed at once, recovery at the next start). As
root (CI), the cluster runs as the ``postgres`` OS user (``runuser -u postgres
--``), in a directory under /tmp that user owns. initdb takes about a second,
an immediate stop and a start about 0.2 s.

Each server replica keeps its port across restarts (``--listen
127.0.0.1:PORT``), so clients and workers reconnect to the same address, and
reads its wall clock offset from its own ``TROTH_TEST_CLOCK_FILE``
(interfaces.md §3; see `clock_supported`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

CLOCK_ENV = "TROTH_TEST_CLOCK_FILE"
WORKER_SCRIPT = Path(__file__).resolve().parent / "worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clock_supported() -> bool:
    """Whether the installed server reads `TROTH_TEST_CLOCK_FILE` (its source names it).

    Until it does, writing the file changes nothing, and the run says so
    instead of counting clock faults as tested."""
    import troth_server

    root = Path(troth_server.__file__).parent
    return any(CLOCK_ENV in path.read_text(errors="replace") for path in root.rglob("*.py"))


def pg_bindir() -> Path | None:
    """initdb's and pg_ctl's directory: $TROTH_PG_BIN, or the newest /usr/lib/postgresql/*/bin."""
    candidates = [Path(os.environ["TROTH_PG_BIN"])] if os.environ.get("TROTH_PG_BIN") else []
    found = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(found, key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))[::-1]
    for directory in candidates:
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


class PrivateCluster:
    """A PostgreSQL of the run's own; `restart` is a crash and recovery."""

    def __init__(self) -> None:
        bindir = pg_bindir()
        if bindir is None:
            raise RuntimeError(
                "the PostgreSQL chaos run needs initdb and pg_ctl: install postgresql, or "
                "point TROTH_PG_BIN at their directory"
            )
        self.bindir = bindir
        self.as_user: list[str] = []
        owner: int | None = None
        if os.geteuid() == 0:  # initdb refuses root
            try:
                owner = pwd.getpwnam("postgres").pw_uid
            except KeyError:
                raise RuntimeError(
                    "as root, the private PostgreSQL runs as the `postgres` OS user: none here"
                ) from None
            self.as_user = ["runuser", "-u", "postgres", "--"]
        # Under /tmp: the owner must reach it and the socket path must stay short.
        self.root = Path(tempfile.mkdtemp(prefix="troth-chaos-pg-"))
        if owner is not None:
            os.chown(self.root, owner, -1)
        self.port = free_port()
        self.running = False
        began = time.monotonic()
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")
        for attempt in range(3):  # the free port may be taken meanwhile
            try:
                self.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = free_port()
        self.database = f"chaos_{uuid.uuid4().hex[:8]}"
        import psycopg

        url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.init_seconds = time.monotonic() - began
        """initdb, start and CREATE DATABASE."""
        self.restarts: list[float] = []
        """Seconds of each crash-stop plus start (the pause between them not counted)."""

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        """The servers' ``--db``."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, str(self.bindir / tool), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> float:
        """Start and wait until it accepts connections; returns the seconds it took."""
        began = time.monotonic()
        options = f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1"
        log = str(self.root / "postgres.log")
        self._run(
            "pg_ctl", "start", "-D", str(self.data), "-l", log, "-w", "-t", "30", "-o", options
        )
        self.running = True
        return time.monotonic() - began

    def crash(self) -> float:
        """``pg_ctl stop -m immediate``: every backend killed at once, as in a crash.

        Returns the seconds it took."""
        began = time.monotonic()
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30")
        self.running = False
        return time.monotonic() - began

    def close(self) -> None:
        try:
            if self.running:
                self.crash()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


class ServerReplica:
    """One ``troth serve`` process on a fixed port, restartable after SIGKILL; or, with
    ``processes`` > 1, a supervisor of that many (``--processes``), whose faults reach
    one of its children (the supervisor restarts a child killed)."""

    def __init__(
        self, name: str, workdir: Path, db_url: str, extra: list[str], processes: int = 1
    ) -> None:
        self.processes = processes
        self.name = name
        self.workdir = workdir
        self.db_url = db_url
        self.extra = extra
        self.port = free_port()
        self.clock_file = workdir / f"{name}.clock"
        self.clock_file.write_text("")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self, migrate: bool = False) -> None:
        argv = [
            sys.executable, "-m", "troth_server", "serve", "--no-auth",
            "--listen", self.address, "--db", self.db_url, *(["--migrate"] if migrate else []),
            "--processes", str(self.processes), *self.extra,
        ]  # fmt: skip
        log = (self.workdir / f"{self.name}.log").open("ab")
        env = {**os.environ, CLOCK_ENV: str(self.clock_file), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=self.workdir)
        log.close()
        self.starts += 1
        self.wait_serving(60.0)

    def wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.proc.returncode}:\n{self.log()}"
                    )
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.name} not SERVING after {timeout:.0f} s:\n{self.log()}"
                    )
                time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """The supervisor's children now (``--processes`` > 1)."""
        if self.proc is None:
            return []
        try:
            text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def wait_restarted(self, killed: int, timeout: float) -> None:
        """Until the supervisor has replaced child ``killed`` and the port serves."""
        deadline = time.monotonic() + timeout
        while True:
            children = self.children()
            if killed not in children and len(children) == self.processes:
                break
            if time.monotonic() > deadline or not self.alive():
                raise RuntimeError(f"{self.name} did not restart child {killed}:\n{self.log()}")
            time.sleep(0.05)
        self.wait_serving(max(1.0, deadline - time.monotonic()))

    def signal(self, sig: signal.Signals) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for child in self.children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGCONT)
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def set_clock(self, offset: float) -> None:
        """The injected wall clock offset, in seconds (an empty file is 0)."""
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text("" if offset == 0 else repr(float(offset)))
        tmp.replace(self.clock_file)

    def log(self, lines: int = 30) -> str:
        path = self.workdir / f"{self.name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class WorkerProcess:
    """One worker subprocess (`bench/_chaos/worker.py`)."""

    def __init__(self, n: int, workdir: Path, addresses: list[str], ledger: Path, lease: float):
        self.name = f"worker-{n}"
        log = (workdir / f"{self.name}.log").open("ab")
        argv = [
            sys.executable, str(WORKER_SCRIPT), "--address", ",".join(addresses),
            "--ledger", str(ledger), "--lease", str(lease),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, cwd=workdir)
        log.close()
        self.stopped_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (after a SIGCONT): the worker releases its leases and exits."""
        if self.alive():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Fleet:
    """The run's worker processes: a killed one is replaced by a new process (a new pid)."""

    def __init__(self, workdir: Path, addresses: list[str], ledger: Path, lease: float) -> None:
        self.workdir = workdir
        self.addresses = addresses
        self.ledger = ledger
        self.lease = lease
        self.workers: list[WorkerProcess] = []
        self._started = 0

    def spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self._started, self.workdir, self.addresses, self.ledger, self.lease)
        self._started += 1
        self.workers.append(worker)
        return worker

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()
