"""Workflow throughput, resume, recovery and latency of troth, with real worker processes.

One run measures, side by side (see bench/README.md, "Workflows"):

1. human-in-the-loop cycles/s: start a workflow (`hitl`: latent promise, a
   notification step, wait), learn that it waits, settle the promise by ID,
   observe `handle.result()`; with 1 and 2 worker processes, at 1, 16 and 64
   cycles in flight; and the RPCs one isolated cycle costs, from the server's
   canonical `rpc` log lines;
2. 10-step workflows/s (`ten_steps`: ten sequential `ctx.run` steps);
3. resume of a workflow with a 1k/10k/50k-step history (built with the Tasks and
   Promises APIs, with the ids, tags and fence the engine writes): settle to completion;
4. recovery: a worker process holding 200 workflows, each inside a step, is
   SIGKILLed (or frozen with SIGSTOP); time until each runs again on another worker;
5. settle-to-completion latency of a suspended workflow, one at a time.

The server is `python -m troth_server serve` (grpc.aio, durable SQLite,
default settings) on a fresh database per part; workers are subprocesses
running `bench/_workflow_worker.py`; the clients are `troth.Client` in this
process (one thread per cycle in flight).

The processes and the load they share with the other benchmarks are in
`_workflow_load.py`; the result rows, verdicts and tables in `_workflow_report.py`.

Usage::

    .venv/bin/python bench/workflows.py [--quick] [--parts 1,2,3,4,5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from _servers import (
    BACKENDS,
    ServerError,
    fmt,
    log,
    machine_info,
    percentile_ms,
)
from _workflow_load import (
    CYCLE_TIMEOUT_S,
    DEFAULT_LEASE_S,
    CpuMeter,
    Harness,
    Notifications,
    WorkerProcess,
    hitl_cycle,
    run_loops,
    ten_step_cycle,
)
from _workflow_report import (
    LatencyRow,
    RecoveryRow,
    Results,
    ResumeRow,
    RpcLine,
    ThroughputRow,
    render,
    verdicts,
)
from _workflow_worker import cheap_step

from troth._commands import TAG_ARGS, TAG_FUNC, TAG_GROUP, TAG_KIND, CreatePromise, Kind, RunStep
from troth._digests import args_digest
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from troth import Client

RESUME_TIMEOUT_S = 120.0
RECOVERY_TIMEOUT_S = 60.0

JSON_HEADERS = {"content-type": "application/json"}
RESUME_APPROVALS = 3  # resumes measured per history length
MESSAGE_TOO_LARGE = "larger than max"  # gRPC's words for a message over the size limit
# A server whose message limit (2 x max payload + 1 MiB) fits a 50k-step history.
RAISED_LIMIT_ARGS = ("--max-payload-bytes", str(8 * 1024 * 1024))
RECOVERY_LEASE_S = 2.0  # the lease of the workers in the SIGSTOP phase


PromiseServiceStub: Any = promises_pb2_grpc.PromiseServiceStub
TaskServiceStub: Any = tasks_pb2_grpc.TaskServiceStub
DEFAULT_TARGETS = "sqlite,pg,pg2"


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    targets: list[str]
    parts: list[int]
    quick: bool
    duration_s: float
    warmup_s: float
    hitl_in_flight: list[int]
    hitl_workers: list[int]
    steps_in_flight: list[int]
    steps_workers: list[int]
    history_sizes: list[int]
    recovery_count: int
    latency_samples: int
    keep: bool
    json: bool


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(
        description="troth workflow benchmark: HITL cycles, 10-step workflows, long-history "
        "resume, recovery after SIGKILL/SIGSTOP, settle-to-completion latency."
    )
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--parts", default="1,2,3,4,5", help="which parts to run (default all)")
    parser.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"comma-separated, from {', '.join(BACKENDS)}: a fresh SQLite file, or a fresh "
        f"PostgreSQL schema with 1 or 2 server replicas (default {DEFAULT_TARGETS})",
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds per measured phase")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of warm-up per phase")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (databases, logs)"
    )
    args = parser.parse_args(argv)
    try:
        parts = sorted({int(p) for p in args.parts.split(",") if p.strip()})
    except ValueError:
        parser.error("--parts takes comma-separated part numbers, e.g. 1,2")
    if not parts or not set(parts) <= {1, 2, 3, 4, 5}:
        parser.error("--parts must name parts among 1,2,3,4,5")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets or not set(targets) <= set(BACKENDS):
        parser.error(f"--targets must name targets among {', '.join(BACKENDS)}")
    quick = bool(args.quick)
    duration = args.duration if args.duration is not None else (1.0 if quick else 5.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if quick else 1.0)
    if duration <= 0 or warmup < 0:
        parser.error("--duration must be > 0 and --warmup >= 0")
    return Settings(
        targets=targets,
        parts=parts,
        quick=quick,
        duration_s=duration,
        warmup_s=warmup,
        hitl_in_flight=[1, 16] if quick else [1, 16, 64],
        hitl_workers=[1] if quick else [1, 2],
        steps_in_flight=[16] if quick else [16, 64],
        steps_workers=[1] if quick else [1, 2],
        history_sizes=[100, 1_000] if quick else [1_000, 10_000, 50_000],
        recovery_count=20 if quick else 200,
        latency_samples=20 if quick else 200,
        keep=args.keep,
        json=args.json,
    )


# --------------------------------------------------------------------------- throughput


def measure_phase(
    harness: Harness,
    workers: list[WorkerProcess],
    cycle: Callable[[str, int], None],
    *,
    part: int,
    workload: str,
    prefix: str,
    in_flight: int,
    settings: Settings,
) -> ThroughputRow:
    if settings.warmup_s > 0:
        run_loops(cycle, f"{prefix}-warm", in_flight, settings.warmup_s)
    stats0 = harness.server.stats()
    meter = CpuMeter(harness, workers)
    raw = run_loops(cycle, prefix, in_flight, settings.duration_s)
    elapsed = raw.elapsed_s or float("nan")
    client_cpu, worker_cpu, server_cpu, other_cpu, db_cpu = meter.stop(elapsed)
    stats1 = harness.server.stats()
    harness.server.check_alive()
    for worker in workers:
        worker.check_alive()
    latencies = sorted(raw.latencies_ns)
    row = ThroughputRow(
        part=part,
        workload=workload,
        workers=len(workers),
        in_flight=in_flight,
        completed=len(latencies),
        errors=raw.errors,
        elapsed_s=round(raw.elapsed_s, 3),
        per_s=len(latencies) / elapsed,
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        client_cpu=client_cpu,
        worker_cpu=worker_cpu,
        server_cpu=server_cpu,
        other_cpu=other_cpu,
        commits_per_s=(stats1[0] - stats0[0]) / elapsed,
        first_error=raw.first_error,
        db_cpu=db_cpu,
        target=harness.target,
    )
    log(
        f"  [{harness.target}] {workload} {len(workers)}w x{in_flight}: {row.completed} in "
        f"{row.elapsed_s:.2f} s "
        f"= {row.per_s:,.0f}/s, p50 {fmt(row.p50_ms, '.1f')} ms, p99 {fmt(row.p99_ms, '.1f')} "
        f"ms, errors {row.errors}"
    )
    if raw.first_error:
        log(f"    first error: {raw.first_error}")
    return row


def count_cycle_rpcs(harness: Harness, group: str, run_id: str) -> list[RpcLine]:
    """One cycle alone on an idle server; the server's `rpc` log lines it caused."""
    cycle = hitl_cycle(harness.clients, harness.notes, group)
    cycle(f"rpc-warm-{run_id}", 0)
    time.sleep(0.5)
    harness.read_logs()
    workflow_id = f"rpc-{run_id}"
    cycle(workflow_id, 0)
    time.sleep(0.5)  # the watch's line is written when its stream ends
    lines = []
    for record in harness.read_logs():
        if record.get("event") != "rpc":
            continue
        method = str(record.get("method"))
        promise_id = record.get("promise_id")
        if method in ("Poll", "Heartbeat"):
            continue  # the stream stays open; heartbeats are per worker, not per cycle
        client_side = method in ("ResolvePromise", "WatchPromise", "GetPromise") or (
            method == "CreatePromise" and promise_id == workflow_id
        )
        duration = record.get("duration_ms")
        lines.append(
            RpcLine(
                side="client" if client_side else "worker",
                method=method,
                promise_id=str(promise_id) if promise_id else None,
                server_ms=float(duration) if isinstance(duration, int | float) else None,
            )
        )
    return lines


