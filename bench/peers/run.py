"""troth side by side with Restate and DBOS on the same workloads (`make bench-peers`).

Workloads, each system running the same workflows (`bench/_workflow_worker.py`,
`_restate_service.py`, `_dbos_app.py`):

- **W1 suspend**: start a human-in-the-loop workflow (a notification step, then
  wait for a decision), learn that it waits, settle its decision by id, get the
  result. troth's worker suspends the workflow (its task completes) before the
  client settles, and the settle resumes it on a new task.
- **W1 eager**: the same, settled as soon as the notification step ran, while
  the workflow is still live. For DBOS the two variants are one flow: its
  workflow stays live while it waits (in `DBOS.recv`), so both settle on the
  step. Restate's invocation stays live on its stream until its inactivity
  timeout, so its `workflow` and `awakeable` flows settle a live invocation in
  both variants; its `awakeable-suspended` flow (W1 suspend) settles one that
  suspended (`_restate.py` describes the flows).
- **W2**: a workflow of ten checkpointed steps, start to result.
- **W3** recovery: 200 workflows inside a step, the process running them
  SIGKILLed; the time until all 200 complete, on a second worker already
  connected (troth) or after a restart where the peer needs one (Restate's
  deployment has one URI; DBOS recovers at launch).

Systems: `troth` (durable SQLite, `synchronous=FULL`, default settings, one
worker), `troth-pg` (one server on a fresh PostgreSQL schema), `restate`
(restate-server and its Python SDK under hypercorn), `dbos` (DBOS Transact on
SQLite) and `dbos-pg` (on PostgreSQL). The peers are installed by
`_install.py` into bench/.cache/peers/, never into the project.

A system may do a workload by several drivers (a flow and a load client,
``"<flow>/<client>"``: Restate's Workflow-API and awakeable flows, each by
threads on `http.client` and by an asyncio loop); each is measured, and the
tables use each system's fastest, the Drivers table naming it. troth is set
against Restate's fastest driver per workload (ratios of the rounds -> median,
CPU per workflow, cores used).

Rounds are interleaved: each round starts every system fresh, in a rotated
order, and runs every phase on it, so a drift of the machine's load falls on
all alike. A figure is the median over the rounds, with its spread (min-max).
The CPU of a workflow is the whole system's: its processes (server, worker,
service), PostgreSQL's, and the load client's (this process for troth and
Restate; DBOS's own process). The background is the machine's busy CPU
minus all of that. The machine's ceilings (a bare grpc.aio echo server's
calls/s, SQLite commits/s) are measured in the same run.

Usage::

    .venv/bin/python bench/peers/run.py [--quick] [--rounds 5] [--duration 2.5]
        [--systems troth,troth-pg,restate,dbos,dbos-pg] [--json FILE]
        [--restate-flows workflow,awakeable,awakeable-suspended] [--clients threads,async]
        [--in-flight 1,16,64]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH_DIR))

import _install  # noqa: E402
import grpc  # noqa: E402
from _awakeables import Awakeables  # noqa: E402
from _restate import AWAKEABLE_SERVICES, CLIENTS, Restate  # noqa: E402
from _servers import (  # noqa: E402
    ServerProcess,
    fmt,
    log,
    machine_busy_seconds,
    machine_info,
    postgres_cpu_delta,
    postgres_cpu_seconds,
    proc_cpu_seconds,
    table,
)
from _systems import WORKLOADS, Dbos, Phase, Recovery, System, Troth  # noqa: E402
from _workflow_load import Notifications  # noqa: E402

from troth.v1 import promises_pb2, promises_pb2_grpc  # noqa: E402

SYSTEMS = ("troth", "troth-pg", "restate", "dbos", "dbos-pg")
PEERS = ("restate", "dbos", "dbos-pg")
PHASES = (
    ("w1-suspend", 1), ("w1-suspend", 16), ("w1-suspend", 64),
    ("w1-eager", 1), ("w1-eager", 16), ("w1-eager", 64),
    ("w2", 16), ("w2", 64),
)  # fmt: skip
CORES = os.cpu_count() or 1
RESTATE_FLOWS = ("workflow", *AWAKEABLE_SERVICES)


@dataclass
class Measured:
    """One phase of one system in one round."""

    system: str
    workload: str
    concurrency: int
    round: int
    phase: Phase
    cpu_ms_per_workflow: float | None
    background_cpu_s: float | None
    driver: str = ""
    """How the system did it, ``"<flow>/<client>"`` (`System.drivers`)."""
    cpu_s: float | None = None
    """The whole system's CPU seconds over the phase (cores used = this / elapsed)."""

    @property
    def cores(self) -> float | None:
        return self.cpu_s / self.phase.elapsed_s if self.cpu_s and self.phase.elapsed_s else None


