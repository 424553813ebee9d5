"""SIGKILL a worker right after a RESUME was delivered to it; another worker finishes.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_resume_crash.py ADDRESS CACHE_SIZE`). Every step appends
a line to a side-effect file. The first step after the wait blocks (in the
first worker only) once it has written its line, so the test knows the resume
reached that worker and kills it there. The counts then prove that no step
whose promise was settled ran again, on the killed worker's resume or on the
other worker's replay.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from troth import Client, Context, PromiseState, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _workers import WorkerFleet, effect, suspended

if TYPE_CHECKING:
    from _support import ServerProcess

GROUP = "resume-crash"
BLOCK_ENV = "TROTH_TEST_BLOCK_AFTER_RESUME"


def first_after_resume(workflow_id: str) -> str:
    effect(f"{workflow_id} resumed")
    if os.environ.get(BLOCK_ENV) == "1":
        threading.Event().wait(120)  # the test kills this process in here
    return "resumed"


def resumed_flow(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.run(effect, f"{ctx.id} before")
    approval = yield ctx.promise()
    decision = yield approval
    yield ctx.run(first_after_resume, ctx.id)
    yield ctx.run(effect, f"{ctx.id} after")
    return decision


def main(address: str, cache_size: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=GROUP, lease=timedelta(seconds=2), cache_size=int(cache_size))
        worker.workflow(resumed_flow)
        worker.run()


@pytest.mark.slow
@pytest.mark.parametrize(
    "cache_size",
    [
        pytest.param(256, id="resumed-from-its-cache"),
        pytest.param(0, id="resumed-by-replay"),
    ],
)
def test_sigkill_right_after_a_resume_was_delivered(
    own_server: ServerProcess, fleet: WorkerFleet, cache_size: int
) -> None:
    prefix = f"resume-{uuid.uuid4().hex[:6]}-"
    ids = [f"{prefix}{i}" for i in range(5)]
    with Client(own_server.address) as client:
        first = fleet.start(str(cache_size), env={BLOCK_ENV: "1"})
        handles = [client.start(resumed_flow, id=i, group=GROUP) for i in ids]
        fleet.eventually(
            lambda: suspended(own_server.db_url, prefix) == len(ids),
            15,
            "every workflow to suspend on its approval",
        )
        for i in ids:
            client.resolve(f"{i}.1", f"approved {i}")
        # Only the first worker is running: each line proves its resume reached it.
        fleet.eventually(
            lambda: all(fleet.counts()[f"{i} resumed"] == 1 for i in ids),
            15,
            "every workflow to be resumed on the first worker",
        )
        second = fleet.start(str(cache_size), env={BLOCK_ENV: "0"})
        fleet.eventually(
            lambda: "polling group" in fleet.log(second), 15, "the second worker to start"
        )
        fleet.kill(first)
        assert [h.result(timeout=15) for h in handles] == [f"approved {i}" for i in ids]
        for i in ids:
            approval = client.get(f"{i}.1")
            assert approval.state is PromiseState.RESOLVED
            assert client.decode(approval.value) == f"approved {i}"
        assert fleet.terminate(second) == 0
    assert "Traceback" not in fleet.logs()
    counts = fleet.counts()
    for i in ids:
        assert counts[f"{i} before"] == 1, counts  # settled before the wait: never again
        assert counts[f"{i} resumed"] == 2, counts  # unrecorded at the kill: run again, once
        assert counts[f"{i} after"] == 1, counts
    assert len(fleet.lines()) == 4 * len(ids), fleet.lines()


if __name__ == "__main__":
    main(*sys.argv[1:])
