"""The systems `bench/peers/run.py` measures: troth (SQLite, PostgreSQL), DBOS, and the
base they share with Restate (`_restate.py`).

Each system is started fresh for a round (its own database or data directory),
runs phases of one workload at one concurrency, measures its recovery, and is
stopped. A phase answers a `Phase`; the benchmark measures the CPU of the pids
`pids()` names (with PostgreSQL's when `uses_postgres`) around it.

troth and Restate are driven from the benchmark's own process (one thread per
workflow in flight, like a service calling them, or for Restate also one asyncio
loop); DBOS is a library, so its load runs inside its own process
(`_dbos_app.py`). A system may do a workload by several *drivers* (a flow and a
load client, ``"<flow>/<client>"``); the benchmark measures each and reports the
fastest.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import _load
import psycopg
from _servers import BACKENDS, PG_ADMIN_URL, ServerError
from _workflow_load import Harness, Notifications

if TYPE_CHECKING:
    from troth import Client

PEERS_DIR = Path(__file__).resolve().parent
APPROVED = {"approved": True}
TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
RECOVERY_TIMEOUT_S = 120.0
WORKLOADS = ("w1-suspend", "w1-eager", "w2")


@dataclass
class Phase:
    """What one phase measured: workflows completed, and settle-to-completion (W1) or
    start-to-result (W2) latency."""

    completed: int
    errors: int
    first_error: str | None
    elapsed_s: float
    p50_ms: float | None
    p99_ms: float | None

    @property
    def per_s(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s else 0.0


@dataclass
class Recovery:
    """W3: seconds from SIGKILL until every held workflow completed elsewhere."""

    seconds: float | None
    completed: int
    note: str
    error: str | None = None


def run_threads(cycle: Callable[[str, int], int], concurrency: int, duration: float) -> Phase:
    return Phase(**_load.run_threads(cycle, concurrency, duration))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"exited with {proc.returncode}: {tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise ServerError(f"nothing listened on port {port} within {START_TIMEOUT_S:.0f} s")


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class System:
    name: str
    uses_postgres = False
    drives_itself = False
    """True when the load client runs inside the system's own processes (DBOS)."""
    flow = "client"
    """The one flow of a system with one driver (`drivers`), run by threads."""

    def pids(self) -> list[int]:
        raise NotImplementedError

    def drivers(self, workload: str) -> tuple[str, ...]:
        """The ways this system does `workload` (``"<flow>/<client>"``), the default first."""
        return (f"{self.flow}/threads",)

    def phase(
        self, workload: str, concurrency: int, duration: float, driver: str | None = None
    ) -> Phase:
        raise NotImplementedError

    def recovery(self, count: int) -> Recovery:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- troth


class Troth(System):
    """A troth server (durable SQLite by default, or a fresh PostgreSQL schema) and one
    worker process of `bench/_workflow_worker.py`, default settings."""

    flow = "sdk"  # troth.Client, which is synchronous: one thread per workflow in flight

    def __init__(
        self,
        name: str,
        backend: str,
        workdir: Path,
        notes: Notifications,
        server_args: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.uses_postgres = BACKENDS[backend].kind == "postgresql"
        self.notes = notes
        self.harness = Harness(workdir, notes, name, backend, server_args=server_args)
        self.group = f"peers-{uuid.uuid4().hex[:6]}"
        try:
            self.workers = self.harness.start_workers(self.group, 1)
        except BaseException:
            self.harness.close()
            raise

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.harness.server.servers] + [w.pid for w in self.workers]

    def _client(self) -> Client:
        assert self.harness.client is not None
        return self.harness.client

    def phase(
        self, workload: str, concurrency: int, duration: float, driver: str | None = None
    ) -> Phase:
        client, notes, group = self._client(), self.notes, self.group

        def w1(workflow_id: str, eager: bool) -> int:
            # Suspend: settle once the worker suspended the workflow. Eager: settle as
            # soon as the notification step ran, while the workflow is still live.
            report = "notified" if eager else "suspended"
            reached = notes.expect(workflow_id, report)
            try:
                handle = client.start("hitl", id=workflow_id, group=group)
                if not reached.wait(TIMEOUT_S):
                    raise TimeoutError(f"{workflow_id}: no {report} report")
            finally:
                notes.forget(workflow_id, report)
            settle = time.perf_counter_ns()
            client.resolve(f"{workflow_id}.0", APPROVED)
            if handle.result(timeout=TIMEOUT_S) != APPROVED:
                raise AssertionError(f"{workflow_id}: unexpected result")
            return time.perf_counter_ns() - settle

        def w2(workflow_id: str, _slot: int) -> int:
            start = time.perf_counter_ns()
            # Started and awaited in one call (`Client.execute`), troth's fastest flow.
            done = client.execute("ten_steps", id=workflow_id, group=group, timeout=TIMEOUT_S)
            if done != "done":
                raise AssertionError(f"{workflow_id}: unexpected result")
            return time.perf_counter_ns() - start

        cycles: dict[str, Callable[[str, int], int]] = {
            "w1-suspend": lambda wid, _slot: w1(wid, eager=False),
            "w1-eager": lambda wid, _slot: w1(wid, eager=True),
            "w2": w2,
        }
        return run_threads(cycles[workload], concurrency, duration)

    def recovery(self, count: int) -> Recovery:
        harness, client = self.harness, self._client()
        group = f"w3-{uuid.uuid4().hex[:6]}"
        note = "a second worker, connected; the killed one's tasks return when its stream closes"
        (first,) = harness.start_workers(group, 1, concurrency=count, block=True)
        ids = {f"{group}-{i}" for i in range(count)}
        for workflow_id in sorted(ids):
            client.start("held", id=workflow_id, group=group)
        if len(self.notes.wait_entered(first.pid, ids, TIMEOUT_S)) < count:
            first.kill()
            return Recovery(None, 0, note, f"not all {count} entered their step")
        (second,) = harness.start_workers(group, 1, concurrency=count)
        time.sleep(0.2)
        t0 = time.monotonic()
        first.signal(signal.SIGKILL)
        completed = 0
        error = None
        for workflow_id in sorted(ids):
            try:
                client.handle(workflow_id).result(timeout=RECOVERY_TIMEOUT_S)
                completed += 1
            except Exception as exc:
                error = error or f"{workflow_id}: {type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        first.kill()
        harness.workers.remove(first)
        harness.stop_workers([second])
        return Recovery(seconds if completed == count else None, completed, note, error)

    def stop(self) -> None:
        self.harness.close()