@dataclass
class Results:
    phases: list[Measured] = field(default_factory=list)
    recoveries: dict[str, list[Recovery]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    ceilings: list[dict[str, float]] = field(default_factory=list)
    background_by_round: list[float] = field(default_factory=list)


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pids_cpu(pids: list[int]) -> float:
    return sum(proc_cpu_seconds(pid) or 0.0 for pid in pids)


def measure(
    system: System,
    workload: str,
    concurrency: int,
    duration: float,
    round_: int,
    driver: str | None = None,
) -> Measured:
    driver = driver or system.drivers(workload)[0]
    system.phase(workload, concurrency, min(0.5, duration), driver)  # warm up, not counted
    pids = system.pids()
    pg_before = postgres_cpu_seconds() if system.uses_postgres else None
    busy_before, own_before, mine_before = machine_busy_seconds(), pids_cpu(pids), self_cpu()
    phase = system.phase(workload, concurrency, duration, driver)
    busy_after, own_after, mine_after = machine_busy_seconds(), pids_cpu(pids), self_cpu()
    pg = postgres_cpu_delta(pg_before, postgres_cpu_seconds()) if system.uses_postgres else 0.0
    mine = mine_after - mine_before
    whole = (own_after - own_before) + (pg or 0.0) + (0.0 if system.drives_itself else mine)
    background = None
    if busy_before is not None and busy_after is not None:
        background = max(
            0.0, (busy_after - busy_before) - whole - (mine if system.drives_itself else 0.0)
        )
    per_workflow = whole / phase.completed * 1000 if phase.completed else None
    return Measured(
        system.name, workload, concurrency, round_, phase, per_workflow, background, driver, whole
    )


def make_system(
    name: str,
    installed: dict[str, Path],
    workdir: Path,
    notes: Notifications,
    awakeables: Awakeables,
    args: argparse.Namespace,
) -> System:
    missing = [part for part in _install.NEEDS.get(name, ()) if part not in installed]
    if missing:
        raise RuntimeError(f"not installed ({', '.join(missing)}): see the install failure")
    processes = ("--processes", str(args.troth_processes))
    if name == "troth":
        return Troth(name, "sqlite", workdir, notes, processes)
    if name == "troth-pg":
        return Troth(name, "pg", workdir, notes, processes)
    if name == "restate":
        return Restate(
            installed["restate_server"], installed["restate_python"], workdir, notes, awakeables,
            flows=args.restate_flows, clients=args.clients,
        )  # fmt: skip
    if name in ("dbos", "dbos-pg"):
        kind = "postgresql" if name == "dbos-pg" else "sqlite"
        return Dbos(name, kind, installed["dbos_python"], workdir, notes)
    raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}")


# --------------------------------------------------------------------------- ceilings


def echo_calls_per_s(workdir: Path, seconds: float, threads: int = 16) -> float:
    port_file = workdir / "echo.port"
    argv = [sys.executable, str(BENCH_DIR / "_echo.py"), "--mode", "aio",
            "--listen", "127.0.0.1:0", "--port-file", str(port_file)]  # fmt: skip
    server = ServerProcess("echo", argv, workdir, port_file)
    try:
        address = server.wait_ready()
        with grpc.insecure_channel(address) as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            count = [0] * threads
            deadline = time.perf_counter() + seconds

            def loop(i: int) -> None:
                request = promises_pb2.CreatePromiseRequest(id=f"echo-{i}")
                while time.perf_counter() < deadline:
                    stub.CreatePromise(request, timeout=10)
                    count[i] += 1

            workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            return sum(count) / (time.perf_counter() - started)
    finally:
        server.stop()


