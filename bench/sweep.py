"""The timeout sweep: 100,000 promises expiring in the same second, under load.

For each target (a fresh SQLite file, or a fresh PostgreSQL schema with 1 or 2
server replicas), this script:

1. measures a first quiet create+resolve throughput (`--window` seconds), to
   plan the time the bulk creation takes;
2. creates `--count` promises (`sweep-<run>-<n>`) with an absolute
   `expire_time` spread over the milliseconds of one wall-clock second, T
   (many concurrent CreatePromise calls, `--bulk-in-flight`);
3. measures the **quiet** create+resolve throughput again (the 100k pending
   rows in place, nothing due yet), ending at least a second before T;
4. at T, runs the same create+resolve load for `--window` seconds while the
   server's sweeper expires the 100k, and polls the database (read-only) every
   100 ms for the number of them still PENDING.

It reports the time from T until none is PENDING (the **drain** time; target
<= 10 s) and the create+resolve throughput between T and the end of the drain
as a share of the quiet figure (target >= 70 %). The load is `--in-flight`
loops (default 64), each creating a promise (1 h ttl) and then resolving it,
spread evenly over the replicas' addresses.

Usage (see bench/README.md, "Timeout sweep")::

    .venv/bin/python bench/sweep.py [--targets sqlite,pg] [--count 100000]
        [--troth-arg=--sweep-batch=5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from _servers import (
    BACKENDS,
    Cluster,
    ServerError,
    fmt,
    log,
    machine_busy_seconds,
    machine_info,
    percentile_ms,
    postgres_cpu_delta,
    postgres_cpu_seconds,
    table,
)
from google.protobuf import duration_pb2, timestamp_pb2

from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

DEFAULT_TARGETS = "sqlite,pg"
TARGET_DRAIN_S = 10.0
TARGET_RATIO = 0.70

CALL_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.1
JSON_HEADERS = {"content-type": "application/json"}
LOAD_TTL = duration_pb2.Duration(seconds=3600)
VALUE = types_pb2.Payload(headers=JSON_HEADERS, data=b'{"ok": true}')
PARAM = types_pb2.Payload(headers=JSON_HEADERS, data=b"{}")
PromiseServiceStub: Any = promises_pb2_grpc.PromiseServiceStub


@dataclass
class Settings:
    targets: list[str]
    count: int
    in_flight: int
    bulk_in_flight: int
    window_s: float
    warmup_s: float
    troth_args: list[str]
    json: bool
    keep: bool


@dataclass
class LoadWindow:
    calls: int
    errors: int
    elapsed_s: float
    calls_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    server_cpu: float | None
    db_cpu: float | None
    other_cpu: float | None


@dataclass
class SweepResult:
    target: str
    server_args: list[str]
    count: int
    bulk_s: float | None = None
    bulk_per_s: float | None = None
    lead_s: float | None = None
    """Seconds between the end of the quiet window and T."""
    quiet: LoadWindow | None = None
    during: LoadWindow | None = None
    """The load between T and the end of the drain (at least 1 s)."""
    during_window: LoadWindow | None = None
    """The whole `--window` from T."""
    ratio: float | None = None
    drain_s: float | None = None
    pending_left: int | None = None
    pending_trace: list[tuple[float, int]] | None = None
    error: str | None = None


# --------------------------------------------------------------------------- load


class Load:
    """grpc.aio channels to every replica; `in_flight` create-then-resolve loops."""

    def __init__(self, addresses: list[str], run_id: str) -> None:
        self._runner = asyncio.Runner()
        self._channels = [
            self._runner.run(self._open(address, self._runner)) for address in addresses
        ]
        self._stubs = [PromiseServiceStub(channel) for channel in self._channels]
        self._run_id = run_id
        self._counter = itertools.count()

    @staticmethod
    async def _open(address: str, _runner: asyncio.Runner) -> grpc.aio.Channel:
        channel = grpc.aio.insecure_channel(address)
        await channel.channel_ready()
        return channel

    def run(self, in_flight: int, until_wall: float) -> tuple[list[float], list[int], int]:
        """Loops until wall-clock `until_wall`; (completion wall times, latencies ns, errors)."""
        return self._runner.run(self._run(in_flight, until_wall))

    async def _run(self, in_flight: int, until_wall: float) -> tuple[list[float], list[int], int]:
        done_at: list[float] = []
        latencies: list[int] = []
        errors = [0]
        clock, wall = time.perf_counter_ns, time.time

        async def loop(stub: Any) -> None:
            while wall() < until_wall:
                promise_id = f"load-{self._run_id}-{next(self._counter)}"
                for call, request in (
                    (
                        stub.CreatePromise,
                        promises_pb2.CreatePromiseRequest(id=promise_id, param=PARAM, ttl=LOAD_TTL),
                    ),
                    (
                        stub.ResolvePromise,
                        promises_pb2.ResolvePromiseRequest(id=promise_id, value=VALUE),
                    ),
                ):
                    start = clock()
                    try:
                        await call(request, timeout=CALL_TIMEOUT_S)
                    except grpc.aio.AioRpcError as exc:
                        errors[0] += 1
                        if errors[0] == 1:
                            log(f"    first error: {exc.code().name}: {exc.details()}")
                        break
                    latencies.append(clock() - start)
                    done_at.append(wall())

        stubs = self._stubs
        await asyncio.gather(*(loop(stubs[i % len(stubs)]) for i in range(in_flight)))
        return done_at, latencies, errors[0]

    def bulk_create(self, prefix: str, count: int, t_ms: int, in_flight: int) -> int:
        """`count` promises expiring at T + (n mod 1000) ms; returns the errors."""
        return self._runner.run(self._bulk(prefix, count, t_ms, in_flight))

    async def _bulk(self, prefix: str, count: int, t_ms: int, in_flight: int) -> int:
        numbers = iter(range(count))
        errors = 0

        async def loop(stub: Any) -> None:
            nonlocal errors
            for n in numbers:
                at = t_ms + n % 1000
                request = promises_pb2.CreatePromiseRequest(
                    id=f"{prefix}{n}",
                    param=PARAM,
                    expire_time=timestamp_pb2.Timestamp(
                        seconds=at // 1000, nanos=(at % 1000) * 1_000_000
                    ),
                )
                try:
                    await stub.CreatePromise(request, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    errors += 1
                    if errors == 1:
                        log(f"    first bulk error: {exc.code().name}: {exc.details()}")

        stubs = self._stubs
        await asyncio.gather(*(loop(stubs[i % len(stubs)]) for i in range(in_flight)))
        return errors

    def close(self) -> None:
        for channel in self._channels:
            self._runner.run(channel.close())
        self._runner.close()


class CpuMeter:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._pg = cluster.backend.kind == "postgresql"
        self._start = self._sample()

    def _sample(self) -> tuple[float, float | None, float | None, dict[int, float] | None]:
        db = postgres_cpu_seconds() if self._pg else None
        return time.process_time(), self._cluster.cpu_seconds(), machine_busy_seconds(), db

    def stop(self, elapsed: float) -> tuple[float | None, float | None, float | None]:
        """(server, db, other) CPU in cores over `elapsed` seconds."""
        end = self._sample()
        client = end[0] - self._start[0]
        server = None if end[1] is None or self._start[1] is None else end[1] - self._start[1]
        busy = None if end[2] is None or self._start[2] is None else end[2] - self._start[2]
        db = postgres_cpu_delta(self._start[3], end[3])
        other = (
            None
            if busy is None or server is None or client is None
            else max(0.0, busy - server - client - (db or 0.0)) / elapsed
        )
        return (
            None if server is None else server / elapsed,
            None if db is None else db / elapsed,
            other,
        )


def window(
    done_at: list[float],
    latencies: list[int],
    errors: int,
    start: float,
    end: float,
    cpu: tuple[float | None, float | None, float | None] = (None, None, None),
) -> LoadWindow:
    """The calls that completed in [start, end) (wall clock)."""
    picked = sorted(lat for at, lat in zip(done_at, latencies, strict=True) if start <= at < end)
    elapsed = max(end - start, 1e-9)
    return LoadWindow(
        calls=len(picked),
        errors=errors,
        elapsed_s=round(elapsed, 3),
        calls_per_s=len(picked) / elapsed,
        p50_ms=percentile_ms(picked, 50),
        p99_ms=percentile_ms(picked, 99),
        server_cpu=cpu[0],
        db_cpu=cpu[1],
        other_cpu=cpu[2],
    )


def measure_quiet(load: Load, cluster: Cluster, settings: Settings) -> LoadWindow:
    if settings.warmup_s > 0:
        load.run(settings.in_flight, time.time() + settings.warmup_s)
    meter = CpuMeter(cluster)
    t0 = time.time()
    done_at, latencies, errors = load.run(settings.in_flight, t0 + settings.window_s)
    t1 = time.time()
    return window(done_at, latencies, errors, t0, t1, meter.stop(t1 - t0))


# --------------------------------------------------------------------------- one target


def run_target(target: str, settings: Settings, root: Path, run_id: str) -> SweepResult:
    backend = BACKENDS[target]
    workdir = root / target
    workdir.mkdir()
    result = SweepResult(target, settings.troth_args, settings.count)
    log(f"{target}: starting {backend.replicas} troth server(s) on {backend.kind}")
    cluster = Cluster(f"sweep-{target}", backend, workdir, settings.troth_args)
    load: Load | None = None
    try:
        load = Load(cluster.addresses, f"{run_id}-{target}")
        first = measure_quiet(load, cluster, settings)
        log(f"  first quiet window: {first.calls_per_s:,.0f} calls/s")
        # Plan T: the bulk creation (at about the quiet create rate, which is a
        # pessimistic guess with more in flight), a quiet window, and margins.
        estimate = settings.count / max(first.calls_per_s, 100.0) * 2.0
        # + the quiet window and its warm-up, which end 1 s before T, and up to 2 s of
        # slack (less for a small count: the smoke test).
        slack = 1.0 + min(2.0, estimate)
        t_s = math.ceil(time.time() + estimate + settings.warmup_s + settings.window_s + slack)
        t_ms = t_s * 1000
        prefix = f"sweep-{run_id}-"
        log(
            f"  creating {settings.count:,} promises expiring in the second starting "
            f"{time.strftime('%H:%M:%S', time.localtime(t_s))} ({t_s - time.time():.0f} s away)"
        )
        b0 = time.time()
        bulk_errors = load.bulk_create(prefix, settings.count, t_ms, settings.bulk_in_flight)
        result.bulk_s = time.time() - b0
        result.bulk_per_s = settings.count / result.bulk_s
        log(f"  created in {result.bulk_s:.1f} s ({result.bulk_per_s:,.0f}/s)")
        if bulk_errors:
            raise ServerError(f"{bulk_errors} bulk creates failed")
        cluster.check_alive()
        quiet_s = settings.warmup_s + settings.window_s + 1.0
        if time.time() + quiet_s > t_s:
            raise ServerError(
                f"the bulk creation took {result.bulk_s:.0f} s, past the planned T; "
                "the quiet window no longer fits before it"
            )
        time.sleep(max(0.0, t_s - quiet_s - time.time()))
        result.quiet = measure_quiet(load, cluster, settings)
        result.lead_s = t_s - time.time()
        log(
            f"  quiet: {result.quiet.calls_per_s:,.0f} calls/s, p99 "
            f"{fmt(result.quiet.p99_ms, '.1f')} ms ({result.lead_s:.1f} s before T)"
        )
        pending = cluster.database.query(
            "SELECT count(*) FROM promises WHERE state = 'PENDING' AND id LIKE ?",
            (prefix + "%",),
        )[0][0]
        if pending != settings.count:
            raise ServerError(f"{pending} of {settings.count} pending before T")

        # At T: the load, and a poller counting what is still pending.
        trace: list[tuple[float, int]] = []
        drained = threading.Event()
        stop_polling = threading.Event()

        def poll() -> None:
            while not stop_polling.is_set():
                left = cluster.database.query(
                    "SELECT count(*) FROM promises WHERE state = 'PENDING' "
                    "AND expire_time >= ? AND expire_time < ?",
                    (t_ms, t_ms + 1000),
                )[0][0]
                trace.append((time.time() - t_s, int(left)))
                if left == 0:
                    drained.set()
                    return
                stop_polling.wait(POLL_INTERVAL_S)

        time.sleep(max(0.0, t_s - time.time()))
        poller = threading.Thread(target=poll, name="pending-poller", daemon=True)
        poller.start()
        meter = CpuMeter(cluster)
        done_at, latencies, errors = load.run(settings.in_flight, t_s + settings.window_s)
        end = time.time()
        cpu = meter.stop(end - t_s)
        if not drained.wait(max(0.0, 60.0 - (time.time() - t_s))):
            stop_polling.set()
        poller.join()
        cluster.check_alive()
        result.pending_trace = [(round(t, 2), n) for t, n in trace]
        result.pending_left = trace[-1][1] if trace else None
        if drained.is_set():
            result.drain_s = trace[-1][0]
        drain_end = t_s + max(1.0, min(result.drain_s or settings.window_s, settings.window_s))
        result.during = window(done_at, latencies, errors, t_s, drain_end)
        result.during_window = window(done_at, latencies, errors, t_s, end, cpu)
        result.ratio = result.during.calls_per_s / result.quiet.calls_per_s
        log(
            f"  drained in {fmt(result.drain_s, '.2f')} s; during the drain "
            f"{result.during.calls_per_s:,.0f} calls/s = {result.ratio:.0%} of quiet, p99 "
            f"{fmt(result.during.p99_ms, '.1f')} ms"
        )
    except ServerError as exc:
        result.error = str(exc)
        log(f"  {target}: {exc}")
    finally:
        if load is not None:
            load.close()
        cluster.stop()
    return result


# --------------------------------------------------------------------------- output


def verdict(r: SweepResult) -> str:
    if r.error:
        return f"N/A {r.target}: {r.error}"
    drain_ok = r.drain_s is not None and r.drain_s <= TARGET_DRAIN_S
    ratio_ok = r.ratio is not None and r.ratio >= TARGET_RATIO
    label = "PASS" if drain_ok and ratio_ok else "MISS"
    drain = (
        f"{r.drain_s:.2f} s"
        if r.drain_s is not None
        else f"not drained ({r.pending_left} still pending after 60 s)"
    )
    args = " ".join(r.server_args) or "default sweeper flags"
    return (
        f"{label} {r.target} ({args}): {r.count:,} expiring in one second all settled in "
        f"{drain} ({'PASS' if drain_ok else 'MISS'}, target <= {TARGET_DRAIN_S:g} s); "
        f"create+resolve during the drain {fmt(r.ratio, '.0%')} of quiet "
        f"({'PASS' if ratio_ok else 'MISS'}, target >= {TARGET_RATIO:.0%})"
    )


def render(results: list[SweepResult]) -> str:
    header = ["target", "bulk/s", "quiet/s", "quiet p99", "drain s", "during/s", "ratio",
              "during p99", "window/s", "srv cpu", "db cpu", "other cpu"]  # fmt: skip
    rows: list[list[str]] = []
    for r in results:
        q, d, w = r.quiet, r.during, r.during_window
        rows.append(
            [
                r.target,
                fmt(r.bulk_per_s, ",.0f"),
                fmt(q and q.calls_per_s, ",.0f"),
                fmt(q and q.p99_ms, ".1f"),
                fmt(r.drain_s, ".2f"),
                fmt(d and d.calls_per_s, ",.0f"),
                fmt(r.ratio, ".0%"),
                fmt(d and d.p99_ms, ".1f"),
                fmt(w and w.calls_per_s, ",.0f"),
                fmt(w and w.server_cpu, ".0%"),
                fmt(w and w.db_cpu, ".0%"),
                fmt(w and w.other_cpu, ".0%"),
            ]
        )
    return table(header, rows)


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description="troth timeout sweep: N promises expiring in one second, under load."
    )
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"comma-separated, from {', '.join(BACKENDS)} (default {DEFAULT_TARGETS})",
    )
    parser.add_argument("--count", type=int, default=100_000, help="promises expiring at T")
    parser.add_argument("--in-flight", type=int, default=64, help="create+resolve loops (64)")
    parser.add_argument(
        "--bulk-in-flight", type=int, default=256, help="concurrent creates of the N (256)"
    )
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds of each load window (default 10)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds of unmeasured load before the quiet window",
    )
    parser.add_argument(
        "--troth-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `troth_server serve` (repeatable), "
        "e.g. --troth-arg=--sweep-batch=5000",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or not set(targets) <= set(BACKENDS):
        parser.error(f"--targets must name targets among {', '.join(BACKENDS)}")
    if args.count < 1 or args.in_flight < 1 or args.bulk_in_flight < 1 or args.window <= 0:
        parser.error("--count, --in-flight, --bulk-in-flight must be >= 1 and --window > 0")
    return Settings(
        targets=targets,
        count=args.count,
        in_flight=args.in_flight,
        bulk_in_flight=args.bulk_in_flight,
        window_s=args.window,
        warmup_s=max(0.0, args.warmup),
        troth_args=args.troth_arg,
        json=args.json,
        keep=args.keep,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="troth-sweep-"))
    machine = machine_info()
    log(
        f"troth sweep {run_id}: {settings.count:,} promises, {settings.in_flight} in flight, "
        f"{settings.window_s:g} s windows, {machine['cpus']} cpus, load average "
        f"{' '.join(f'{x:.2f}' for x in machine['loadavg'])}"
    )
    results: list[SweepResult] = []
    failed = False
    for target in settings.targets:
        try:
            results.append(run_target(target, settings, root, run_id))
        except ServerError as exc:
            failed = True
            results.append(SweepResult(target, settings.troth_args, settings.count, error=str(exc)))
            log(f"{target}: FAILED: {exc}")
    if settings.json:
        document = {
            "run_id": run_id,
            "machine": machine,
            "settings": asdict(settings),
            "results": [asdict(r) for r in results],
            "verdicts": [verdict(r) for r in results],
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"\ntroth sweep: {settings.count:,} promises expiring in one second; create+resolve "
            f"load {settings.in_flight} in flight; {machine['cpus']} cpus, python "
            f"{machine['python']}, grpcio {machine['grpcio']}\n"
        )
        print(render(results))
        print()
        for r in results:
            print(verdict(r))
    if failed or settings.keep:
        log(f"work directory kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