def part_throughput(
    part: int,
    target: str,
    settings: Settings,
    root: Path,
    notes: Notifications,
    run_id: str,
    out: Results,
) -> None:
    name = "hitl" if part == 1 else "ten-steps"
    harness = Harness(root, notes, f"part{part}", target)
    try:
        worker_counts = settings.hitl_workers if part == 1 else settings.steps_workers
        levels = settings.hitl_in_flight if part == 1 else settings.steps_in_flight
        for count in worker_counts:
            group = f"{name}-{target}-{count}w-{run_id}"
            workers = harness.start_workers(group, count)
            cycle = (
                hitl_cycle(harness.clients, notes, group)
                if part == 1
                else ten_step_cycle(harness.clients, group)
            )
            for in_flight in levels:
                out.throughput.append(
                    measure_phase(
                        harness,
                        workers,
                        cycle,
                        part=part,
                        workload=name,
                        prefix=f"{group}-x{in_flight}",
                        in_flight=in_flight,
                        settings=settings,
                    )
                )
            if part == 1 and count == 1 and not out.rpcs:
                out.rpcs = count_cycle_rpcs(harness, group, run_id)
            harness.stop_workers(workers)
    finally:
        harness.close()


# --------------------------------------------------------------------------- part 3: resume


async def build_history(
    address: str,
    client: Client,
    group: str,
    workflow_id: str,
    steps: int,
    hand_over: Callable[[], object],
) -> tuple[float, float]:
    """`long_history`'s history past its gate, written as a worker of the root writes it.

    A workflow's steps carry the fence of the task holding its root (README,
    "Steps belong to their workflow by record"), and a replay finds no step past
    the promise it blocks on. So: claim the root's INVOKE task with a raw Poll
    under a throwaway worker id (no other worker polls the group yet); create the
    gate `<id>.0` as `ctx.promise()` does; open it as a human would; record the
    steps `<id>.1..steps` as `ctx.run(cheap_step, n)` does; call `hand_over` (which
    starts the measured worker); release the task, which goes to the measured
    worker (most room). Returns (seconds the steps took, `perf_counter` at the release).
    """
    worker_id = f"{group}-builder-{uuid.uuid4().hex[:6]}"
    async with grpc.aio.insecure_channel(address) as channel:
        stub = PromiseServiceStub(channel)
        tasks = TaskServiceStub(channel)
        request = tasks_pb2.PollRequest(group=group, worker_id=worker_id, capacity=1)
        request.lease.seconds = 600  # the build outlasts the default lease at 50k steps
        poll = tasks.Poll(request)
        try:
            task = (await asyncio.wait_for(poll.read(), CYCLE_TIMEOUT_S)).task
            if task.root_promise_id != workflow_id or task.kind != tasks_pb2.TASK_KIND_INVOKE:
                raise RuntimeError(f"expected the INVOKE task of {workflow_id}, got {task}")
            fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id=worker_id)
            gate_tags = {TAG_KIND: str(Kind.PROMISE), TAG_GROUP: group}
            gate_digest = args_digest(CreatePromise())
            if gate_digest:
                gate_tags[TAG_ARGS] = gate_digest
            gate = promises_pb2.CreatePromiseRequest(
                id=f"{workflow_id}.0",
                param=types_pb2.Payload(),
                tags=gate_tags,
                requested_by=f"workflow {workflow_id}",
                fence=fence,
            )
            await stub.CreatePromise(gate, timeout=CYCLE_TIMEOUT_S)
            await asyncio.to_thread(client.resolve, f"{workflow_id}.0", "open")

            t0 = time.perf_counter()
            positions = iter(range(1, steps + 1))

            async def loop() -> None:
                for position in positions:
                    n = position - 1
                    tags = {TAG_KIND: str(Kind.RUN), TAG_FUNC: "cheap_step"}
                    digest = args_digest(RunStep(cheap_step, (n,)))
                    if digest:
                        tags[TAG_ARGS] = digest
                    request = promises_pb2.CreatePromiseRequest(
                        id=f"{workflow_id}.{position}",
                        param=types_pb2.Payload(),
                        tags=tags,
                        resolved_with=types_pb2.Payload(headers=JSON_HEADERS, data=str(n).encode()),
                        fence=fence,
                    )
                    await stub.CreatePromise(request, timeout=CYCLE_TIMEOUT_S)

            await asyncio.gather(*(loop() for _ in range(64)))
            build_s = time.perf_counter() - t0
            await asyncio.to_thread(hand_over)
            released_at = time.perf_counter()
            await tasks.ReleaseTask(
                tasks_pb2.ReleaseTaskRequest(
                    task_id=task.id, counter=task.counter, worker_id=worker_id
                ),
                timeout=CYCLE_TIMEOUT_S,
            )
            return build_s, released_at
        finally:
            poll.cancel()


