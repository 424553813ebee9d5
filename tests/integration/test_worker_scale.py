"""1,000 workflows suspended at once on one worker process cost it no memory beyond its cache.

DESIGN §3: a workflow waiting for days costs no worker memory; the worker may
keep a bounded cache of suspended generators, nothing more. The worker is a
real subprocess (this file, run as a script: `python test_worker_scale.py
ADDRESS GROUP CACHE_SIZE`) whose resident set size is read from /proc.

Each workflow holds `BALLAST` bytes in a local variable while it waits, so a
worker that kept every suspended generator (an unbounded cache, a leak of
engines or frames) would grow by ~900 x 64 KiB = 56 MiB between 100 and 1,000
suspended workflows; one that keeps at most `CACHE_SIZE` of them stays flat.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from troth import Client, Context, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _workers import WorkerFleet, rss_kib, suspended

if TYPE_CHECKING:
    from _support import ServerProcess

GROUP = "scale"
CACHE_SIZE = 50
BALLAST = 64 * 1024
TOTAL = 1_000
FIRST = 100

RSS_SLACK_KIB = 8 * 1024
"""How much the worker's RSS may grow from 100 to 1,000 suspended workflows.

Measured on 2 CPUs, Python 3.11, 64 KiB ballast per workflow, RSS at 100 -> at
1,000 suspended, in KiB:
    cache_size=50:    59324 -> 59800, 59372 -> 59896, 59452 -> 60128, 59416 -> 60024
                      (+0.5 to +0.7 MiB: allocator noise)
    cache_size=0:     56116 -> 55504
    cache_size=2000:  61004 -> 120216 (+58 MiB: every generator kept; this test fails)
8 MiB is ten times the noise and a seventh of what keeping every workflow costs.
"""


def waiting(ctx: Context, n: int) -> Generator[Any, Any, dict[str, Any]]:
    ballast = ctx.id.encode() * (BALLAST // len(ctx.id))  # held while suspended
    approval = yield ctx.promise()
    decision = yield approval
    return {"n": n, "decision": decision, "held": len(ballast) >= BALLAST - len(ctx.id)}


def main(address: str, group: str, cache_size: str) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=group, cache_size=int(cache_size))
        worker.workflow(waiting)
        worker.run()


@pytest.mark.slow
def test_a_thousand_suspended_workflows_cost_the_worker_no_memory_beyond_its_cache(
    own_server: ServerProcess, fleet: WorkerFleet
) -> None:
    prefix = f"scale-{uuid.uuid4().hex[:6]}-"
    ids = [f"{prefix}{n:04d}" for n in range(TOTAL)]
    worker = fleet.start(GROUP, str(CACHE_SIZE))
    with Client(own_server.address, timeout=30) as client, ThreadPoolExecutor(16) as pool:

        def start(n: int) -> None:
            client.start(waiting, n, id=ids[n], group=GROUP)

        list(pool.map(start, range(FIRST)))
        fleet.eventually(
            lambda: suspended(own_server.db_url, prefix) == FIRST,
            30,
            f"{FIRST} suspended workflows",
        )
        rss_first = rss_kib(worker.pid)

        list(pool.map(start, range(FIRST, TOTAL)))
        fleet.eventually(
            lambda: suspended(own_server.db_url, prefix) == TOTAL,
            60,
            f"{TOTAL} suspended workflows",
        )
        rss_all = rss_kib(worker.pid)
        print(f"worker RSS: {rss_first} KiB at {FIRST}, {rss_all} KiB at {TOTAL} suspended")
        assert rss_all <= rss_first + RSS_SLACK_KIB, (
            f"the worker grew from {rss_first} KiB to {rss_all} KiB between {FIRST} and "
            f"{TOTAL} suspended workflows (cache_size={CACHE_SIZE})"
        )

        list(pool.map(lambda n: client.resolve(f"{ids[n]}.0", f"yes {n}"), range(TOTAL)))
        results = list(pool.map(lambda n: client.handle(ids[n]).result(timeout=30), range(TOTAL)))
    assert results == [{"n": n, "decision": f"yes {n}", "held": True} for n in range(TOTAL)]
    assert worker.poll() is None, fleet.log(worker)[-4000:]
    assert fleet.terminate(worker) == 0
    assert "Traceback" not in fleet.logs()


if __name__ == "__main__":
    main(*sys.argv[1:])
