"""One chaos run end to end: servers, workers, load and faults; then drain, read back, check.

Phases of `run(config)`:

1. start the store (SQLite file, or a private PostgreSQL cluster) and the
   server replicas (1 on SQLite, 2 on PostgreSQL), then the workers;
2. load + faults for ``load_s`` seconds;
3. drain: stop injecting faults (every process running, every clock true),
   run the settles still scheduled, resolve every approval nothing decided,
   wait until every root settled (at most ``drain_s``), then one sweep more;
4. read every root, step and approval back through the public API (SDK
   `Client.get`/`search_all`), check (`checker.check`), print the report.

The report's last line is ``anomalies: N``.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from _chaos import checker
from _chaos.faults import CLOCK_KINDS, FaultInjector
from _chaos.journal import Journal
from _chaos.load import LoadGenerator
from _chaos.procs import Fleet, PrivateCluster, ServerReplica, clock_supported

SWEEP_S = 0.2


@dataclass
class Config:
    store: str = "sqlite"  # or "postgres"
    seed: int = 0
    load_s: float = 35.0
    drain_s: float = 40.0
    workers: int = 3
    lease_s: float = 6.0
    processes: int = 1
    """Server processes per replica (`troth serve --processes`)."""
    keep: bool = False
    out: TextIO | None = None


@dataclass
class Report:
    seed: int
    store: str
    anomalies: list[checker.Anomaly] = field(default_factory=list)
    workflows: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    settles: Counter[str] = field(default_factory=Counter)
    effects: int = 0
    clock_supported: bool = False
    workdir: str = ""
    seconds: float = 0.0
    unsettled: list[str] = field(default_factory=list)
    pg_timing: str = ""
    outage: str = ""

    def lines(self) -> list[str]:
        out = [f"chaos run: store={self.store} seed={self.seed} ({self.seconds:.0f} s)"]
        if self.workdir:
            out.append(f"work directory (kept): {self.workdir}")
        by_kind = ", ".join(f"{k} {n}" for k, n in sorted(self.workflows.items()))
        out.append(f"workflows started: {sum(self.workflows.values())} ({by_kind})")
        ends = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items()))
        out.append(f"workflows ended: {ends}")
        out.append("settles: " + ", ".join(f"{k} {n}" for k, n in sorted(self.settles.items())))
        out.append(f"side effects run: {self.effects}")
        faults = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none"
        out.append(f"faults injected: {faults}")
        clock = sum(self.faults[k] for k in CLOCK_KINDS)
        if self.clock_supported:
            out.append(f"clock faults: {clock}, tested (the server reads TROTH_TEST_CLOCK_FILE)")
        else:
            out.append(
                f"clock faults: {clock} written, NOT TESTED: this server ignores "
                "TROTH_TEST_CLOCK_FILE (interfaces.md §3), so they had no effect"
            )
        out.extend(line for line in (self.outage, self.pg_timing) if line)
        if self.unsettled:
            out.append(f"roots still PENDING after the drain: {len(self.unsettled)}")
        counts = Counter(a.check for a in self.anomalies)
        out.append("checks: " + ", ".join(f"{c} {counts[c]}" for c in checker.CHECKS))
        out.extend(f"  {a}" for a in self.anomalies[:200])
        if len(self.anomalies) > 200:
            out.append(f"  ... and {len(self.anomalies) - 200} more")
        out.append(f"seed: {self.seed}")
        out.append(f"anomalies: {len(self.anomalies)}")
        return out


def _say(config: Config, message: str) -> None:
    if config.out is not None:
        print(message, file=config.out, flush=True)


def run(config: Config) -> Report:
    """One run; returns its report (print `report.lines()`)."""
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix=f"troth-chaos-{config.store}-"))
    rng = random.Random(config.seed)
    journal = Journal(workdir)
    cluster: PrivateCluster | None = None
    servers: list[ServerReplica] = []
    fleet: Fleet | None = None
    load: LoadGenerator | None = None
    report = Report(config.seed, config.store, clock_supported=clock_supported())
    try:
        level = os.environ.get("TROTH_CHAOS_LOG_LEVEL", "warning")  # info: every call
        extra = ["--sweep-interval", f"{int(SWEEP_S * 1000)}ms", "--log-level", level]
        if config.store == "postgres":
            cluster = PrivateCluster()
            servers = [
                ServerReplica(f"server-{i}", workdir, cluster.url, extra, config.processes)
                for i in range(2)
            ]
        elif config.store == "sqlite":
            servers = [
                ServerReplica(
                    "server-0",
                    workdir,
                    f"sqlite:///{workdir / 'troth.db'}",
                    extra,
                    config.processes,
                )
            ]
        else:
            raise ValueError(f"store must be sqlite or postgres, not {config.store!r}")
        for n, server in enumerate(servers):
            server.start(migrate=n == 0 and cluster is not None)
        addresses = [s.address for s in servers]
        _say(config, f"servers: {', '.join(addresses)}; work directory {workdir}")
        fleet = Fleet(workdir, addresses, journal.effects_path, config.lease_s)
        for _ in range(config.workers):
            fleet.spawn()
        load = LoadGenerator(rng, journal, addresses, tag=f"s{config.seed}")
        faults = FaultInjector(
            random.Random(config.seed + 1), journal, servers, cluster, fleet, config.lease_s
        )
        faults.start()
        load.run(config.load_s)
        _say(config, f"load done ({len(load.workflows)} workflows); draining")
        faults.settle_down()
        while len(fleet.alive()) < config.workers:
            fleet.spawn()
        load.finish_scheduled(timeout=config.drain_s)
        load.settle_the_rest()
        load.finish_scheduled(timeout=config.drain_s)
        deadline = time.monotonic() + config.drain_s
        unsettled = load.unsettled_roots()
        while unsettled and time.monotonic() < deadline:
            time.sleep(1.0)
            unsettled = load.unsettled_roots()
        report.unsettled = unsettled
        time.sleep(SWEEP_S * 2)
        read_time = time.time()
        final = load.read_back()
        faults_done = journal.faults()
        backwards = [
            -f["offset"] for f in faults_done if f["kind"] == "clock_jump" and f["offset"] < 0
        ]
        slack = max(backwards, default=0.0) if report.clock_supported and cluster is None else 0.0
        effects = journal.effects()
        acks = journal.acks()
        report.anomalies = checker.check(
            checker.Run(effects, acks, faults_done, final, read_time, SWEEP_S, expiry_slack_s=slack)
        )
        report.workflows = Counter(flow.kind for flow in load.workflows.values())
        report.outcomes = Counter(
            final[wid]["state"] if wid in final else "MISSING" for wid in load.workflows
        )
        report.faults = Counter(f["kind"] for f in faults_done if f["kind"] != "harness_error")
        report.settles = Counter(
            f"{a['action']}:{a['result']}" for a in acks if a.get("kind") == "settle"
        )
        report.effects = sum(1 for e in effects if e["phase"] == "begin")
        outages = [f["until"] - f["t"] for f in faults_done if f["kind"] == "server_kill"]
        if outages:
            report.outage = f"server kills: longest outage {max(outages):.1f} s (kill to serving)"
        if cluster is not None:
            restarts = cluster.restarts
            mean = f"{sum(restarts) / len(restarts):.2f} s" if restarts else "-"
            report.pg_timing = (
                f"private PostgreSQL: initdb + start {cluster.init_seconds:.1f} s; "
                f"crash-stop + start {mean} on average ({len(restarts)} restarts)"
            )
    finally:
        if load is not None:
            load.close()
        if fleet is not None:
            fleet.stop_all()
        for server in servers:
            server.stop()
        if cluster is not None:
            cluster.close()
        report.seconds = time.monotonic() - began
        if config.keep or report.anomalies:
            report.workdir = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return report