def sqlite_commits_per_s(workdir: Path, seconds: float) -> float:
    """One-row commits/s in WAL mode with synchronous=FULL (troth's default)."""
    path = workdir / "ceiling.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (x INTEGER)")
        count = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?)", (count,))
            db.execute("COMMIT")
            count += 1
        return count / (time.perf_counter() - started)
    finally:
        db.close()


def ceilings(root: Path, seconds: float) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="ceilings-", dir=root))
    return {
        "echo_calls_per_s": echo_calls_per_s(workdir, seconds),
        "sqlite_commits_per_s": sqlite_commits_per_s(workdir, seconds),
    }


# --------------------------------------------------------------------------- rendering


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: list[float], spec: str) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], spec)
    low, mid, high = (
        format(v, spec) for v in (min(values), statistics.median(values), max(values))
    )
    return f"{mid} [{low}-{high}]"


def best_of(results: Results) -> dict[tuple[str, str, int], list[Measured]]:
    """Each system's measurements of each phase by its fastest driver (the highest
    median workflows/s over the rounds)."""
    drivers: dict[tuple[str, str, int], dict[str, list[Measured]]] = {}
    for m in results.phases:
        key = (m.system, m.workload, m.concurrency)
        drivers.setdefault(key, {}).setdefault(m.driver, []).append(m)
    return {
        key: max(of.values(), key=lambda ms: statistics.median(m.phase.per_s for m in ms))
        for key, of in drivers.items()
    }


def render(results: Results, systems: list[str]) -> str:
    by = best_of(results)
    measured = {(m.workload, m.concurrency) for m in results.phases}
    phases = [p for p in PHASES if p in measured]
    out: list[str] = []
    peers = [s for s in systems if s in PEERS]

    def rate(system: str, workload: str, c: int) -> float | None:
        return _median([m.phase.per_s for m in by.get((system, workload, c), [])])

    header = ["workload", "in flight", *systems, "troth / best peer"]
    rows = []
    for workload, c in phases:
        cells = [
            _spread([m.phase.per_s for m in by.get((s, workload, c), [])], ".0f") for s in systems
        ]
        best = max((r for p in peers if (r := rate(p, workload, c)) is not None), default=None)
        mine = rate("troth", workload, c)
        ratio = f"{mine / best:.2f}" if mine is not None and best else "-"
        rows.append([workload, str(c), *cells, ratio])
    out += [
        "Workflows/s, median [min-max] over the rounds, each system by its fastest driver "
        "(flow/client, below):",
        table(header, rows, 2),
        "",
    ]

    rows = []
    for workload, c in phases:
        cells = []
        for s in systems:
            ms = by.get((s, workload, c), [])
            p50 = _median([m.phase.p50_ms for m in ms if m.phase.p50_ms is not None])
            p99 = _median([m.phase.p99_ms for m in ms if m.phase.p99_ms is not None])
            cells.append(f"{fmt(p50, '.1f')} / {fmt(p99, '.1f')}")
        rows.append([workload, str(c), *cells])
    out += [
        "Latency ms, p50 / p99 (medians over the rounds): W1 settle to result, W2 start to result:",
        table(["workload", "in flight", *systems], rows, 2),
        "",
    ]

    rows = []
    for workload, c in phases:
        cells = []
        for s in systems:
            ms = by.get((s, workload, c), [])
            cpu = [m.cpu_ms_per_workflow for m in ms if m.cpu_ms_per_workflow is not None]
            cells.append(_spread(cpu, ".2f"))
        background = [
            m.background_cpu_s / m.phase.elapsed_s / CORES * 100
            for key, ms in by.items()
            if key[1:] == (workload, c)
            for m in ms
            if m.background_cpu_s is not None and m.phase.elapsed_s
        ]
        rows.append([workload, str(c), *cells, f"{fmt(_median(background), '.1f')} %"])
    out += [
        "Whole-system CPU ms per workflow (system + its database + load client), and the "
        "machine's background CPU during the phases (median, % of all cores):",
        table(["workload", "in flight", *systems, "background"], rows, 2),
        "",
    ]

    out += drivers_table(results, by)
    if "restate" in systems:
        out += against_restate(by)
    rows = []
    for s in systems:
        recoveries = results.recoveries.get(s, [])
        seconds = [r.seconds for r in recoveries if r.seconds is not None]
        errors = [r.error for r in recoveries if r.error]
        how = (recoveries[0].note if recoveries else "") + (
            f"; error: {errors[0]}" if errors else ""
        )
        rows.append([s, _spread(seconds, ".2f"), f"{len(seconds)}/{len(recoveries)}", how])
    out += [
        "W3: seconds from SIGKILL until all workflows completed, median [min-max]:",
        table(["system", "seconds", "rounds ok", "how"], rows, 1),
        "",
    ]
    if results.background_by_round:
        shares = ", ".join(f"{b:.1f} %" for b in results.background_by_round)
        out.append(f"Background CPU by round (% of all cores over the round's phases): {shares}")
    for ceiling in results.ceilings:
        out.append(
            f"Ceilings: bare grpc.aio echo {ceiling['echo_calls_per_s']:.0f} calls/s "
            f"(16 threads), SQLite {ceiling['sqlite_commits_per_s']:.0f} commits/s "
            "(WAL, synchronous=FULL)"
        )
    out.append("")
    out += verdicts(by, results, systems)
    if results.failures:
        out += ["", "Failures (reported, not dropped):", *(f"  - {f}" for f in results.failures)]
    return "\n".join(out)


