"""Helpers shared by the benchmarks: server processes, fresh databases, CPU and latency maths.

A benchmark target runs on a *cluster*: one troth server process on a fresh
SQLite file, or one or more server processes ("replicas") on one fresh
PostgreSQL schema. Replicas share the schema and wake each other through
LISTEN/NOTIFY; each has its own port, so load generators spread their
connections over `Cluster.addresses`.

PostgreSQL comes from `TROTH_BENCH_PG` (an admin URL; default: the machine's
server with trust auth, `postgresql://postgres@127.0.0.1:5432/test`). Each
cluster gets its own schema (`bench_<pid>_<n>_<hex>`), dropped when the
cluster stops.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 60.0
STATS_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0

PG_ADMIN_URL = os.environ.get("TROTH_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
_schema_counter = itertools.count()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    """What every script prints and records about the machine a run was on."""
    import platform

    import grpc

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }


def machine_busy_seconds() -> float | None:
    """CPU time all cores have spent busy since boot, steal included (Linux /proc)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far and of its live descendants (a
    `troth serve --processes N` supervisor's server processes), Linux /proc."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(proc_cpu_seconds(child) or 0.0 for child in _children(pid))


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (every thread's list: /proc/PID/task/*/children)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in task.read_text().split()]
        except OSError:
            continue
    return found


def fmt(value: float | None, spec: str) -> str:
    """A figure for a table cell: `-` when there is none."""
    return "-" if value is None or math.isnan(value) else format(value, spec)


def table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """An aligned text table: the first `left` columns left-aligned, the rest right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header, *rows]):
        cells = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def percentile_ms(sorted_ns: list[int], pct: float) -> float | None:
    """Nearest-rank percentile of sorted nanosecond latencies, in milliseconds."""
    if not sorted_ns:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_ns)))
    return sorted_ns[rank - 1] / 1e6


class ServerError(RuntimeError):
    pass


class ServerProcess:
    """A server subprocess: started, awaited until healthy, asked for stats, stopped."""

    def __init__(self, name: str, argv: list[str], workdir: Path, port_file: Path) -> None:
        self.name = name
        self.argv = argv
        self.port_file = port_file
        self.stderr_path = workdir / f"{name}.stderr.log"
        self._stderr = self.stderr_path.open("wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
            env=env,
            cwd=workdir,
        )
        self.address = ""
        self._stats_offset = 0
        self._stats_pending = b""
        self._stats_seen = 0
        self._stats_latest: tuple[int, int] | None = None

    def stderr_tail(self, lines: int = 20) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ServerError(
                f"{self.name} exited with {self.proc.returncode}; "
                f"stderr ({self.stderr_path}):\n{self.stderr_tail()}"
            )

    def wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        port = None
        while port is None:
            self.check_alive()
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: no port file after {START_TIMEOUT_S:.0f} s")
            try:
                text = self.port_file.read_text().strip()
                port = int(text.rsplit(":", 1)[-1]) if text else None
            except (OSError, ValueError):
                port = None
            if port is None:
                time.sleep(0.05)
        self.address = f"127.0.0.1:{port}"
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                self.check_alive()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ServerError(f"{self.name}: not SERVING after {START_TIMEOUT_S:.0f} s")
                try:
                    reply = health.Check(
                        health_pb2.HealthCheckRequest(service=""), timeout=min(2.0, remaining)
                    )
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return self.address
                except grpc.RpcError:
                    pass
                time.sleep(0.1)

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of the server process so far (Linux /proc)."""
        return proc_cpu_seconds(self.proc.pid)

    def catches_sigusr1(self) -> bool:
        """True if the process has a SIGUSR1 handler (else the signal would kill it)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        for line in status.splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
        return False

    def _read_stats_lines(self) -> None:
        with self.stderr_path.open("rb") as f:
            f.seek(self._stats_offset)
            chunk = f.read()
        self._stats_offset += len(chunk)
        data = self._stats_pending + chunk
        *lines, self._stats_pending = data.split(b"\n")
        for line in lines:
            if b'"stats"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or record.get("event") != "stats":
                continue
            commits, requests = record.get("commits"), record.get("requests")
            if isinstance(commits, int) and isinstance(requests, int):
                self._stats_seen += 1
                self._stats_latest = (commits, requests)

    def stats(self) -> tuple[int, int]:
        """Send SIGUSR1 and return the (commits, requests) the server logs in reply."""
        self.check_alive()
        self._read_stats_lines()
        seen = self._stats_seen
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + STATS_TIMEOUT_S
        while True:
            time.sleep(0.02)
            self._read_stats_lines()
            if self._stats_seen > seen and self._stats_latest is not None:
                return self._stats_latest
            self.check_alive()
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name}: no stats line within {STATS_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log(f"  {self.name}: still running {STOP_TIMEOUT_S:.0f} s after SIGTERM; killing")
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


# --------------------------------------------------------------------------- databases


@dataclass(frozen=True)
class Backend:
    """Where a troth target keeps its state, and how many server processes share it."""

    name: str
    kind: str  # "sqlite" or "postgresql"
    replicas: int


BACKENDS: dict[str, Backend] = {
    "sqlite": Backend("sqlite", "sqlite", 1),
    "pg": Backend("pg", "postgresql", 1),
    "pg2": Backend("pg2", "postgresql", 2),
}


def _pg_connect() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN_URL, autocommit=True)


class Database:
    """A fresh database: a SQLite file in `workdir`, or a new PostgreSQL schema."""

    def __init__(self, kind: str, workdir: Path) -> None:
        self.kind = kind
        self.schema: str | None = None
        self.path: Path | None = None
        self._conn: Any = None
        if kind == "sqlite":
            self.path = workdir / "bench.db"
            self.url = f"sqlite:///{self.path}"
            return
        if kind != "postgresql":
            raise ValueError(f"unknown database kind {kind!r}")
        self.schema = f"bench_{os.getpid()}_{next(_schema_counter)}_{uuid.uuid4().hex[:6]}"
        try:
            with _pg_connect() as conn:
                conn.execute(f'CREATE SCHEMA "{self.schema}"')
        except Exception as exc:
            raise ServerError(f"PostgreSQL at {PG_ADMIN_URL}: {exc}") from exc
        base = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
        sep = "&" if "?" in base else "?"
        self.url = f"{base}{sep}options={quote(f'-csearch_path={self.schema}')}"

    @property
    def serve_args(self) -> list[str]:
        """`troth serve` arguments for this database (PostgreSQL schemas start empty)."""
        return ["--db", self.url, *(["--migrate"] if self.kind == "postgresql" else [])]

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run a read-only query (`?` placeholders) on the troth tables; all rows."""
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as db:
                return list(db.execute(sql, tuple(params)))
        if self._conn is None or self._conn.closed:
            self._conn = _pg_connect()
            self._conn.execute(f'SET search_path TO "{self.schema}"')
        return list(self._conn.execute(sql.replace("?", "%s"), tuple(params)).fetchall())

    def drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.schema is not None:
            with _pg_connect() as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            self.schema = None


_AUTH_FLAGS = ("--no-auth", "--auth-tokens", "--jwt-key-file", "--jwt-jwks-file")


def _has_auth(args: Sequence[str]) -> bool:
    """Whether `troth serve` arguments choose authentication (else `--no-auth` is added:
    a server for tests on a loopback address)."""
    return any(arg.split("=", 1)[0] in _AUTH_FLAGS for arg in args)


class Cluster:
    """The troth server processes of one target on one fresh database.

    Replicas start one after another (the first migrates a PostgreSQL schema),
    each on its own port. Stats and CPU are summed over the replicas.
    """

    def __init__(
        self,
        name: str,
        backend: Backend,
        workdir: Path,
        extra_args: Sequence[str] = (),
        prepare: Callable[[Database], None] | None = None,
    ) -> None:
        """`prepare`, if given, runs on the fresh database before any server starts
        (e.g. seeding it)."""
        self.name = name
        self.backend = backend
        self.workdir = workdir
        self.database = Database(backend.kind, workdir)
        self.servers: list[ServerProcess] = []
        self.addresses: list[str] = []
        try:
            if prepare is not None:
                prepare(self.database)
            for i in range(backend.replicas):
                label = name if backend.replicas == 1 else f"{name}-r{i}"
                port_file = workdir / f"{label}.port"
                argv = [
                    sys.executable, "-m", "troth_server", "serve",
                    "--listen", "127.0.0.1:0", *self.database.serve_args,
                    "--port-file", str(port_file),
                    *(() if _has_auth(extra_args) else ("--no-auth",)), *extra_args,
                ]  # fmt: skip
                server = ServerProcess(label, argv, workdir, port_file)
                self.servers.append(server)
                self.addresses.append(server.wait_ready())
        except BaseException:
            self.stop()
            raise

    @property
    def argv(self) -> list[str]:
        return self.servers[0].argv if self.servers else []

    def catches_sigusr1(self) -> bool:
        return all(s.catches_sigusr1() for s in self.servers)

    def stats(self) -> tuple[int, int]:
        commits = requests = 0
        for server in self.servers:
            c, r = server.stats()
            commits, requests = commits + c, requests + r
        return commits, requests

    def cpu_seconds(self) -> float | None:
        times = [s.cpu_seconds() for s in self.servers]
        return None if any(t is None for t in times) else sum(t or 0.0 for t in times)

    def check_alive(self) -> None:
        for server in self.servers:
            server.check_alive()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.database.drop()


def postgres_cpu_seconds() -> dict[int, float]:
    """User + system CPU time so far of every `postgres` process on the machine, by pid.

    It covers every database of the machine's PostgreSQL server, so other work
    using it at the same time counts too. Compare two samples with
    `postgres_cpu_delta`.
    """
    found: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            data = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if data[data.index("(") + 1 : data.rindex(")")] != "postgres":
            continue
        fields = data[data.rindex(")") + 2 :].split()
        found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def postgres_cpu_delta(
    before: dict[int, float] | None, after: dict[int, float] | None
) -> float | None:
    """CPU seconds the postgres processes used between two samples (None without both).

    Processes that started in between count whole; processes that ended in
    between are missed (their time is gone from /proc), so this never goes
    negative but may count short when connections close."""
    if before is None or after is None:
        return None
    return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())
