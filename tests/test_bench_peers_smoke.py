"""Smoke run of `bench/peers/run.py` on troth alone (the peers need npm and PyPI
downloads; `make bench-peers` runs them): every workload completes, the tables
and the target lines print, and the script says how long it took."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_peers_bench_quick_run_on_troth_prints_every_table() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH / "peers" / "run.py"), "--quick", "--systems", "troth"],
        capture_output=True,
        text=True,
        timeout=170,
        env=dict(os.environ),
    )
    out = run.stdout
    assert run.returncode == 0, f"stdout:\n{out}\nstderr:\n{run.stderr[-3000:]}"
    for workload in ("w1-suspend", "w1-eager", "w2"):
        rates = re.findall(rf"^{workload}\s+(\d+)\s+(\d+)\s", out, re.MULTILINE)
        assert rates, f"no {workload} row in:\n{out}"
        assert all(int(per_s) > 0 for _, per_s in rates), out
    assert re.search(r"^troth\s+\d+\.\d+\s+1/1\s", out, re.MULTILINE), out  # W3 recovered
    assert "Ceilings: bare grpc.aio echo" in out
    assert re.search(r"(PASS|MISS) W3 troth seconds", out), out
    assert "Failures" not in out, out
