"""Where troth's CPU goes in one `make bench-peers` workload, process by process.

Starts troth as `run.py` does (one server on durable SQLite or a fresh
PostgreSQL schema, one `bench/_workflow_worker.py` process), warms it up, runs
one workload at one concurrency for a while, and prints the CPU per workflow
of the server, the worker, the load client (this process) and, on PostgreSQL,
the database's own processes (as `run.py` counts them). With
`--py-spy`, it also samples the server, the worker and the load client with py-spy (which must
be on PATH or given) and prints each one's hottest functions, by the share of
samples they are in (inclusive) and at the top of (self).

A cost per workflow is steadier than a rate on a busy machine, which is what
an A/B of one change needs; the rates themselves come from `run.py`.

Usage::

    .venv/bin/python bench/peers/profile.py [--workload w1-suspend] [--concurrency 64]
        [--seconds 10] [--store sqlite|pg] [--py-spy /path/to/py-spy] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(BENCH_DIR), str(Path(__file__).resolve().parent)]

from _gauge import Gauge  # noqa: E402
from _servers import postgres_cpu_delta, postgres_cpu_seconds, proc_cpu_seconds  # noqa: E402
from _systems import WORKLOADS, Troth  # noqa: E402
from _workflow_load import Notifications  # noqa: E402
from run import self_cpu  # noqa: E402


def record(py_spy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` into `out`: the thread holding the GIL, so Python CPU only."""
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
         "--format", "raw", "--output", str(out), "--gil", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=out.with_suffix(".log").open("wb"),
    )  # fmt: skip


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Per thread of `pid` (Linux /proc/PID/task/*/schedstat): nanoseconds on a core and
    nanoseconds runnable but waiting for one (in the run queue), so far."""
    threads: dict[int, tuple[int, int]] = {}
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            on_core, waiting, _slices = path.read_text().split()
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        threads[int(path.parent.name)] = (int(on_core), int(waiting))
    return threads


def run_queue(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> tuple[float, list[tuple[float, float]]]:
    """Seconds the threads alive throughout spent waiting for a core, and each busy
    thread's (on a core, waiting) seconds, busiest first."""
    spans = [
        ((after[t][0] - before[t][0]) / 1e9, (after[t][1] - before[t][1]) / 1e9)
        for t in before.keys() & after.keys()
    ]
    spans.sort(reverse=True)
    return sum(w for _, w in spans), spans


def hottest(raw: Path, top: int) -> list[str]:
    """The functions most often on the stack (inclusive) and at its top (self)."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " " + _where(f) for f in stack.split(";")]
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        return ["  (no samples)"]
    lines = [f"  {total} samples; inclusive %, self %, function"]
    for frame, n in inclusive.most_common(top):
        lines.append(f"  {n / total * 100:5.1f} {own[frame] / total * 100:5.1f}  {frame}")
    lines.append("  hottest by self:")
    for frame, n in own.most_common(top):
        lines.append(f"  {inclusive[frame] / total * 100:5.1f} {n / total * 100:5.1f}  {frame}")
    return lines


def _where(frame: str) -> str:
    """`(path/to/module.py:12)` -> `module.py` (lines differ within one function)."""
    inside = frame.partition(" (")[2].rstrip(")")
    return Path(inside.partition(":")[0]).name if inside else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=WORKLOADS, default="w1-suspend")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--store", choices=("sqlite", "pg"), default="sqlite")
    parser.add_argument("--py-spy", dest="py_spy", help="py-spy to sample with (default: none)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--processes", default="1", help="troth serve --processes")
    args = parser.parse_args(argv)
    py_spy = shutil.which(args.py_spy) if args.py_spy else None
    if args.py_spy and py_spy is None:
        parser.error(f"--py-spy {args.py_spy}: not found")
    root = Path(tempfile.mkdtemp(prefix="troth-bench-profile-"))
    notes = Notifications(root / "notify.sock")
    system = Troth("troth", args.store, root, notes, ("--processes", args.processes))
    try:
        system.phase(args.workload, args.concurrency, 2.0)  # warm up
        (server_pid, worker_pid) = system.pids()
        before = {pid: proc_cpu_seconds(pid) or 0.0 for pid in (server_pid, worker_pid)}
        named = {"server": server_pid, "worker": worker_pid, "client": os.getpid()}
        sched_before = {name: schedstat(pid) for name, pid in named.items()}
        client_before = self_cpu()
        pg_before = postgres_cpu_seconds() if system.uses_postgres else None
        spies = []
        if py_spy:
            spies = [
                record(py_spy, pid, args.seconds, root / f"{name}.txt")
                for name, pid in (
                    ("server", server_pid),
                    ("worker", worker_pid),
                    ("client", os.getpid()),
                )
            ]
        gauge = Gauge()
        started = time.monotonic()
        phase = system.phase(args.workload, args.concurrency, args.seconds)
        elapsed = time.monotonic() - started
        gauge.stop()
        cpu = {pid: (proc_cpu_seconds(pid) or 0.0) - before[pid] for pid in before}
        waits = {name: run_queue(sched_before[name], schedstat(pid)) for name, pid in named.items()}
        client = self_cpu() - client_before
        database = (
            postgres_cpu_delta(pg_before, postgres_cpu_seconds()) if pg_before is not None else 0.0
        )
        for spy in spies:
            spy.wait()
    finally:
        system.stop()
        notes.close()
    n = phase.completed or 1
    print(f"{args.workload}@{args.concurrency} on {args.store}: {phase.completed} in "
          f"{elapsed:.1f} s = {phase.completed / elapsed:.0f}/s, {phase.errors} errors; "
          f"p50 {phase.p50_ms or 0:.1f} ms, p99 {phase.p99_ms or 0:.1f} ms")  # fmt: skip
    parts = {"server": cpu[server_pid], "worker": cpu[worker_pid], "client": client}
    if system.uses_postgres:
        parts["postgresql"] = database
    per = "  ".join(f"{k} {v / n * 1000:.2f}" for k, v in parts.items())
    whole_ms = sum(parts.values()) / n * 1000
    print(f"CPU ms per workflow: {per}  whole {whole_ms:.2f}")
    # A thread that could run but found both cores taken: what a rate on this machine
    # loses to contention for its cores, beside what it spends on them.
    print("waiting for a core (runnable, in the run queue), ms per workflow: " + "  ".join(
        f"{name} {total / n * 1000:.2f}" for name, (total, _) in waits.items()))  # fmt: skip
    for name, (_, spans) in waits.items():
        busiest = ", ".join(
            f"{on / n * 1000:.2f} / {wait / n * 1000:.2f}" for on, wait in spans[:3]
        )
        print(f"  {name}'s busiest threads, ms per workflow on a core / waiting for one: {busiest}")
    units = gauge.normalised(whole_ms)
    if units is not None:
        print(f"the machine's speed (`_gauge.py`): its work took {gauge.ms:.3f} ms (median of "
              f"{len(gauge.samples)}); whole CPU per workflow {units:.2f} gauge units")  # fmt: skip
    if py_spy:
        for name in ("server", "worker", "client"):
            print(f"\n{name} (py-spy --gil):")
            print("\n".join(hottest(root / f"{name}.txt", args.top)))
    print(f"\n(files in {root})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
