"""Create + resolve throughput and latency of troth, against the gRPC echo ceiling.

For each target (the troth server, and a trivial echo server of the same
``troth.v1.PromiseService`` service built with the same grpcio settings, in its
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
import shlex
import shutil
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
from _servers import (
    BACKENDS,
    Cluster,
    ServerError,
    ServerProcess,
    fmt,
    log,
    machine_busy_seconds,
    machine_info,
    percentile_ms,
    postgres_cpu_delta,
    postgres_cpu_seconds,
    table,
)
from google.protobuf import duration_pb2

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

BENCH_DIR = Path(__file__).resolve().parent
ECHO_SCRIPT = BENCH_DIR / "_echo.py"

# Echo variants: target name -> `_echo.py --mode`.
ECHO_TARGETS: dict[str, str] = {"echo-sync": "sync", "echo-aio": "aio"}
# troth variants: target name -> (backend, extra arguments to `troth_server
# serve`). The backend (`_servers.BACKENDS`) is a fresh SQLite file, or a fresh
# PostgreSQL schema served by 1 or 2 replicas; the load client spreads its
# in-flight calls evenly over the replicas' addresses.
TROTH_TARGETS: dict[str, tuple[str, list[str]]] = {
    "troth": ("sqlite", []),
    "troth-pg": ("pg", []),
    "troth-pg2": ("pg2", []),
}
DEFAULT_TARGETS = "echo-sync,echo-aio,troth,troth-pg,troth-pg2"

CLIENT_OPTIONS: list[tuple[str, int | str]] = []
CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 60.0

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
PromiseServiceStub: Any = promises_pb2_grpc.PromiseServiceStub

Request: TypeAlias = promises_pb2.CreatePromiseRequest | promises_pb2.ResolvePromiseRequest
NextRequest: TypeAlias = Callable[[], Request | None]


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
    db_cpu: float | None = None
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


def resolve_requests(ids: list[str], value: bytes = RESOLVE_VALUE) -> NextRequest:
    """Resolves each id once with `value` (JSON), in creation order; None once they
    are exhausted."""
    it = iter(ids)

    def make() -> Request | None:
        promise_id = next(it, None)
        if promise_id is None:
            return None
        return promises_pb2.ResolvePromiseRequest(
            id=promise_id, value=types_pb2.Payload(headers=JSON_HEADERS, data=value)
        )

    return make


# --------------------------------------------------------------------------- clients
#
# Each client keeps `in_flight` calls outstanding until the deadline passes or
# the requests run out, and times each call from just before it is issued to its
# reply. It opens one channel per server address (one for a single server, one
# per replica) and gives the in-flight slots to the channels in turn, so the load
# is spread evenly over the replicas. The request is built before the clock starts.
# next() on itertools.count and on a list iterator is atomic under the GIL, so
# the request factories need no lock.


class AioClient:
    """grpc.aio channels; `in_flight` coroutines each loop: send, await the reply."""

    name = "aio"

    def __init__(self, addresses: list[str]) -> None:
        self._runner = asyncio.Runner()
        self._channels: list[grpc.aio.Channel] = [
            self._runner.run(self._open(address)) for address in addresses
        ]
        stubs = [PromiseServiceStub(channel) for channel in self._channels]
        self._calls: dict[str, list[Any]] = {
            op: [getattr(stub, RPC_NAMES[op]) for stub in stubs] for op in OPS
        }

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
        calls: list[Any], next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        raw = RawPhase()
        clock = time.perf_counter_ns
        deadline = clock() + int(duration_s * 1e9)
        latencies, ok_ids = raw.latencies_ns, raw.ok_ids

        async def worker(call: Any) -> None:
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
        await asyncio.gather(*(worker(calls[i % len(calls)]) for i in range(in_flight)))
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        for channel in self._channels:
            self._runner.run(channel.close())
        self._runner.close()


class FutureClient:
    """Sync channel; `in_flight` chains of `.future()` calls, each reply issuing the next."""

    name = "future"

    def __init__(self, addresses: list[str]) -> None:
        self._channels = [sync_channel(address) for address in addresses]
        stubs = [PromiseServiceStub(channel) for channel in self._channels]
        self._calls: dict[str, list[Any]] = {
            op: [getattr(stub, RPC_NAMES[op]) for stub in stubs] for op in OPS
        }

    def run(
        self, op: str, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        calls = self._calls[op]
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

        def launch(call: Any) -> None:
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
                future.add_done_callback(
                    functools.partial(finished, call=call, request=request, start=start)
                )
                return

        def finished(future: Any, call: Any, request: Request, start: int) -> None:
            end = clock()
            exc = future.exception()
            if exc is None:
                latencies.append(end - start)
                ok_ids.append(request.id)
            else:
                raw.error(exc)
            launch(call)

        cpu0, t0 = time.process_time(), clock()
        for i in range(in_flight):
            launch(calls[i % len(calls)])
        if not done.wait(duration_s + CALL_TIMEOUT_S + 10):
            raise ServerError(f"load generator stalled: {remaining[0]} call chains never ended")
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


class ThreadsClient:
    """Sync channel; `in_flight` threads each making blocking calls (for comparison)."""

    name = "threads"

    def __init__(self, addresses: list[str]) -> None:
        self._channels = [sync_channel(address) for address in addresses]
        stubs = [PromiseServiceStub(channel) for channel in self._channels]
        self._calls: dict[str, list[Any]] = {
            op: [getattr(stub, RPC_NAMES[op]) for stub in stubs] for op in OPS
        }

    def run(
        self, op: str, next_request: NextRequest, in_flight: int, duration_s: float
    ) -> RawPhase:
        calls = self._calls[op]
        raw = RawPhase()
        clock = time.perf_counter_ns
        deadline = clock() + int(duration_s * 1e9)
        latencies, ok_ids = raw.latencies_ns, raw.ok_ids

        def worker(call: Any) -> None:
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

        threads = [
            threading.Thread(target=worker, args=(calls[i % len(calls)],), daemon=True)
            for i in range(in_flight)
        ]
        cpu0, t0 = time.process_time(), clock()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        raw.elapsed_s = (clock() - t0) / 1e9
        raw.client_cpu_s = time.process_time() - cpu0
        return raw

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


def sync_channel(address: str) -> grpc.Channel:
    channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
    grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
    return channel


Client = AioClient | FutureClient | ThreadsClient
CLIENTS: dict[str, Callable[[list[str]], Client]] = {
    "aio": AioClient,
    "future": FutureClient,
    "threads": ThreadsClient,
}
# Chosen by measurement against both echo servers (see bench/README.md): at 64
# in flight it drives both harder than "aio" and costs less CPU per call.
DEFAULT_CLIENT = "future"


# --------------------------------------------------------------------------- servers


class EchoServer:
    """An echo server (`_echo.py`) behind the same interface as `_servers.Cluster`."""

    def __init__(self, target: str, workdir: Path) -> None:
        port_file = workdir / "port"
        argv = [
            sys.executable, str(ECHO_SCRIPT), "--mode", ECHO_TARGETS[target],
            "--listen", "127.0.0.1:0", "--port-file", str(port_file),
        ]  # fmt: skip
        log(f"{target}: starting {shlex.join(argv)}")
        self.server = ServerProcess(target, argv, workdir, port_file)
        try:
            self.addresses = [self.server.wait_ready()]
        except BaseException:
            self.server.stop()
            raise

    def cpu_seconds(self) -> float | None:
        return self.server.cpu_seconds()

    def check_alive(self) -> None:
        self.server.check_alive()

    def stats(self) -> tuple[int, int]:
        raise ServerError("echo servers keep no commit statistics")

    def stop(self) -> None:
        self.server.stop()


def start_target(target: str, workdir: Path, troth_args: list[str]) -> EchoServer | Cluster:
    if target in ECHO_TARGETS:
        return EchoServer(target, workdir)
    backend, args = TROTH_TARGETS[target]
    log(f"{target}: starting {BACKENDS[backend].replicas} troth server(s) on {backend}")
    cluster = Cluster(target, BACKENDS[backend], workdir, [*args, *troth_args])
    log(f"  {shlex.join(cluster.argv)}")
    return cluster


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
    db_cpu_s: float | None = None,
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
        else max(0.0, busy_s - server_cpu_s - raw.client_cpu_s - (db_cpu_s or 0.0)) / elapsed,
        db_cpu=None if db_cpu_s is None else db_cpu_s / elapsed,
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
    server = start_target(target, workdir, settings.troth_args)
    results: list[PhaseResult] = []
    client: Client | None = None
    try:
        use_stats = isinstance(server, Cluster)
        if isinstance(server, Cluster) and not server.catches_sigusr1():
            log(f"  {target}: the server has no SIGUSR1 handler; commit stats not collected")
            use_stats = False
        client = CLIENTS[settings.client](server.addresses)
        on_pg = isinstance(server, Cluster) and server.backend.kind == "postgresql"

        def db_cpu() -> dict[int, float] | None:
            return postgres_cpu_seconds() if on_pg else None

        def phase(op: str, make: NextRequest, in_flight: int, measured: bool) -> RawPhase:
            duration = settings.duration_s if measured else settings.warmup_s
            before = server.stats() if measured and use_stats else None
            cpu0, busy0, db0 = server.cpu_seconds(), machine_busy_seconds(), db_cpu()
            raw = client.run(op, make, in_flight, duration)
            cpu1, busy1, db1 = server.cpu_seconds(), machine_busy_seconds(), db_cpu()
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
                    postgres_cpu_delta(db0, db1),
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
        "db cpu",
        "other cpu",
    ]
    rows: list[list[str]] = []
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
                fmt(r.db_cpu, ".0%"),
                fmt(r.other_cpu, ".0%"),
            ]
        )
    return table(header, rows, left=2)


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
    machine = machine_info()
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