def part_resume(
    target: str, settings: Settings, root: Path, notes: Notifications, out: Results
) -> None:
    harness = Harness(root, notes, "part3", target)
    raised: Harness | None = None
    try:
        for steps in settings.history_sizes:
            row = resume_one(harness, steps, "default")
            out.resume.append(row)
            if row.error and MESSAGE_TOO_LARGE in row.error:
                # The task cannot be delivered under the server's default message limit;
                # measure the same history on a server whose limit is raised.
                if raised is None:
                    log(f"  again on a server with {' '.join(RAISED_LIMIT_ARGS)}")
                    raised = Harness(root, notes, "part3-raised", target, RAISED_LIMIT_ARGS)
                out.resume.append(resume_one(raised, steps, " ".join(RAISED_LIMIT_ARGS)))
    finally:
        harness.close()
        if raised is not None:
            raised.close()


def wait_resumed(event: threading.Event, worker: WorkerProcess, timeout: float) -> str | None:
    """Wait for a `suspended` report; the reason it will not come, if the worker says so."""
    deadline = time.monotonic() + timeout
    while not event.wait(0.2):
        tail = worker.log_tail(20)
        if MESSAGE_TOO_LARGE in tail:
            line = next(ln for ln in reversed(tail.splitlines()) if MESSAGE_TOO_LARGE in ln)
            detail = line[line.find("RESOURCE_EXHAUSTED") :].split(");")[0]
            return f"task never delivered: Poll stream broke with {detail}"
        worker.check_alive()
        if time.monotonic() > deadline:
            return f"no resume within {timeout:.0f} s" + worker_hint(worker)
    return None


