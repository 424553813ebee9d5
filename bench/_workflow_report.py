"""What `workflows.py` measured, as rows, tables and verdicts: the result rows of
each part, the issue's targets and the verdict on each, and the text report.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from _servers import (
    fmt,
    table,
)

# Targets (issue 3, "Benchmark").
TARGET_HITL_PER_S = 1000.0
TARGET_TEN_STEP_PER_S = 400.0
TARGET_IN_FLIGHT = 64
TARGET_RESUME_STEPS = 10_000
TARGET_RESUME_S = 1.0
LINEARITY_MAX_RATIO = 1.5  # per-step resume cost at the largest history vs the target's
TARGET_KILL_P99_S = 1.0
TARGET_STOP_SLACK_S = 1.0  # frozen: within lease + this
TARGET_LATENCY_P50_MS = 10.0


# --------------------------------------------------------------------------- results


@dataclass
class ThroughputRow:
    part: int
    workload: str
    workers: int
    in_flight: int
    completed: int
    errors: int
    elapsed_s: float
    per_s: float
    p50_ms: float | None
    p99_ms: float | None
    client_cpu: float | None
    worker_cpu: float | None
    server_cpu: float | None
    other_cpu: float | None
    commits_per_s: float | None
    first_error: str | None = None
    db_cpu: float | None = None
    target: str = ""


@dataclass
class RpcLine:
    side: str  # "client" or "worker"
    method: str
    promise_id: str | None
    server_ms: float | None


@dataclass
class ResumeRow:
    steps: int
    server: str
    build_s: float | None
    build_per_s: float | None
    first_resume_s: float | None
    resumes_s: list[float]
    median_s: float | None
    per_1k_steps_ms: float | None
    worker_cpu_s: float | None
    server_cpu_s: float | None
    error: str | None = None
    target: str = ""


@dataclass
class RecoveryRow:
    signal: str
    workflows: int
    lease_s: float
    recovered: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    completed: int
    assignments: float | None = None
    """Mean times each task was leased (the task counter, read from the database)."""
    error: str | None = None
    target: str = ""


@dataclass
class LatencyRow:
    samples: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    server_p50_ms: float | None
    server_p99_ms: float | None
    errors: int
    target: str = ""


@dataclass
class Verdict:
    part: int
    passed: bool | None
    text: str


@dataclass
class Results:
    throughput: list[ThroughputRow] = field(default_factory=list)
    rpcs: list[RpcLine] = field(default_factory=list)
    resume: list[ResumeRow] = field(default_factory=list)
    recovery: list[RecoveryRow] = field(default_factory=list)
    latency: list[LatencyRow] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- verdicts


def verdicts(results: Results, parts: list[int], targets: list[str]) -> list[Verdict]:
    """The verdict on each target of the parts that ran, for these targets."""
    out: list[Verdict] = []
    for part, workload, target in (
        (1, "hitl", TARGET_HITL_PER_S),
        (2, "ten-steps", TARGET_TEN_STEP_PER_S),
    ):
        if part not in parts:
            continue
        rows = [
            r
            for r in results.throughput
            if r.workload == workload and r.in_flight == TARGET_IN_FLIGHT
        ]
        what = "HITL cycles/s" if part == 1 else "10-step workflows/s"
        if not rows:
            text = f"N/A ({part}) {what}: not measured at {TARGET_IN_FLIGHT} in flight"
            out.append(Verdict(part, None, text))
            continue
        for r in rows:
            ok = r.per_s >= target and r.errors == 0
            out.append(
                Verdict(
                    part,
                    ok,
                    f"{'PASS' if ok else 'MISS'} ({part}) [{r.target}] {what}, {r.workers} worker "
                    f"process(es), {r.in_flight} in flight: {r.per_s:,.0f}/s (target >= "
                    f"{target:,.0f}/s), errors {r.errors}",
                )
            )
    if 3 in parts:
        for t in targets:
            rows_t = [r for r in results.resume if r.target == t]
            if rows_t:
                out.extend(resume_verdicts(t, rows_t))
    if 4 in parts:
        for rec in results.recovery:
            limit = (
                TARGET_KILL_P99_S if rec.signal == "SIGKILL" else rec.lease_s + TARGET_STOP_SLACK_S
            )
            ok = rec.p99_s is not None and rec.p99_s < limit and rec.error is None
            how = (
                "by stream break"
                if rec.signal == "SIGKILL"
                else f"frozen, lease {rec.lease_s:g} s + {TARGET_STOP_SLACK_S:g} s"
            )
            extra = f"; {rec.error}" if rec.error else ""
            out.append(
                Verdict(
                    4,
                    ok,
                    f"{'PASS' if ok else 'MISS'} (4) [{rec.target}] recovery after {rec.signal} "
                    "of a worker "
                    f"holding {rec.workflows}: p99 {fmt(rec.p99_s, '.3f')} s, max "
                    f"{fmt(rec.max_s, '.3f')} s (target p99 < {limit:g} s, {how}){extra}",
                )
            )
        if not results.recovery:
            out.append(Verdict(4, None, "N/A (4) recovery: not measured"))
    if 5 in parts:
        if not results.latency:
            out.append(Verdict(5, None, "N/A (5) settle-to-completion latency: not measured"))
        for r5 in results.latency:
            if r5.p50_ms is None:
                out.append(Verdict(5, None, f"N/A (5) [{r5.target}] latency: no sample"))
                continue
            ok = (r5.p50_ms or 0) < TARGET_LATENCY_P50_MS and r5.errors == 0
            out.append(
                Verdict(
                    5,
                    ok,
                    f"{'PASS' if ok else 'MISS'} (5) [{r5.target}] settle-to-completion latency "
                    "of a suspended "
                    f"workflow: p50 {r5.p50_ms:.2f} ms, p99 {fmt(r5.p99_ms, '.2f')} ms "
                    f"(target p50 < {TARGET_LATENCY_P50_MS:g} ms)",
                )
            )
    for name, message in results.failures.items():
        out.append(Verdict(0, False, f"FAILED {name}: {message.splitlines()[0]}"))
    return out


def resume_verdicts(target: str, rows: list[ResumeRow]) -> list[Verdict]:
    out: list[Verdict] = []
    r10 = next((r for r in rows if r.steps == TARGET_RESUME_STEPS and r.server == "default"), None)
    if r10 is None or r10.median_s is None:
        why = "not measured" if r10 is None else r10.error
        out.append(
            Verdict(3, None, f"N/A (3) [{target}] resume at {TARGET_RESUME_STEPS:,} steps: {why}")
        )
    else:
        ok = r10.median_s < TARGET_RESUME_S and r10.error is None
        out.append(
            Verdict(
                3,
                ok,
                f"{'PASS' if ok else 'MISS'} (3) [{target}] resume with a "
                f"{TARGET_RESUME_STEPS:,}-step history, settle to completion: median "
                f"{r10.median_s:.3f} s (target < "
                f"{TARGET_RESUME_S:g} s)",
            )
        )
    measured = [r for r in rows if r.per_1k_steps_ms is not None]
    if r10 is not None and r10.per_1k_steps_ms is not None and len(measured) >= 2:
        biggest = max(measured, key=lambda r: r.steps)
        ratio = (biggest.per_1k_steps_ms or 0) / r10.per_1k_steps_ms
        ok = ratio <= LINEARITY_MAX_RATIO
        per = ", ".join(
            f"{r.steps:,}: {r.per_1k_steps_ms:.1f} ms"
            + ("" if r.server == "default" else f" (server {r.server})")
            for r in measured
        )
        out.append(
            Verdict(
                3,
                ok,
                f"{'PASS' if ok else 'MISS'} (3) [{target}] linearity, resume time per 1k "
                f"steps: {per}; "
                f"{biggest.steps:,} vs {TARGET_RESUME_STEPS:,}: x{ratio:.2f} "
                f"(<= x{LINEARITY_MAX_RATIO:g} counts as linear)",
            )
        )
    for r in rows:
        if r.error is not None:
            out.append(
                Verdict(
                    3,
                    False,
                    f"MISS (3) [{target}] resume with a {r.steps:,}-step history (server "
                    f"{r.server}): {r.error}",
                )
            )
    return out


# --------------------------------------------------------------------------- output


def short(error: str | None, width: int = 60) -> str:
    """An error for a table cell; the verdicts carry it whole."""
    if not error:
        return ""
    return error if len(error) <= width else error[: width - 3] + "..."


def render(results: Results) -> str:
    blocks = []
    if results.throughput:
        rows = [
            [
                r.target,
                r.workload,
                str(r.workers),
                str(r.in_flight),
                f"{r.per_s:,.0f}",
                fmt(r.p50_ms, ".1f"),
                fmt(r.p99_ms, ".1f"),
                str(r.errors),
                fmt(r.commits_per_s, ",.0f"),
                fmt(r.client_cpu, ".0%"),
                fmt(r.worker_cpu, ".0%"),
                fmt(r.server_cpu, ".0%"),
                fmt(r.db_cpu, ".0%"),
                fmt(r.other_cpu, ".0%"),
            ]
            for r in results.throughput
        ]
        header = ["target", "workload", "workers", "in-flight", "per s", "p50 ms", "p99 ms",
                  "errors", "commits/s", "cli cpu", "wrk cpu", "srv cpu", "db cpu",
                  "other cpu"]  # fmt: skip
        blocks.append("(1, 2) throughput (per s = completed workflows per second; srv cpu = "
                      "all replicas; db cpu = every postgres process)\n"
                      + table(header, rows, left=2))  # fmt: skip
        per_cycle = []
        for r in results.throughput:
            if not r.completed or not r.elapsed_s:
                continue
            scale = r.elapsed_s / r.completed * 1e6
            per_cycle.append(
                [
                    r.target,
                    r.workload,
                    str(r.workers),
                    str(r.in_flight),
                    fmt(None if r.client_cpu is None else r.client_cpu * scale, ",.0f"),
                    fmt(None if r.worker_cpu is None else r.worker_cpu * scale, ",.0f"),
                    fmt(None if r.server_cpu is None else r.server_cpu * scale, ",.0f"),
                    fmt(None if r.db_cpu is None else r.db_cpu * scale, ",.0f"),
                ]
            )
        blocks.append(
            "CPU per completed workflow (µs)\n"
            + table(
                ["target", "workload", "workers", "in-flight", "client", "workers", "server", "db"],
                per_cycle,
                left=2,
            )
        )
    if results.rpcs:
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        server_ms: dict[tuple[str, str], float] = collections.defaultdict(float)
        for line in results.rpcs:
            counts[(line.side, line.method)] += 1
            server_ms[(line.side, line.method)] += line.server_ms or 0.0
        rows = [
            [side, method, str(n), f"{server_ms[(side, method)]:.2f}"]
            for (side, method), n in sorted(counts.items())
        ]
        client_n = sum(n for (side, _), n in counts.items() if side == "client")
        worker_n = sum(n for (side, _), n in counts.items() if side == "worker")
        completes = counts[("worker", "CompleteTask")]
        rows.append(["total", "", str(client_n + worker_n), ""])
        blocks.append(
            "(1) RPCs of one human-in-the-loop cycle (server `rpc` log lines; WatchPromise is "
            "a stream)\n"
            + table(["side", "method", "calls", "server ms"], rows, left=2)
            + f"\nclient {client_n}, worker {worker_n}; plus {completes} task deliveries on "
            "the worker's open Poll stream (one per CompleteTask)"
        )
    if results.resume:
        rows = [
            [
                r.target,
                f"{r.steps:,}",
                r.server,
                fmt(r.build_s, ".1f"),
                fmt(r.build_per_s, ",.0f"),
                fmt(r.first_resume_s, ".3f"),
                ", ".join(f"{s:.3f}" for s in r.resumes_s) or "-",
                fmt(r.median_s, ".3f"),
                fmt(r.per_1k_steps_ms, ".1f"),
                fmt(r.worker_cpu_s, ".2f"),
                fmt(r.server_cpu_s, ".2f"),
                short(r.error),
            ]
            for r in results.resume
        ]
        header = ["target", "steps", "server", "build s", "build/s", "1st resume s", "resumes s",
                  "median s", "ms/1k steps", "wrk cpu s", "srv cpu s", "error"]  # fmt: skip
        blocks.append(
            "(3) resume of a long history (settle to completion, no worker cache: full replay)\n"
            + table(header, rows, left=1)
        )
    if results.recovery:
        rows = [
            [
                r.target,
                r.signal,
                str(r.workflows),
                f"{r.lease_s:g}",
                str(r.recovered),
                fmt(r.p50_s, ".3f"),
                fmt(r.p99_s, ".3f"),
                fmt(r.max_s, ".3f"),
                str(r.completed),
                fmt(r.assignments, ".1f"),
                short(r.error),
            ]
            for r in results.recovery
        ]
        header = ["target", "signal", "held", "lease s", "running again", "p50 s", "p99 s", "max s",
                  "completed", "leases/task", "error"]  # fmt: skip
        blocks.append(
            "(4) recovery: signal to the step running again on the other worker\n"
            + table(header, rows, left=2)
        )
    if results.latency:
        rows = [
            [
                r.target,
                str(r.samples),
                fmt(r.p50_ms, ".2f"),
                fmt(r.p99_ms, ".2f"),
                fmt(r.max_ms, ".2f"),
                fmt(r.server_p50_ms, ".2f"),
                fmt(r.server_p99_ms, ".2f"),
                str(r.errors),
            ]
            for r in results.latency
        ]
        header = ["target", "samples", "p50 ms", "p99 ms", "max ms", "server p50 ms",
                  "server p99 ms", "errors"]  # fmt: skip
        blocks.append(
            "(5) settle to completion of a suspended workflow (resolve call to the watch "
            "seeing the root settled; server = root settle_time - step settle_time)\n"
            + table(header, rows, left=1)
        )
    return "\n\n".join(blocks)