# --------------------------------------------------------------------------- DBOS


class Dbos(System):
    """DBOS Transact in one process (`_dbos_app.py`), on a SQLite file or a fresh
    PostgreSQL database; its load client runs in that process."""

    drives_itself = True
    flow = "in-process"
    _databases = itertools.count()

    def __init__(
        self, name: str, kind: str, python: Path, workdir: Path, notes: Notifications
    ) -> None:
        self.name = name
        self.python = python
        self.notes = notes
        self.workdir = workdir / name
        self.workdir.mkdir()
        self.uses_postgres = kind == "postgresql"
        self.database: str | None = None
        if self.uses_postgres:
            self.database = f"dbos_bench_{os.getpid()}_{next(self._databases)}"
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{self.database}"')
            base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
            self.url = f"{base}/{self.database}"
        else:
            self.url = f"sqlite:///{self.workdir / 'dbos.sqlite'}"
        self._logs: list[IO[bytes]] = []
        self._log_of: dict[int, Path] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.proc = self._start("serve")
        except BaseException:
            self.stop()
            raise

    def _start(self, mode: str, *extra: str) -> subprocess.Popen[bytes]:
        log_path = self.workdir / f"{mode}-{len(self._logs)}.log"
        err = log_path.open("wb")
        self._logs.append(err)
        proc = subprocess.Popen(
            [str(self.python), str(PEERS_DIR / "_dbos_app.py"), "--db", self.url,
             "--mode", mode, "--notify", str(self.notes.path), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
        )  # fmt: skip
        self._log_of[proc.pid] = log_path
        if mode == "serve":
            self._read(proc)  # {"ready": true}
        return proc

    def _read(self, proc: subprocess.Popen[bytes]) -> Any:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(10)
            raise ServerError(
                f"DBOS process exited {proc.returncode}: {tail(self._log_of[proc.pid])}"
            )
        return json.loads(line)

    def _ask(self, proc: subprocess.Popen[bytes], command: dict[str, Any]) -> Any:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(command) + "\n").encode())
        proc.stdin.flush()
        return self._read(proc)

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def phase(
        self, workload: str, concurrency: int, duration: float, driver: str | None = None
    ) -> Phase:
        assert self.proc is not None
        answer = self._ask(
            self.proc, {"workload": workload, "concurrency": concurrency, "duration": duration}
        )
        return Phase(**answer)

    def recovery(self, count: int) -> Recovery:
        note = "after a restart: a new process on the same database recovers them at launch"
        if self.proc is not None:
            stop_process(self.proc)
        blocked = self._start("serve", "--block")
        self.proc = None
        self._ask(blocked, {"workload": "held", "count": count})
        ids = {f"held-{i}" for i in range(count)}
        if len(self.notes.wait_entered(blocked.pid, ids, TIMEOUT_S)) < count:
            blocked.kill()
            return Recovery(None, 0, note, f"not all {count} entered their step")
        t0 = time.monotonic()
        blocked.send_signal(signal.SIGKILL)
        blocked.wait()
        recovering = self._start("recover", "--count", str(count))
        try:
            answer = self._read(recovering)
        finally:
            stop_process(recovering)
        completed = int(answer["completed"])
        seconds = float(answer["at"]) - t0
        return Recovery(seconds if completed == count else None, completed, note)

    def stop(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            stop_process(self.proc)
        for out in self._logs:
            out.close()
        if self.database is not None:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            self.database = None
