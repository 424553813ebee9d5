"""The chaos test: the harness of `bench/chaos.py` (bench/_chaos/), short, once per store.

Each test makes two runs of about 30 s: one with a fixed seed (the same load
plan every time, and the same fault schedule as far as timing allows: a fault
whose target is busy is skipped) and one with a random seed, printed. A run is three
worker processes and one server on a SQLite file, or two server replicas on a
private PostgreSQL cluster the run starts itself (initdb as the `postgres` OS
user when run as root; never the machine's server); a load generator starting
human-in-the-loop, multi-step and `ctx.any` workflows and settling them at
random times (twice, early with `create_if_missing`, late, after the timeout,
cancels mid-step); a fault injector (SIGKILL and SIGSTOP/SIGCONT of workers and
servers, PostgreSQL crash-restarts, clock jumps and replica skew through
`TROTH_TEST_CLOCK_FILE`, which count as tested only once the server reads it).
The checker reads everything back through the SDK client and the test asserts
it found no anomaly (see bench/_chaos/checker.py for the checks, and
bench/README.md "Chaos" for the output).

`TROTH_CHAOS_PROCESSES=2` runs each replica as two processes under a supervisor
(`troth serve --processes 2`; a server fault then reaches one of them).

Reproduce a failure with the seed it prints: ``TROTH_CHAOS_SEED=S pytest
tests/chaos -k sqlite`` (both runs then use S), or the soak,
``python bench/chaos.py --seed S --store sqlite --minutes 1``.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos.run import Config, run
from _pg import skip_without_binaries
from _pg_cluster import pg_bindir

FIXED_SEEDS = {"sqlite": 1, "postgres": 2}
PROCESSES = int(os.environ.get("TROTH_CHAOS_PROCESSES", "1"))
"""Server processes per replica (`troth serve --processes`): TROTH_CHAOS_PROCESSES=2."""
LOAD_S = 18.0
DRAIN_S = 30.0


def _seeds(store: str) -> list[int]:
    given = os.environ.get("TROTH_CHAOS_SEED")
    if given:
        return [int(given)] * 2
    return [FIXED_SEEDS[store], random.randrange(1_000_000)]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_chaos_run_finds_no_anomaly(store: str) -> None:
    if store == "postgres" and pg_bindir() is None:
        skip_without_binaries("the PostgreSQL chaos run needs initdb and pg_ctl (TROTH_PG_BIN)")
    failed = []
    for seed in _seeds(store):
        print(f"chaos {store}: seed {seed}", flush=True)
        report = run(
            Config(store=store, seed=seed, load_s=LOAD_S, drain_s=DRAIN_S, processes=PROCESSES)
        )
        text = "\n".join(report.lines())
        print(text, flush=True)
        if report.anomalies:
            failed.append(text)
    assert not failed, "\n\n".join(failed)
