"""Create + resolve throughput and latency of troth, against the gRPC echo ceiling.

For each target (the troth server, and a trivial echo server of the same
``troth.v1.Promises`` service built with the same grpcio settings, in its
thread-pool and grpc.aio variants) and each in-flight level, this script runs
CreatePromise with unique ids for a fixed time, then ResolvePromise on the ids
it created, from one load-generating client in this process, and reports
calls/s, p50 and p99 latency, troth's ratio to the echo ceilings, and the
SQLite commits the troth server made (and the requests each carried).

Usage (see bench/README.md)::

    .venv/bin/python bench/promises.py [--duration 5] [--concurrency 1,16,64]
        [--targets echo-sync,echo-aio,troth] [--client aio] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import grpc.aio
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

BENCH_DIR = Path(__file__).resolve().parent
ECHO_SCRIPT = BENCH_DIR / "_echo.py"

# Echo variants: target name -> `_echo.py --mode`.
ECHO_TARGETS: dict[str, str] = {"echo-sync": "sync", "echo-aio": "aio"}
# troth variants: target name -> extra arguments to `troth_server serve`. If the
# server offers a choice of gRPC server (thread pool or grpc.aio), add one
# entry per choice here so both are measured in the same run.
TROTH_TARGETS: dict[str, list[str]] = {
    "troth": ["--grpc-mode", "thread"],
    "troth-aio": ["--grpc-mode", "aio"],
}
DEFAULT_TARGETS = "echo-sync,echo-aio,troth,troth-aio"

CLIENT_OPTIONS: list[tuple[str, int | str]] = []
CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0
STATS_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0

# The target, checked at VERDICT_IN_FLIGHT for each troth target.
VERDICT_IN_FLIGHT = 64
VERDICT_MIN_RATIO = 0.60
VERDICT_MAX_P99_MS = 20.0

JSON_HEADERS = {"content-type": "application/json"}
TTL = duration_pb2.Duration(seconds=3600)
RESOLVE_VALUE = b'{"ok": true}'

OPS = ("create", "resolve")
RPC_NAMES = {"create": "CreatePromise", "resolve": "ResolvePromise"}
# The generated gRPC module is untyped; calls go through Any.
PromisesStub: Any = promises_pb2_grpc.PromisesStub

Request: TypeAlias = promises_pb2.CreatePromiseRequest | promises_pb2.ResolvePromiseRequest
NextRequest: TypeAlias = Callable[[], Request | None]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- results


@dataclass
class PhaseResult:
    target: str
    op: str
    in_flight: int
    calls: int
    errors: int
    elapsed_s: float
    calls_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    client_cpu: float
    server_cpu: float | None
    other_cpu: float | None
    commits: int | None = None
    write_requests: int | None = None
    commits_per_s: float | None = None
    requests_per_commit: float | None = None
    vs_echo_sync: float | None = None
    vs_echo_aio: float | None = None
    first_error: str | None = None


@dataclass
class RawPhase:
    latencies_ns: list[int] = field(default_factory=list)
    ok_ids: list[str] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0
    client_cpu_s: float = 0.0

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            code, details = getattr(exc, "code", None), getattr(exc, "details", None)
            if callable(code) and callable(details):
                self.first_error = f"{code().name}: {details()}"
            else:
                self.first_error = repr(exc)


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


def percentile_ms(sorted_ns: list[int], pct: float) -> float | None:
    """Nearest-rank percentile of sorted nanosecond latencies, in milliseconds."""
    if not sorted_ns:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_ns)))
    return sorted_ns[rank - 1] / 1e6


# --------------------------------------------------------------------------- requests


def create_requests(run_id: str, counter: Iterator[int]) -> NextRequest:
    """Unique ids `bench-<run>-<n>`, a one-hour ttl and a small JSON param."""

    def make() -> Request:
        n = next(counter)
        return promises_pb2.CreatePromiseRequest(
            id=f"bench-{run_id}-{n}",
            param=types_pb2.Payload(headers=JSON_HEADERS, data=b'{"n": %d}' % n),
            ttl=TTL,
        )

    return make


def resolve_requests(ids: list[str]) -> NextRequest:
    """Resolves each id once, in creation order; None once they are exhausted."""
    it = iter(ids)

    def make() -> Request | None:
        promise_id = next(it, None)
        if promise_id is None:
            return None
        return promises_pb2.ResolvePromiseRequest(
            id=promise_id, value=types_pb2.Payload(headers=JSON_HEADERS, data=RESOLVE_VALUE)
        )

    return make


# --------------------------------------------------------------------------- clients
#
# Each client keeps `in_flight` calls outstanding on one channel until the
# deadline passes or the requests run out, and times each call from just before
# it is issued to its reply. The request is built before the clock starts.
# next() on itertools.count and on a list iterator is atomic under the GIL, so
# the request factories need no lock.


class AioClient:
    """grpc.aio channel; `in_flight` coroutines each loop: send, await the reply."""

    name = "aio"

    def __init__(self, address: str) -> None:
        self._runner = asyncio.Runner()
        self._channel: grpc.aio.Channel = self._runner.run(self._open(address))
        stub = PromisesStub(self._channel)
        self._calls: dict[str, Any] = {op: getattr(stub, RPC_NAMES[op]) for op in OPS}

    @staticmethod
    async def _open(address: str) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
        await channel.channel_ready()
        return channel

    def run(
        self, op: str, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        return self._runner.run(self._run(self._calls[op], next_request, in_flight, duration_s))

    @staticmethod
    async def _run(
        call: Any, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        raw = RawPhase()
        clock = time.perf_counter_ns
        deadline = clock() + int(duration_s * 1e9)
        latencies, ok_ids = raw.latencies_ns, raw.ok_ids

        async def worker() -> None:
            while clock() < deadline:
                request = next_request()
                if request is None:
                    return
                start = clock()
                try:
                    await call(request, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    raw.error(exc)
                    continue
                latencies.append(clock() - start)
                ok_ids.append(request.id)

        cpu0, t0 = time.process_time(), clock()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        self._runner.run(self._channel.close())
        self._runner.close()


class FutureClient:
    """Sync channel; `in_flight` chains of `.future()` calls, each reply issuing the next."""

    name = "future"

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        grpc.channel_ready_future(self._channel).result(timeout=START_TIMEOUT_S)
        stub = PromisesStub(self._channel)
        self._calls: dict[str, Any] = {op: getattr(stub, RPC_NAMES[op]) for op in OPS}

    def run(
        self, op: str, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        call = self._calls[op]
        raw = RawPhase()
        clock = time.perf_counter_ns
        deadline = clock() + int(duration_s * 1e9)
        latencies, ok_ids = raw.latencies_ns, raw.ok_ids
        lock = threading.Lock()
        remaining = [in_flight]
        done = threading.Event()

        def slot_done() -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        def launch() -> None:
            while True:
                request = next_request() if clock() < deadline else None
                if request is None:
                    slot_done()
                    return
                start = clock()
                try:
                    future = call.future(request, timeout=CALL_TIMEOUT_S)
                except Exception as exc:  # the channel refused the call outright
                    raw.error(exc)
                    continue
                future.add_done_callback(functools.partial(finished, request=request, start=start))
                return

        def finished(future: Any, request: Request, start: int) -> None:
            end = clock()
            exc = future.exception()
            if exc is None:
                latencies.append(end - start)
                ok_ids.append(request.id)
            else:
                raw.error(exc)
            launch()

        cpu0, t0 = time.process_time(), clock()
        for _ in range(in_flight):
            launch()
        if not done.wait(duration_s + CALL_TIMEOUT_S + 10):
            raise ServerError(f"load generator stalled: {remaining[0]} call chains never ended")
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        self._channel.close()


class ThreadsClient:
    """Sync channel; `in_flight` threads each making blocking calls (for comparison)."""

    name = "threads"

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        grpc.channel_ready_future(self._channel).result(timeout=START_TIMEOUT_S)
        stub = PromisesStub(self._channel)
        self._calls: dict[str, Any] = {op: getattr(stub, RPC_NAMES[op]) for op in OPS}

    def run(
        self, op: str, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        call = self._calls[op]
        raw = RawPhase()
        clock = time.perf_counter_ns
        deadline = clock() + int(duration_s * 1e9)
        latencies, ok_ids = raw.latencies_ns, raw.ok_ids

        def worker() -> None:
            while clock() < deadline:
                request = next_request()
                if request is None:
                    return
                start = clock()
                try:
                    call(request, timeout=CALL_TIMEOUT_S)
                except grpc.RpcError as exc:
                    raw.error(exc)
                    continue
                latencies.append(clock() - start)
                ok_ids.append(request.id)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(in_flight)]
        cpu0, t0 = time.process_time(), clock()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        self._channel.close()


Client = AioClient | FutureClient | ThreadsClient
CLIENTS: dict[str, Callable[[str], Client]] = {
    "aio": AioClient,
    "future": FutureClient,
    "threads": ThreadsClient,
}
# Chosen by measurement against both echo servers (see bench/README.md): at 64
# in flight it drives both harder than "aio" and costs less CPU per call.
DEFAULT_CLIENT = "future"


# --------------------------------------------------------------------------- servers


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
        try:
            data = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = data[data.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


def server_argv(target: str, workdir: Path, port_file: Path, troth_args: list[str]) -> list[str]:
    if target in ECHO_TARGETS:
        return [
            sys.executable,
            str(ECHO_SCRIPT),
            "--mode",
            ECHO_TARGETS[target],
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
        ]
    return [
        sys.executable,
        "-m",
        "troth_server",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--db",
        f"sqlite:///{workdir}/bench.db",
        "--port-file",
        str(port_file),
        *TROTH_TARGETS[target],
        *troth_args,
    ]


# --------------------------------------------------------------------------- running


@dataclass
class Settings:
    duration_s: float
    warmup_s: float
    concurrency: list[int]
    targets: list[str]
    client: str
    troth_args: list[str]
    keep: bool
    json: bool


def summarize(
    target: str,
    op: str,
    in_flight: int,
    raw: RawPhase,
    server_cpu_s: float | None,
    busy_s: float | None,
    stats: tuple[tuple[int, int], tuple[int, int]] | None,
) -> PhaseResult:
    latencies = sorted(raw.latencies_ns)
    elapsed = raw.elapsed_s or float("nan")
    result = PhaseResult(
        target=target,
        op=op,
        in_flight=in_flight,
        calls=len(latencies),
        errors=raw.errors,
        elapsed_s=round(raw.elapsed_s, 3),
        calls_per_s=len(latencies) / elapsed,
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        client_cpu=raw.client_cpu_s / elapsed,
        server_cpu=None if server_cpu_s is None else server_cpu_s / elapsed,
        other_cpu=None
        if busy_s is None or server_cpu_s is None
        else max(0.0, busy_s - server_cpu_s - raw.client_cpu_s) / elapsed,
        first_error=raw.first_error,
    )
    if stats is not None:
        (c0, r0), (c1, r1) = stats
        result.commits, result.write_requests = c1 - c0, r1 - r0
        result.commits_per_s = result.commits / elapsed
        result.requests_per_commit = (
            result.write_requests / result.commits if result.commits else None
        )
    return result


def run_target(
    target: str, settings: Settings, run_id: str, counter: Iterator[int], root: Path
) -> list[PhaseResult]:
    workdir = root / target
    workdir.mkdir()
    port_file = workdir / "port"
    argv = server_argv(target, workdir, port_file, settings.troth_args)
    log(f"{target}: starting {shlex.join(argv)}")
    server = ServerProcess(target, argv, workdir, port_file)
    results: list[PhaseResult] = []
    client: Client | None = None
    try:
        address = server.wait_ready()
        use_stats = target in TROTH_TARGETS
        if use_stats and not server.catches_sigusr1():
            log(f"  {target}: the server has no SIGUSR1 handler; commit stats not collected")
            use_stats = False
        client = CLIENTS[settings.client](address)

        def phase(op: str, make: NextRequest, in_flight: int, measured: bool) -> RawPhase:
            duration = settings.duration_s if measured else settings.warmup_s
            before = server.stats() if measured and use_stats else None
            cpu0, busy0 = server.cpu_seconds(), machine_busy_seconds()
            raw = client.run(op, make, in_flight, duration)
            cpu1, busy1 = server.cpu_seconds(), machine_busy_seconds()
            server.check_alive()
            if measured:
                after = server.stats() if use_stats else None
                result = summarize(
                    target,
                    op,
                    in_flight,
                    raw,
                    None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
                    None if busy0 is None or busy1 is None else busy1 - busy0,
                    None if before is None or after is None else (before, after),
                )
                results.append(result)
                log(f"  {format_progress(result)}")
                if result.first_error:
                    log(f"    first error: {result.first_error}")
            return raw

        for in_flight in settings.concurrency:
            warm = phase("create", create_requests(run_id, counter), in_flight, measured=False)
            created = phase("create", create_requests(run_id, counter), in_flight, measured=True)
            phase("resolve", resolve_requests(warm.ok_ids), in_flight, measured=False)
            phase("resolve", resolve_requests(created.ok_ids), in_flight, measured=True)
    finally:
        if client is not None:
            client.close()
        server.stop()
    return results


def format_progress(r: PhaseResult) -> str:
    p50 = "-" if r.p50_ms is None else f"{r.p50_ms:.2f}"
    p99 = "-" if r.p99_ms is None else f"{r.p99_ms:.2f}"
    line = (
        f"{r.target} {r.op} x{r.in_flight}: {r.calls} calls in {r.elapsed_s:.2f} s = "
        f"{r.calls_per_s:,.0f}/s, p50 {p50} ms, p99 {p99} ms, errors {r.errors}"
    )
    if r.commits is not None:
        line += f", {r.commits} commits"
    return line


def add_ratios(results: list[PhaseResult]) -> None:
    ceiling = {
        (r.target, r.op, r.in_flight): r.calls_per_s for r in results if r.target in ECHO_TARGETS
    }
    for r in results:
        if r.target in ECHO_TARGETS:
            continue
        sync = ceiling.get(("echo-sync", r.op, r.in_flight))
        aio = ceiling.get(("echo-aio", r.op, r.in_flight))
        r.vs_echo_sync = r.calls_per_s / sync if sync else None
        r.vs_echo_aio = r.calls_per_s / aio if aio else None


@dataclass
class Verdict:
    target: str
    passed: bool | None
    text: str


def verdicts(results: list[PhaseResult], targets: list[str]) -> list[Verdict]:
    out: list[Verdict] = []
    for target in targets:
        if target in ECHO_TARGETS:
            continue
        rows = {r.op: r for r in results if r.target == target and r.in_flight == VERDICT_IN_FLIGHT}
        parts: list[str] = []
        passed: bool | None = True
        for op in OPS:
            r = rows.get(op)
            if r is None:
                parts.append(f"{op}: not measured at {VERDICT_IN_FLIGHT} in flight")
                passed = None
                continue
            ceilings = [
                (name, e.calls_per_s)
                for e in results
                for name in ECHO_TARGETS
                if e.target == name and e.op == op and e.in_flight == VERDICT_IN_FLIGHT
            ]
            p99 = r.p99_ms
            p99_ok = p99 is not None and p99 < VERDICT_MAX_P99_MS
            p99_text = "-" if p99 is None else f"{p99:.2f}"
            if not ceilings:
                parts.append(f"{op}: {r.calls_per_s:,.0f}/s (no echo ceiling), p99 {p99_text} ms")
                passed = None
                continue
            best_name, best = max(ceilings, key=lambda c: c[1])
            ratio = r.calls_per_s / best if best else 0.0
            ok = ratio >= VERDICT_MIN_RATIO and p99_ok and r.errors == 0
            if passed is not None:
                passed = passed and ok
            parts.append(
                f"{op} {r.calls_per_s:,.0f}/s = {ratio:.0%} of {best_name} {best:,.0f}/s, "
                f"p99 {p99_text} ms, errors {r.errors}"
            )
        label = {True: "PASS", False: "MISS", None: "N/A"}[passed]
        criteria = (
            f"(>= {VERDICT_MIN_RATIO:.0%} of the best echo ceiling, p99 < "
            f"{VERDICT_MAX_P99_MS:.0f} ms, no errors, at {VERDICT_IN_FLIGHT} in flight)"
        )
        out.append(
            Verdict(target, passed, f"{label} {target}: " + "; ".join(parts) + f" {criteria}")
        )
    return out


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, spec)


def render_table(results: list[PhaseResult]) -> str:
    header = [
        "target",
        "op",
        "in-flight",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "vs echo-sync",
        "vs echo-aio",
        "commits/s",
        "req/commit",
        "srv cpu",
        "cli cpu",
        "other cpu",
    ]
    rows = [header]
    for r in results:
        rows.append(
            [
                r.target,
                r.op,
                str(r.in_flight),
                fmt(r.calls_per_s, ",.0f"),
                fmt(r.p50_ms, ".2f"),
                fmt(r.p99_ms, ".2f"),
                str(r.errors),
                fmt(r.vs_echo_sync, ".0%"),
                fmt(r.vs_echo_aio, ".0%"),
                fmt(r.commits_per_s, ",.0f"),
                fmt(r.requests_per_commit, ".1f"),
                fmt(r.server_cpu, ".0%"),
                fmt(r.client_cpu, ".0%"),
                fmt(r.other_cpu, ".0%"),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for n, row in enumerate(rows):
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description="troth create/resolve throughput and latency against the gRPC echo ceiling."
    )
    parser.add_argument(
        "--duration", type=float, default=5.0, help="seconds per measured phase (default 5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of warm-up before each phase (default 1)"
    )
    parser.add_argument(
        "--concurrency", default="1,16,64", help="in-flight call levels (default 1,16,64)"
    )
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"comma-separated, from {', '.join([*ECHO_TARGETS, *TROTH_TARGETS])} "
        f"(default {DEFAULT_TARGETS})",
    )
    parser.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default=DEFAULT_CLIENT,
        help=f"load generator, the same for every target (default {DEFAULT_CLIENT})",
    )
    parser.add_argument(
        "--troth-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `troth_server serve` (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (databases, server logs)"
    )
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    known = {*ECHO_TARGETS, *TROTH_TARGETS}
    unknown = [t for t in targets if t not in known]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {sorted(known)}")
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error("--concurrency takes comma-separated integers")
    if not concurrency or min(concurrency) < 1:
        parser.error("--concurrency levels must be >= 1")
    if args.duration <= 0 or args.warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    return Settings(
        duration_s=args.duration,
        warmup_s=args.warmup,
        concurrency=concurrency,
        targets=targets,
        client=args.client,
        troth_args=args.troth_arg,
        keep=args.keep,
        json=args.json,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    run_id = uuid.uuid4().hex[:8]
    counter = itertools.count()
    root = Path(tempfile.mkdtemp(prefix="troth-bench-"))
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "platform": platform.platform(),
    }
    log(
        f"troth bench {run_id}: client {settings.client}, {settings.duration_s:g} s per phase "
        f"(+{settings.warmup_s:g} s warm-up), in flight {settings.concurrency}, "
        f"{machine['cpus']} cpus, python {machine['python']}, grpcio {machine['grpcio']}"
    )
    results: list[PhaseResult] = []
    failures: dict[str, str] = {}
    for target in settings.targets:
        try:
            results.extend(run_target(target, settings, run_id, counter, root))
        except ServerError as exc:
            failures[target] = str(exc)
            log(f"{target}: FAILED: {exc}")
    add_ratios(results)
    verdict_list = verdicts(results, [t for t in settings.targets if t not in failures])

    if settings.json:
        document = {
            "run_id": run_id,
            "machine": machine,
            "settings": asdict(settings),
            "results": [asdict(r) for r in results],
            "verdicts": [asdict(v) for v in verdict_list],
            "failures": failures,
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"\nclient {settings.client}, {settings.duration_s:g} s per phase, "
            f"{machine['cpus']} cpus, python {machine['python']}, grpcio {machine['grpcio']}\n"
        )
        print(render_table(results) if results else "(no results)")
        print()
        for v in verdict_list:
            print(v.text)
        for target, message in failures.items():
            print(f"FAILED {target}: {message.splitlines()[0]}")

    if failures or settings.keep:
        log(f"work directory kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
