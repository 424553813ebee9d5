"""A smoke run of `bench/soak.py`: a few seconds of the soak's load against a real server,
which must report its figures and pass (no leak, no UNKNOWN/INTERNAL/CANCELLED answer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_soak_runs_briefly_and_passes() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--minutes", "0.1", "--warmup", "3",
         "--in-flight", "400", "--pollers", "8", "--watchers", "20", "--event-watchers", "2",
         "--sample", "2", "--troth-arg=--max-concurrent-rpcs=50",
         "--troth-arg=--max-queue-delay=1ms", "--json"],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    result = json.loads(run.stdout)
    assert result["failures"] == []
    assert result["by_code"]["OK"] > 0
    # The low limits make the server refuse some calls: they are answered, and counted.
    # (Whether 50 unary calls are ever in progress at once depends on how fast the
    # machine is; that 400 calls outstanding wait more than 1 ms to be started does not.)
    assert result["by_code"].get("RESOURCE_EXHAUSTED", 0) > 0, result["by_code"]
    assert sum(result["server_refused_total"].values()) > 0
    assert {"CANCELLED", "UNKNOWN", "INTERNAL"}.isdisjoint(result["by_code"])
    for phase in ("start", "end"):
        assert result[phase]["rss_mib"] > 0 and result[phase]["fds"] > 0
    assert result["dropped_streams"], "no stream was dropped mid-stream"