def resume_one(harness: Harness, steps: int, server: str) -> ResumeRow:
    """One workflow with a `steps`-step history, on its own worker (and group)."""
    group = f"resume-{steps}"
    client = harness.client
    assert client is not None
    notes = harness.notes
    workflow_id = f"long-{steps}-{uuid.uuid4().hex[:6]}"
    row = ResumeRow(steps, server, None, None, None, [], None, None, None, None)
    row.target = harness.target
    started: list[WorkerProcess] = []

    def hand_over() -> None:
        # No cache: every resume replays the whole history, as on a worker that did
        # not suspend the workflow (or after a restart).
        started.extend(harness.start_workers(group, 1, concurrency=4, cache_size=0))

    suspended = notes.expect(workflow_id)
    client.start("long_history", steps, RESUME_APPROVALS, id=workflow_id, group=group)
    try:
        row.build_s, t0 = asyncio.run(
            build_history(harness.address, client, group, workflow_id, steps, hand_over)
        )
        row.build_per_s = steps / row.build_s
        log(f"  history of {steps:,} steps created in {row.build_s:.1f} s")
        (worker,) = started
        cpu0 = (worker.cpu_seconds(), harness.server.cpu_seconds())
        return resume_measure(harness, worker, row, workflow_id, steps, suspended, t0, cpu0)
    finally:
        for worker in started:
            worker.kill()  # a task it cannot receive would keep it busy
            harness.workers.remove(worker)