Best = dict[tuple[str, str, int], list[Measured]]


def drivers_table(results: Results, by: Best) -> list[str]:
    """Every driver of the systems that have more than one, the fastest marked."""
    drivers: dict[tuple[str, str, int], dict[str, list[Measured]]] = {}
    for m in results.phases:
        drivers.setdefault((m.system, m.workload, m.concurrency), {}).setdefault(
            m.driver, []
        ).append(m)
    rows = []
    single = sorted(
        {(system, next(iter(of))) for (system, _, _), of in drivers.items() if len(of) == 1}
        - {(system, d) for (system, _, _), of in drivers.items() if len(of) > 1 for d in of}
    )
    for (system, workload, c), of in drivers.items():
        if len(of) < 2:
            continue
        best = by[(system, workload, c)][0].driver
        for driver, ms in of.items():
            cpu = [m.cpu_ms_per_workflow for m in ms if m.cpu_ms_per_workflow is not None]
            cores = [m.cores for m in ms if m.cores is not None]
            p50 = _median([m.phase.p50_ms for m in ms if m.phase.p50_ms is not None])
            rows.append([
                system, workload, str(c), driver + (" *" if driver == best else ""),
                _spread([m.phase.per_s for m in ms], ".0f"), _spread(cpu, ".2f"),
                fmt(_median(cores), ".2f"), fmt(p50, ".1f"),
            ])  # fmt: skip
    alone = [
        "One driver each: " + ", ".join(f"{system} {driver}" for system, driver in single),
        "",
    ]
    if not rows:
        return alone if single else []
    return [
        *(alone if single else []),
        "Drivers (flow/client; * the fastest, which the tables above and below use): "
        "workflows/s median [min-max], whole-system CPU ms per workflow, cores used, p50 ms:",
        table(
            ["system", "workload", "in flight", "driver", "per s", "CPU ms", "cores", "p50"],
            rows,
            4,
        ),
        "",
    ]


def per_round_ratios(mine: list[Measured], theirs: list[Measured]) -> list[float]:
    """Rate ratios of the rounds both measured, in round order."""
    other = {m.round: m.phase.per_s for m in theirs}
    return [
        m.phase.per_s / other[m.round]
        for m in sorted(mine, key=lambda m: m.round)
        if other.get(m.round)
    ]


def _cpu(ms: list[Measured]) -> float | None:
    return _median([m.cpu_ms_per_workflow for m in ms if m.cpu_ms_per_workflow is not None])


