"""Smoke run of the workflow benchmark: `bench/workflows.py --quick --parts 1,2` works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "workflows.py"


@pytest.mark.slow
def test_workflow_bench_quick_run_prints_figures() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--parts", "1,2"],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    out = run.stdout
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    # A throughput row per workload, with a completed-per-second figure and no errors.
    for workload in ("hitl", "ten-steps"):
        rows = re.findall(rf"^{workload}\s+(\d+)\s+(\d+)\s+([\d,]+)\s+.*$", out, re.MULTILINE)
        assert rows, f"no {workload} row in:\n{out}"
        assert all(int(per_s.replace(",", "")) > 0 for _, _, per_s in rows), out
    # The RPC breakdown of one cycle, and a verdict line per target part.
    assert re.search(r"^total\s+\d+", out, re.MULTILINE), out
    assert "client " in out and "worker " in out
    assert re.search(r"^(PASS|MISS|N/A) \(1\)", out, re.MULTILINE), out
    assert re.search(r"^(PASS|MISS|N/A) \(2\)", out, re.MULTILINE), out