def resume_measure(
    harness: Harness,
    worker: WorkerProcess,
    row: ResumeRow,
    workflow_id: str,
    steps: int,
    suspended: threading.Event,
    t0: float,
    cpu0: tuple[float | None, float | None],
) -> ResumeRow:
    """From the release of the built history (`t0`): the first resume, a replay of the
    whole history on the measured worker, then `RESUME_APPROVALS` settles."""
    client = harness.client
    assert client is not None
    notes = harness.notes
    error = wait_resumed(suspended, worker, RESUME_TIMEOUT_S)
    if error is not None:
        notes.forget(workflow_id)
        row.error = error
        log(f"  {steps:,} steps: {row.error}")
        return row
    row.first_resume_s = time.perf_counter() - t0
    for k in range(RESUME_APPROVALS):
        approval = f"{workflow_id}.{steps + 1 + k}"
        last = k == RESUME_APPROVALS - 1
        watch = client.watch(workflow_id, timeout=RESUME_TIMEOUT_S)
        next(watch)  # pending
        suspended = notes.expect(workflow_id)
        t0 = time.perf_counter()
        client.resolve(approval, k)
        if last:
            done = next(watch)
            elapsed = time.perf_counter() - t0
            if not done.is_settled:
                row.error = "the workflow did not finish"
        else:
            error = wait_resumed(suspended, worker, RESUME_TIMEOUT_S)
            elapsed = time.perf_counter() - t0
            if error is not None:
                row.error = f"resume {k}: {error}"
        notes.forget(workflow_id)
        close_iterator(watch)
        if row.error:
            break
        row.resumes_s.append(elapsed)
    cpu1 = (worker.cpu_seconds(), harness.server.cpu_seconds())
    if cpu0[0] is not None and cpu1[0] is not None:
        row.worker_cpu_s = cpu1[0] - cpu0[0]
    if cpu0[1] is not None and cpu1[1] is not None:
        row.server_cpu_s = cpu1[1] - cpu0[1]
    if row.resumes_s:
        row.median_s = statistics.median(row.resumes_s)
        row.per_1k_steps_ms = row.median_s / steps * 1e6
    log(
        f"  {steps:,} steps: first resume {fmt(row.first_resume_s, '.3f')} s, resumes "
        f"{', '.join(f'{s:.3f}' for s in row.resumes_s)} s"
        + (f" ({row.error})" if row.error else "")
    )
    return row


def close_iterator(iterator: object) -> None:
    """End a watch early (`Client.watch` is a generator; closing it cancels the stream)."""
    close = getattr(iterator, "close", None)
    if callable(close):
        close()


def worker_hint(worker: WorkerProcess) -> str:
    tail = worker.log_tail(5)
    return f"; worker log: {tail.splitlines()[-1]}" if tail else ""


# --------------------------------------------------------------------------- part 4: recovery


def part_recovery(
    target: str, settings: Settings, root: Path, notes: Notifications, run_id: str, out: Results
) -> None:
    harness = Harness(root, notes, "part4", target)
    try:
        for signum, lease in (
            (signal.SIGKILL, DEFAULT_LEASE_S),
            (signal.SIGSTOP, RECOVERY_LEASE_S),
        ):
            out.recovery.append(
                recover_one(harness, signum, lease, settings.recovery_count, run_id)
            )
    finally:
        harness.close()


