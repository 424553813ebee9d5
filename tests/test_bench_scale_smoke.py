"""A smoke run of `bench/scale.py --quick` (`make bench-scale`): every case on both stores
(SQLite, and the run's PostgreSQL, see tests/_pg.py, or TROTH_BENCH_PG) is seeded, serves
W1 cycles and answers the claim probes, and the figures and verdicts are printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pg import admin_url

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
def test_scale_bench_quick_run_seeds_every_case_and_measures_w1_and_the_claim() -> None:
    env = {**os.environ, "TROTH_BENCH_PG": os.environ.get("TROTH_BENCH_PG") or admin_url()}
    run = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    result = json.loads(run.stdout)
    settings = result["settings"]
    rows = {(r["target"], r["case"]): r for r in result["rows"]}
    assert set(rows) == {(t, c) for t in ("sqlite", "pg") for c in "abcd"}, rows.keys()
    # What each case seeds, in rows (before the server started).
    backlog, history, parked = settings["backlog"], settings["history"], settings["parked"]
    seeded = {"a": 0, "b": 4 * backlog, "c": 3 * history, "d": 4 * parked}
    for (target, case), row in rows.items():
        where = f"{target} ({case}): {row}"
        assert row["seeded_rows"] == seeded[case], where
        assert row["cycles"] > 0 and row["errors"] == 0 and row["per_s"] > 0, where
        assert row["p99_ms"] >= row["p50_ms"] > 0, where
        assert row["claims"] == settings["claims"] and row["claim_errors"] == 0, where
        assert row["claim_p99_ms"] >= row["claim_p50_ms"] >= 0, where
        assert row["ratio"] is not None and row["ratio"] > 0, where
    verdicts = "\n".join(result["verdicts"])
    for target in ("sqlite", "pg"):
        for case in ("b", "c", "d"):
            assert f" {target} ({case}) " in verdicts, verdicts
        assert f" {target} (b) backlog: claim p99 " in verdicts, verdicts
    assert result["failures"] == {}
