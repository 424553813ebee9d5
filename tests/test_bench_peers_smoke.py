"""Smoke runs of `bench/peers/run.py`: on troth alone, every workload completes and
the tables and target lines print; beside Restate at 64 in flight, every Restate
driver (its Workflow-API and awakeable flows, by threads and by an asyncio loop)
completes and troth is set against the fastest (Restate is installed into
bench/.cache/peers/ on first use, from npm and PyPI; DBOS is left to `make
bench-peers`); and the report's choice of the fastest driver and its round-by-round
ratios, on synthetic results."""

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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_peers_bench_quick_run_races_restate_flows_and_clients() -> None:
    """Restate's awakeable flows (live and suspended) and its Workflow-API flow, each
    by threads and by an asyncio loop, at 64 in flight: every driver completes
    workflows, and troth is set against the fastest, which the report names."""
    run = subprocess.run(
        [sys.executable, str(BENCH / "peers" / "run.py"), "--quick", "--systems",
         "troth,restate", "--in-flight", "64", "--recovery-count", "5"],
        capture_output=True,
        text=True,
        timeout=290,
        env=dict(os.environ),
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, f"stdout:\n{out}\nstderr:\n{run.stderr[-3000:]}"
    drivers = {
        (workload, driver): int(per_s)
        for workload, driver, per_s in re.findall(
            r"^restate\s+(\S+)\s+64\s+(\S+)(?: \*)?\s+(\d+)\s", out, re.MULTILINE
        )
    }
    expected = {
        ("w1-suspend", f"{flow}/{client}")
        for flow in ("workflow", "awakeable", "awakeable-suspended")
        for client in ("threads", "async")
        if (flow, client) != ("workflow", "async")
    } | {
        ("w1-eager", "workflow/threads"), ("w1-eager", "awakeable/threads"),
        ("w1-eager", "awakeable/async"), ("w2", "workflow/threads"), ("w2", "workflow/async"),
    }  # fmt: skip
    assert set(drivers) == expected, out
    assert all(per_s > 0 for per_s in drivers.values()), out
    for workload in ("w1-suspend", "w1-eager", "w2"):
        best = re.search(
            rf"^{workload}\s+\d+\s+(\S+), \d+\s+[\d.]+ -> ([\d.]+)\s", out, re.MULTILINE
        )
        assert best, f"no troth-against-Restate row for {workload} in:\n{out}"
        assert (workload, best.group(1)) in expected, out
        assert float(best.group(2)) > 0, out
        assert re.search(rf"(PASS|MISS) {workload} troth / Restate \({best.group(1)}\)", out), out
    assert "Failures" not in out, out


REPORT_PROBE = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/peers"]
import run
from _systems import Phase

def m(system, workload, round_, driver, per_s, cpu):
    phase = Phase(per_s, 0, None, 1.0, 1.0, 2.0)
    return run.Measured(system, workload, 64, round_, phase, cpu, 0.0, driver, cpu * per_s / 1000)

results = run.Results()
for r, (troth, slow, fast) in enumerate([(100, 150, 200), (120, 140, 160), (90, 200, 180)]):
    for workload in ("w1-suspend", "w1-eager", "w2"):
        results.phases += [
            m("troth", workload, r, "sdk/threads", troth, 6.0),
            m("restate", workload, r, "workflow/threads", slow, 8.0),
            m("restate", workload, r, "awakeable/async", fast, 4.0),
        ]
print(run.render(results, ["troth", "restate"]))
"""


def test_peers_report_sets_troth_against_restates_fastest_driver_round_by_round() -> None:
    """The fastest driver is the one with the highest median rate over the rounds
    (here awakeable/async: 180 against 150), and troth's ratio is the median of its
    ratios to that driver round by round (100/200, 120/160, 90/180 -> 0.50)."""
    run = subprocess.run(
        [sys.executable, "-c", REPORT_PROBE, str(BENCH)],
        capture_output=True,
        text=True,
        timeout=50,
        env=dict(os.environ),
    )
    out = run.stdout
    assert run.returncode == 0, f"stdout:\n{out}\nstderr:\n{run.stderr[-3000:]}"
    assert re.search(r"^restate\s+w2\s+64\s+awakeable/async \*\s+180 \[160-200\]", out, re.M), out
    for workload in ("w1-suspend", "w1-eager", "w2"):
        row = rf"^{workload}\s+100 \[90-120\]\s+awakeable/async, 180 \[160-200\]\s+"
        row += r"0\.50 0\.75 0\.50 -> 0\.50\s+6\.00 / 4\.00 ms = 1\.50x\s+0\.60 / 0\.72$"
        assert re.search(row, out, re.M), out
        assert f"MISS {workload} troth / Restate (awakeable/async), median of rounds: 0.50" in out
    assert "MISS w1-suspend CPU per cycle troth / Restate (ms / ms): 1.50" in out, out
