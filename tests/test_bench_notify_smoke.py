"""A tiny run of `bench/notify_commits.py` on the run's PostgreSQL (or TROTH_BENCH_PG):
it prints a row per client count and mode, one NOTIFY per commit where it announces."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pg import admin_url

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "notify_commits.py"


@pytest.mark.slow
def test_notify_bench_tiny_run_prints_a_row_per_mode() -> None:
    db = os.environ.get("TROTH_BENCH_PG") or admin_url()
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--db", db, "--clients", "2", "--rounds", "1",
         "--seconds", "0.5", "--batch", "20", "--modes", "none,chunked,one"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = dict(
        (mode, float(per_commit))
        for mode, per_commit in re.findall(
            r"^\s+2\s+(\w+)\s+\d+\s+[\d.]+\s+([\d.]+)$", run.stdout, re.M
        )
    )
    assert rows.keys() == {"none", "chunked", "one"}, run.stdout
    assert rows["none"] == 0
    assert 0.9 <= rows["one"] <= 1.0, run.stdout  # the last commit's may come after the count