def recover_one(
    harness: Harness, signum: int, lease_s: float, count: int, run_id: str
) -> RecoveryRow:
    client = harness.client
    assert client is not None
    name = signal.Signals(signum).name
    group = f"recover-{name.lower()}-{harness.target}-{run_id}"
    row = RecoveryRow(name, count, lease_s, 0, None, None, None, 0, target=harness.target)
    capacity = count
    (first,) = harness.start_workers(group, 1, concurrency=capacity, lease_s=lease_s, block=True)
    ids = {f"{group}-{i}" for i in range(count)}
    for workflow_id in sorted(ids):
        client.start("held", id=workflow_id, group=group)
    entered = harness.notes.wait_entered(first.pid, ids, CYCLE_TIMEOUT_S)
    if len(entered) < count:
        row.error = (
            f"only {len(entered)} of {count} workflows entered their step on the first worker"
        )
        return row
    (second,) = harness.start_workers(group, 1, concurrency=capacity, lease_s=lease_s)
    time.sleep(0.2)
    log(f"  {name}: {count} workflows inside a step on worker pid {first.pid}; signalling it")
    t0 = time.monotonic()
    first.signal(signum)
    again = harness.notes.wait_entered(second.pid, ids, RECOVERY_TIMEOUT_S)
    waits = sorted(at - t0 for at in again.values())
    row.recovered = len(waits)
    if waits:
        row.p50_s = waits[max(0, math.ceil(0.5 * len(waits)) - 1)]
        row.p99_s = waits[max(0, math.ceil(0.99 * len(waits)) - 1)]
        row.max_s = waits[-1]
    if len(waits) < count:
        row.error = f"only {len(waits)} of {count} ran again within {RECOVERY_TIMEOUT_S:.0f} s"
    completed = 0
    for workflow_id in sorted(again):
        try:
            client.handle(workflow_id).result(timeout=CYCLE_TIMEOUT_S)
            completed += 1
        except Exception as exc:
            row.error = row.error or f"{workflow_id}: {type(exc).__name__}: {exc}"
    row.completed = completed
    row.assignments = task_assignments(harness, f"{group}-")
    log(
        f"  {name}: {row.recovered}/{count} running again on pid {second.pid}: "
        f"p50 {fmt(row.p50_s, '.3f')} s, p99 {fmt(row.p99_s, '.3f')} s, "
        f"max {fmt(row.max_s, '.3f')} s; {completed} completed"
    )
    first.kill()  # SIGKILL also ends a stopped process
    harness.workers.remove(first)
    harness.stop_workers([second])
    return row


def task_assignments(harness: Harness, root_prefix: str) -> float | None:
    """Mean task counter (leases handed out) of the roots with this prefix, read-only."""
    try:
        rows = harness.server.database.query(
            "SELECT counter FROM tasks WHERE root_promise_id LIKE ?", (root_prefix + "%",)
        )
        counters = [int(c) for (c,) in rows]
    except Exception as exc:
        log(f"  could not read task counters: {exc}")
        return None
    return statistics.mean(counters) if counters else None


# --------------------------------------------------------------------------- part 5: latency


