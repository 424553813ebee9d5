"""Smoke runs of the benchmarks: `bench/workflows.py --quick --parts 1,2`, a tiny
`bench/sweep.py` (on SQLite and on two PostgreSQL replicas: the run's PostgreSQL, see
tests/_pg.py, or TROTH_BENCH_PG), `bench/auth_cost.py` and `bench/bad_secrets.py` work."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pg import admin_url

BENCH = Path(__file__).resolve().parent.parent / "bench"


def bench_pg() -> dict[str, str]:
    """The benchmarks' PostgreSQL: TROTH_BENCH_PG when given, else this run's (the
    calling test is skipped without one)."""
    return {"TROTH_BENCH_PG": os.environ.get("TROTH_BENCH_PG") or admin_url()}


def _run(*args: str, timeout: float, env: dict[str, str] | None = None) -> str:
    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    return run.stdout


@pytest.mark.slow
def test_workflow_bench_quick_run_prints_figures() -> None:
    out = _run(str(BENCH / "workflows.py"), "--quick", "--parts", "1,2", "--targets", "sqlite",
               timeout=50)  # fmt: skip
    # A throughput row per workload, with a completed-per-second figure and no errors.
    for workload in ("hitl", "ten-steps"):
        rows = re.findall(
            rf"^sqlite\s+{workload}\s+(\d+)\s+(\d+)\s+([\d,]+)\s+.*$", out, re.MULTILINE
        )
        assert rows, f"no {workload} row in:\n{out}"
        assert all(int(per_s.replace(",", "")) > 0 for _, _, per_s in rows), out
    # The RPC breakdown of one cycle, and a verdict line per target part.
    assert re.search(r"^total\s+\d+", out, re.MULTILINE), out
    assert "client " in out and "worker " in out
    assert re.search(r"^(PASS|MISS|N/A) \(1\)", out, re.MULTILINE), out
    assert re.search(r"^(PASS|MISS|N/A) \(2\)", out, re.MULTILINE), out


@pytest.mark.slow
def test_sweep_bench_tiny_run_on_two_pg_replicas() -> None:
    out = _run(str(BENCH / "sweep.py"), "--targets", "pg2", "--count", "300", "--window", "0.5",
               "--warmup", "0", "--in-flight", "8", "--troth-arg=--sweep-interval=100ms",
               timeout=40, env=bench_pg())  # fmt: skip
    row = re.search(r"^pg2\s+([\d,]+)\s+([\d,]+)\s+\S+\s+([\d.]+)\s", out, re.MULTILINE)
    assert row, out
    assert float(row.group(3)) < 30, out  # drained
    assert re.search(r"^(PASS|MISS) pg2 ", out, re.MULTILINE), out


@pytest.mark.slow
def test_auth_cost_bench_runs_every_mode() -> None:
    out = _run(str(BENCH / "auth_cost.py"), "--rounds", "1", "--duration", "0.5",
               "--warmup", "0.2", "--json", timeout=120)  # fmt: skip
    modes = json.loads(out)["modes"]
    assert set(modes) == {"off", "token-file", "jwt"}
    for figures in modes.values():
        assert figures["median"]["promise_ops_per_s"] > 0 and figures["median"]["hitl_per_s"] > 0


@pytest.mark.slow
def test_bad_secrets_bench_tiny_run_prints_both_phases() -> None:
    out = _run(str(BENCH / "bad_secrets.py"), "--rounds", "1", "--duration", "1", "--loops", "8",
               "--promises", "20", "--json", timeout=120)  # fmt: skip
    result = json.loads(out)
    assert result["phases"]["quiet"]["calls"] > 0 and result["phases"]["flooded"]["calls"] > 0
    assert result["flood"]["calls"] > 0 and result["verdict"] in {"PASS", "MISS"}


@pytest.mark.slow
def test_transport_bench_tiny_run_prints_both_variants() -> None:
    out = _run(str(BENCH / "transport.py"), "--threads", "4", "--seconds", "0.5", "--rounds", "1",
               timeout=60)  # fmt: skip
    for variant in ("sync", "aio"):
        median = re.search(rf"^median {variant}\s*:\s+(\d+) calls/s", out, re.MULTILINE)
        assert median and int(median.group(1)) > 0, out


@pytest.mark.slow
def test_floor_bench_tiny_run_prints_both_shapes() -> None:
    out = _run(str(BENCH / "floor.py"), "--in-flight", "4", "--seconds", "0.5", "--rounds", "1",
               timeout=60)  # fmt: skip
    for shape in ("today", "fewest"):
        median = re.search(
            rf"^median\s+{shape}\s*:\s+(\d+) cycles/s, server ([\d.]+), worker ([\d.]+), "
            rf"client ([\d.]+), whole ([\d.]+) ms",
            out,
            re.MULTILINE,
        )
        assert median and int(median.group(1)) > 0, out
        server, worker, client, whole = (float(median.group(n)) for n in range(2, 6))
        assert server > 0 and worker > 0 and client > 0
        assert whole == pytest.approx(server + worker + client, abs=0.02)
