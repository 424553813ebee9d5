"""The processes and the load of troth's workflow benchmarks: a server cluster and
worker processes per target (`Harness`), their logs, the notification socket the
workers report on, the CPU they use, and the loops that drive workflows through
them (HITL and ten-step cycles).

Shared by `workflows.py`, `auth_cost.py`, `aging.py` and `peers/`; the parts and
what they measure are in `workflows.py`, the tables and verdicts in
`_workflow_report.py`.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _servers import (
    BACKENDS,
    Cluster,
    ServerError,
    machine_busy_seconds,
    postgres_cpu_delta,
    postgres_cpu_seconds,
    proc_cpu_seconds,
)

from troth import Client

BENCH_DIR = Path(__file__).resolve().parent
WORKER_SCRIPT = BENCH_DIR / "_workflow_worker.py"

CYCLE_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
WORKER_CONCURRENCY = 64
DEFAULT_LEASE_S = 10.0  # the SDK's default, kept in the SIGKILL phase


# --------------------------------------------------------------------------- processes


class LogTail:
    """The JSON lines a server wrote to its log since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._pending = b""

    def skip(self) -> None:
        self.read()

    def read(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        self.offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        records = []
        for line in lines:
            if not line.startswith(b"{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records


class Notifications:
    """The datagrams the workers send (`<event> <workflow id> <monotonic> <pid>`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._sock.bind(str(path))
        self._lock = threading.Condition()
        self._waiters: dict[tuple[str, str], threading.Event] = {}
        self.entered: list[tuple[str, float, int]] = []
        self._thread = threading.Thread(target=self._loop, name="notifications", daemon=True)
        self._thread.start()

    def expect(self, workflow_id: str, report: str = "suspended") -> threading.Event:
        """An event set by the next `report` for this workflow: `suspended` (its task
        suspended it) or `notified` (its notification step ran; the workflow is live)."""
        event = threading.Event()
        with self._lock:
            self._waiters[(report, workflow_id)] = event
        return event

    def forget(self, workflow_id: str, report: str = "suspended") -> None:
        with self._lock:
            self._waiters.pop((report, workflow_id), None)

    def _loop(self) -> None:
        while True:
            try:
                data = self._sock.recv(4096)
            except OSError:
                return
            parts = data.decode().split()
            if len(parts) != 4:
                continue
            event, workflow_id, at, pid = parts
            with self._lock:
                if event in ("suspended", "notified"):
                    waiter = self._waiters.pop((event, workflow_id), None)
                    if waiter is not None:
                        waiter.set()
                elif event == "enter":
                    self.entered.append((workflow_id, float(at), int(pid)))
                    self._lock.notify_all()

    def wait_entered(self, pid: int, ids: set[str], timeout: float) -> dict[str, float]:
        """Wait until every workflow in `ids` entered its step in process `pid`."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                seen = {wf: at for wf, at, p in self.entered if p == pid and wf in ids}
                remaining = deadline - time.monotonic()
                if len(seen) == len(ids) or remaining <= 0:
                    return seen
                self._lock.wait(min(remaining, 0.5))

    def close(self) -> None:
        self._sock.close()


class WorkerProcess:
    """A `bench/_workflow_worker.py` subprocess."""

    def __init__(self, workdir: Path, worker_id: str, argv: list[str]) -> None:
        self.name = self.worker_id = worker_id
        self.log_path = workdir / f"{worker_id}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            cwd=workdir,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def cpu_seconds(self) -> float | None:
        return proc_cpu_seconds(self.proc.pid)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise ServerError(
                f"worker {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()


class Harness:
    """One target's server replicas (fresh database) per part, its workers, and the
    notification socket.

    With several replicas, the workers connect to them in turn (worker i to
    replica i mod n), and there is one `Client` per replica: cycle thread i
    uses `clients[i mod n]`.
    """

    def __init__(
        self,
        root: Path,
        notes: Notifications,
        name: str,
        target: str,
        server_args: tuple[str, ...] = (),
    ) -> None:
        self.root = root
        self.notes = notes
        self.target = target
        self.workdir = root / f"{name}-{target}"
        self.workdir.mkdir()
        self.workers: list[WorkerProcess] = []
        self.clients: list[Client] = []
        self.client: Client | None = None
        self.server = Cluster(f"server-{name}", BACKENDS[target], self.workdir, server_args)
        try:
            self.addresses = self.server.addresses
            self.address = self.addresses[0]
            self.tails = [LogTail(server.stderr_path) for server in self.server.servers]
            self.clients = [Client(a, timeout=CYCLE_TIMEOUT_S) for a in self.addresses]
            self.client = self.clients[0]
        except BaseException:
            self.close()
            raise

    def read_logs(self) -> list[dict[str, Any]]:
        """The JSON lines every replica logged since the last read."""
        return [record for tail in self.tails for record in tail.read()]

    def db_cpu_seconds(self) -> dict[int, float] | None:
        return postgres_cpu_seconds() if self.server.backend.kind == "postgresql" else None

    def start_workers(
        self,
        group: str,
        count: int,
        *,
        concurrency: int = WORKER_CONCURRENCY,
        lease_s: float = DEFAULT_LEASE_S,
        cache_size: int = 256,
        block: bool = False,
    ) -> list[WorkerProcess]:
        """Start `count` worker processes of `group` and wait until each has its Poll stream."""
        started = []
        for _ in range(count):
            worker_id = f"{group}-w{len(self.workers)}-{uuid.uuid4().hex[:6]}"
            address = self.addresses[len(self.workers) % len(self.addresses)]
            argv = [
                sys.executable, str(WORKER_SCRIPT),
                "--address", address, "--group", group, "--worker-id", worker_id,
                "--concurrency", str(concurrency), "--lease", str(lease_s),
                "--cache-size", str(cache_size), "--notify", str(self.notes.path),
            ]  # fmt: skip
            if block:
                argv.append("--block")
            worker = WorkerProcess(self.workdir, worker_id, argv)
            self.workers.append(worker)
            started.append(worker)
        self.wait_connected({w.worker_id for w in started}, started)
        return started

    def wait_connected(self, worker_ids: set[str], workers: list[WorkerProcess]) -> None:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        missing = set(worker_ids)
        while missing:
            for record in self.read_logs():
                if record.get("event") == "worker.connected":
                    missing.discard(str(record.get("worker_id")))
            if not missing:
                return
            for worker in workers:
                worker.check_alive()
            self.server.check_alive()
            if time.monotonic() > deadline:
                raise ServerError(f"workers {sorted(missing)} never opened their Poll stream")
            time.sleep(0.05)

    def stop_workers(self, workers: list[WorkerProcess] | None = None) -> None:
        for worker in list(workers if workers is not None else self.workers):
            worker.stop()
            if worker in self.workers:
                self.workers.remove(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
        self.workers.clear()
        for client in self.clients:
            client.close()
        if hasattr(self, "server"):
            self.server.stop()


# --------------------------------------------------------------------------- load


class CpuMeter:
    """CPU of this process, the server, the workers and the rest of the machine over a phase."""

    def __init__(self, harness: Harness, workers: list[WorkerProcess]) -> None:
        self._harness = harness
        self._workers = workers
        self._start = self._sample()

    def _sample(
        self,
    ) -> tuple[float, float | None, float | None, float | None, dict[int, float] | None]:
        worker_times = [w.cpu_seconds() for w in self._workers]
        workers = (
            None if any(t is None for t in worker_times) else sum(t or 0 for t in worker_times)
        )
        return (
            time.process_time(),
            self._harness.server.cpu_seconds(),
            workers,
            machine_busy_seconds(),
            self._harness.db_cpu_seconds(),
        )

    def stop(
        self, elapsed: float
    ) -> tuple[float | None, float | None, float | None, float | None, float | None]:
        """(client, worker, server, other, db) CPU, in cores (1.0 = one core busy).

        `db` is every postgres process on the machine (None on SQLite); `other`
        excludes it."""
        end = self._sample()
        client = (end[0] - self._start[0]) / elapsed

        def delta(i: int) -> float | None:
            a, b = self._start[i], end[i]
            return None if a is None or b is None else (b - a) / elapsed

        server, workers, busy = delta(1), delta(2), delta(3)
        db_s = postgres_cpu_delta(self._start[4], end[4])
        db = None if db_s is None else db_s / elapsed
        other = (
            None
            if busy is None or server is None or workers is None
            else max(0.0, busy - server - workers - client - (db or 0.0))
        )
        return client, workers, server, other, db


class Raw:
    """What a throughput phase collected."""

    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.errors = 0
        self.first_error: str | None = None
        self.elapsed_s = 0.0
        self.client_cpu_s = 0.0
        self._lock = threading.Lock()

    def error(self, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{type(exc).__name__}: {exc}"


def run_loops(
    cycle: Callable[[str, int], None], prefix: str, in_flight: int, duration: float
) -> Raw:
    """`in_flight` threads each running cycles (`cycle(workflow_id, thread index)`) until
    the deadline."""
    raw = Raw()
    counter = itertools.count()
    clock = time.perf_counter_ns
    deadline = clock() + int(duration * 1e9)
    latencies = raw.latencies_ns

    def loop(slot: int) -> None:
        while clock() < deadline:
            workflow_id = f"{prefix}-{next(counter)}"
            start = clock()
            try:
                cycle(workflow_id, slot)
            except Exception as exc:
                raw.error(exc)
                continue
            latencies.append(clock() - start)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(in_flight)]
    t0 = clock()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    raw.elapsed_s = (clock() - t0) / 1e9
    return raw


def hitl_cycle(
    clients: list[Client], notes: Notifications, group: str
) -> Callable[[str, int], None]:
    def cycle(workflow_id: str, slot: int) -> None:
        client = clients[slot % len(clients)]
        suspended = notes.expect(workflow_id)
        try:
            handle = client.start("hitl", id=workflow_id, group=group)
            if not suspended.wait(CYCLE_TIMEOUT_S):
                raise TimeoutError(f"{workflow_id} never reached its wait")
        finally:
            notes.forget(workflow_id)
        client.resolve(f"{workflow_id}.0", {"approved": True})
        if handle.result(timeout=CYCLE_TIMEOUT_S) != {"approved": True}:
            raise AssertionError(f"{workflow_id}: unexpected result")

    return cycle


def ten_step_cycle(clients: list[Client], group: str) -> Callable[[str, int], None]:
    def cycle(workflow_id: str, slot: int) -> None:
        client = clients[slot % len(clients)]
        handle = client.start("ten_steps", id=workflow_id, group=group)
        if handle.result(timeout=CYCLE_TIMEOUT_S) != "done":
            raise AssertionError(f"{workflow_id}: unexpected result")

    return cycle