def _cores(ms: list[Measured]) -> float | None:
    return _median([m.cores for m in ms if m.cores is not None])


def against_restate(by: Best) -> list[str]:
    """troth against Restate's fastest driver per workload, at 64 in flight."""
    rows = []
    for workload in WORKLOADS:
        mine, theirs = by.get(("troth", workload, 64), []), by.get(("restate", workload, 64), [])
        if not mine or not theirs:
            continue
        ratios = per_round_ratios(mine, theirs)
        cpu_mine, cpu_theirs = _cpu(mine), _cpu(theirs)
        cpu_ratio = f" = {cpu_mine / cpu_theirs:.2f}x" if cpu_mine and cpu_theirs else ""
        rows.append([
            workload,
            _spread([m.phase.per_s for m in mine], ".0f"),
            f"{theirs[0].driver}, " + _spread([m.phase.per_s for m in theirs], ".0f"),
            " ".join(f"{r:.2f}" for r in ratios) + f" -> {fmt(_median(ratios), '.2f')}",
            f"{fmt(cpu_mine, '.2f')} / {fmt(cpu_theirs, '.2f')} ms{cpu_ratio}",
            f"{fmt(_cores(mine), '.2f')} / {fmt(_cores(theirs), '.2f')}",
        ])  # fmt: skip
    if not rows:
        return []
    return [
        "troth (SQLite) against Restate's fastest driver, 64 in flight (per-round ratios -> "
        "median; whole-system CPU per workflow and cores used, troth / Restate):",
        table(
            [
                "workload",
                "troth /s",
                "Restate best /s",
                "troth / Restate",
                "CPU per cycle",
                "cores",
            ],
            rows,
            1,
        ),
        "",
    ]


def verdicts(by: Best, results: Results, systems: list[str]) -> list[str]:
    against = ", against Restate's fastest driver per workload" if "restate" in systems else ""
    lines = [f"Targets (issue 30), at 64 in flight{against}:"]

    def ratio(a: str, b: str, workload: str) -> float | None:
        mine, theirs = by.get((a, workload, 64), []), by.get((b, workload, 64), [])
        return _median(per_round_ratios(mine, theirs))

    def line(
        label: str, value: float | None, target: float, above: bool = True, strict: bool = False
    ) -> None:
        if value is None:
            lines.append(f"  - {label}: not measured")
            return
        if above:
            ok, sign = value >= target, "≥"
        else:
            ok, sign = (value < target, "<") if strict else (value <= target, "≤")
        lines.append(
            f"  - {'PASS' if ok else 'MISS'} {label}: {value:.2f} (target {sign} {target})"
        )

    if "restate" in systems:
        for workload in WORKLOADS:
            best = by.get(("restate", workload, 64), [])
            flow = f" ({best[0].driver})" if best else ""
            line(f"{workload} troth / Restate{flow}, median of rounds",
                 ratio("troth", "restate", workload), 1.5)  # fmt: skip
        for workload in ("w1-suspend", "w1-eager"):
            mine, theirs = (_cpu(by.get((s, workload, 64), [])) for s in ("troth", "restate"))
            line(
                f"{workload} CPU per cycle troth / Restate (ms / ms)",
                mine / theirs if mine is not None and theirs else None,
                0.75,
                above=False,
            )
    if "troth-pg" in systems:
        line("W1-suspend troth-pg / troth", ratio("troth-pg", "troth", "w1-suspend"), 0.8)
        line("W2 troth-pg / troth", ratio("troth-pg", "troth", "w2"), 0.8)
    w3 = [r.seconds for r in results.recoveries.get("troth", []) if r.seconds is not None]
    line("W3 troth seconds", _median(w3), 1.0, above=False, strict=True)
    return lines


# --------------------------------------------------------------------------- main