def part_latency(
    target: str, settings: Settings, root: Path, notes: Notifications, out: Results
) -> None:
    harness = Harness(root, notes, "part5", target)
    try:
        client = harness.client
        assert client is not None
        group = "latency"
        harness.start_workers(group, 1)
        # The settle goes to the last replica, the worker and the watch use the first:
        # with 2 replicas the wake-up crosses replicas (LISTEN/NOTIFY).
        settler = harness.clients[-1]
        ids = [f"lat-{target}-{i}" for i in range(settings.latency_samples)]
        events = {i: notes.expect(i) for i in ids}
        for workflow_id in ids:
            client.start("hitl", id=workflow_id, group=group)
        for workflow_id, event in events.items():
            if not event.wait(CYCLE_TIMEOUT_S):
                raise ServerError(f"{workflow_id} never suspended")
        time.sleep(0.5)
        samples: list[int] = []
        server_ms: list[float] = []
        errors = 0
        for workflow_id in ids:
            watch = client.watch(workflow_id, timeout=CYCLE_TIMEOUT_S)
            try:
                next(watch)  # pending
                t0 = time.perf_counter_ns()
                settled = settler.resolve(f"{workflow_id}.0", {"approved": True}).promise
                done = next(watch)
                samples.append(time.perf_counter_ns() - t0)
            except Exception:
                errors += 1
                continue
            finally:
                close_iterator(watch)
            if done.settle_time is not None and settled.settle_time is not None:
                server_ms.append((done.settle_time - settled.settle_time).total_seconds() * 1e3)
        samples.sort()
        server_ms.sort()
        out.latency.append(
            LatencyRow(
                samples=len(samples),
                p50_ms=percentile_ms(samples, 50),
                p99_ms=percentile_ms(samples, 99),
                max_ms=samples[-1] / 1e6 if samples else None,
                server_p50_ms=_pct(server_ms, 50),
                server_p99_ms=_pct(server_ms, 99),
                errors=errors,
                target=target,
            )
        )
        r = out.latency[-1]
        log(
            f"  settle to completion: p50 {fmt(r.p50_ms, '.2f')} ms, p99 {fmt(r.p99_ms, '.2f')} "
            f"ms over {r.samples}"
        )
        harness.stop_workers()
    finally:
        harness.close()


def _pct(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    return values[max(0, math.ceil(pct / 100 * len(values)) - 1)]


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="troth-wfbench-"))
    machine = machine_info()
    log(
        f"troth workflow bench {run_id}: parts {settings.parts}, {settings.duration_s:g} s per "
        f"phase (+{settings.warmup_s:g} s warm-up){' (quick)' if settings.quick else ''}, "
        f"{machine['cpus']} cpus, python {machine['python']}, grpcio {machine['grpcio']}"
    )
    notes = Notifications(root / "notify.sock")
    results = Results()
    runners: dict[int, Callable[[str], None]] = {
        1: lambda t: part_throughput(1, t, settings, root, notes, run_id, results),
        2: lambda t: part_throughput(2, t, settings, root, notes, run_id, results),
        3: lambda t: part_resume(t, settings, root, notes, results),
        4: lambda t: part_recovery(t, settings, root, notes, run_id, results),
        5: lambda t: part_latency(t, settings, root, notes, results),
    }
    titles = {
        1: "human-in-the-loop cycles",
        2: "10-step workflows",
        3: "resume of a long history",
        4: "recovery after SIGKILL / SIGSTOP",
        5: "settle-to-completion latency",
    }
    started = time.monotonic()
    for part in settings.parts:
        for target in settings.targets:
            log(f"part {part} [{target}]: {titles[part]}")
            try:
                runners[part](target)
            except (ServerError, OSError, TimeoutError) as exc:
                results.failures[f"part {part} [{target}]"] = str(exc)
                log(f"part {part} [{target}]: FAILED: {exc}")
    notes.close()
    verdict_list = verdicts(results, settings.parts, settings.targets)
    wall = time.monotonic() - started

    if settings.json:
        document = {
            "run_id": run_id,
            "machine": machine,
            "settings": asdict(settings),
            "wall_s": round(wall, 1),
            "results": asdict(results),
            "verdicts": [asdict(v) for v in verdict_list],
        }
        print(json.dumps(document, indent=2))
    else:
        print(
            f"\ntroth workflows, {settings.duration_s:g} s per throughput phase, "
            f"{machine['cpus']} cpus, python {machine['python']}, grpcio {machine['grpcio']}, "
            f"{wall:.0f} s in all\n"
        )
        print(render(results) or "(no results)")
        print()
        for v in verdict_list:
            print(v.text)

    if results.failures or settings.keep:
        log(f"work directory kept: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if results.failures else 0


if __name__ == "__main__":
    sys.exit(main())