def _choices(option: str, given: str, known: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(c.strip() for c in given.split(",") if c.strip())
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise SystemExit(f"{option}: choose from {', '.join(known)} (got {given!r})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 1 s phases, W3 with 20")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.5, help="seconds per phase")
    parser.add_argument("--recovery-count", type=int, default=200)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--restate-flows",
        default=",".join(RESTATE_FLOWS),
        help="Restate's flows to race (each measured, the fastest reported)",
    )
    parser.add_argument(
        "--clients",
        default=",".join(CLIENTS),
        help="load clients to race where a system has a choice (Restate: threads, async)",
    )
    parser.add_argument(
        "--troth-processes",
        default="1",
        help="troth serve --processes (a number, or auto: one per core)",
    )
    parser.add_argument(
        "--in-flight",
        default=",".join(sorted({str(c) for _, c in PHASES}, key=int)),
        help="run only the phases at these numbers in flight (e.g. 64)",
    )
    args = parser.parse_args(argv)
    in_flight = {int(c) for c in args.in_flight.split(",") if c.strip()}
    phases = [p for p in PHASES if p[1] in in_flight]
    if not phases:
        raise SystemExit(f"--in-flight: no phase at {args.in_flight}")
    args.restate_flows = _choices("--restate-flows", args.restate_flows, RESTATE_FLOWS)
    args.clients = _choices("--clients", args.clients, CLIENTS)
    if args.quick:
        args.rounds, args.duration, args.recovery_count = 1, 1.0, 20
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    started = time.monotonic()
    log(f"machine: {json.dumps(machine_info())}")
    installed, install_errors = _install.install_each(tuple(systems))
    results = Results()
    for part, error in install_errors.items():
        results.failures.append(f"install {part}: {error}")
    root = Path(tempfile.mkdtemp(prefix="troth-bench-peers-"))
    notes = Notifications(root / "notify.sock")
    awakeables = Awakeables(root / "awakeables.sock")
    try:
        results.ceilings.append(ceilings(root, 1.0 if args.quick else 2.0))
        for round_ in range(args.rounds):
            order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
            log(f"round {round_ + 1}/{args.rounds}: {', '.join(order)}")
            background = elapsed = 0.0
            for name in order:
                workdir = root / f"r{round_}-{name}"
                workdir.mkdir()
                try:
                    system = make_system(name, installed, workdir, notes, awakeables, args)
                except Exception as exc:
                    results.failures.append(
                        f"round {round_ + 1}: {name} did not start: {type(exc).__name__}: {exc}"
                    )
                    log(f"  {name}: did not start: {exc}")
                    continue
                try:
                    for workload, c in phases:
                        for driver in system.drivers(workload):
                            m = measure(system, workload, c, args.duration, round_, driver)
                            results.phases.append(m)
                            background += m.background_cpu_s or 0.0
                            elapsed += m.phase.elapsed_s
                            if m.phase.errors:
                                results.failures.append(
                                    f"round {round_ + 1}: {name} {driver} {workload}@{c}: "
                                    f"{m.phase.errors} errors, first: {m.phase.first_error}"
                                )
                            log(f"  {name} {driver} {workload}@{c}: {m.phase.per_s:.0f}/s, "
                                f"cpu {fmt(m.cpu_ms_per_workflow, '.2f')} ms/wf")  # fmt: skip
                    recovery = system.recovery(args.recovery_count)
                    results.recoveries.setdefault(name, []).append(recovery)
                    failed = f" ({recovery.error})" if recovery.error else ""
                    log(
                        f"  {name} W3: {fmt(recovery.seconds, '.2f')} s, "
                        f"{recovery.completed} completed{failed}"
                    )
                except Exception as exc:
                    results.failures.append(
                        f"round {round_ + 1}: {name}: {type(exc).__name__}: {exc}"
                    )
                    log(f"  {name}: failed: {exc}")
                finally:
                    system.stop()
            if elapsed:
                results.background_by_round.append(background / elapsed / CORES * 100)
        results.ceilings.append(ceilings(root, 1.0 if args.quick else 2.0))
    finally:
        notes.close()
        awakeables.close()
    print(render(results, systems))
    print(f"\n{args.rounds} rounds, {len(results.phases)} phases of {args.duration} s in all; "
          f"{time.monotonic() - started:.0f} s end to end")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(asdict(results), indent=1, default=str))
    return 1 if results.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
