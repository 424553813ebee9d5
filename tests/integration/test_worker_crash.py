"""SIGKILL a worker process; another worker of the group finishes every workflow.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_crash.py ADDRESS`). Every step appends a line to a
side-effect file, which proves that no step whose promise was settled ran again.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from troth import Client, Context, Worker
from troth.errors import NotFoundError

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, start_server
from _workers import EFFECTS_ENV, WorkerFleet, effect

BLOCK_ENV = "TROTH_TEST_BLOCK_IN_STEP"


def slow_step(workflow_id: str) -> str:
    effect(f"{workflow_id} slow")
    if os.environ.get(BLOCK_ENV) == "1":
        threading.Event().wait(120)  # the test kills this process in here
    return "slow done"


def suspended_flow(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.run(effect, f"{ctx.id} before")
    approval = yield ctx.promise()
    decision = yield approval
    yield ctx.run(effect, f"{ctx.id} after")
    return decision


def step_flow(ctx: Context) -> Generator[Any, Any, str]:
    yield ctx.run(effect, f"{ctx.id} before")
    yield ctx.run(slow_step, ctx.id)
    yield ctx.run(effect, f"{ctx.id} after")
    return "done"


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group="crash", lease=timedelta(seconds=2))
        worker.workflow(suspended_flow)
        worker.workflow(step_flow)
        worker.run()


# -- the tests -----------------------------------------------------------------


def start_worker(fleet: WorkerFleet, *, block_in_step: bool) -> subprocess.Popen[bytes]:
    return fleet.start(env={BLOCK_ENV: "1" if block_in_step else "0"})


def exists(client: Client, promise_id: str) -> bool:
    try:
        client.get(promise_id)
    except NotFoundError:
        return False
    return True


@pytest.mark.slow
def test_sigkill_inside_a_step(own_server: ServerProcess, fleet: WorkerFleet) -> None:
    ids = [f"in-step-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
    with Client(own_server.address) as client:
        first = start_worker(fleet, block_in_step=True)
        handles = [client.start("step_flow", id=i, group="crash") for i in ids]
        fleet.eventually(
            lambda: all(fleet.counts()[f"{i} slow"] == 1 for i in ids),
            15,
            "every workflow to be inside its slow step",
        )
        fleet.kill(first)
        second = start_worker(fleet, block_in_step=False)
        assert [h.result(timeout=15) for h in handles] == ["done"] * len(ids)
        assert fleet.terminate(second) == 0
    assert "Traceback" not in fleet.logs()
    assert "stopped" in fleet.logs()
    counts = fleet.counts()
    for i in ids:
        assert counts[f"{i} before"] == 1, counts  # settled before the kill: never again
        assert counts[f"{i} slow"] == 2, counts  # pending at the kill: run again, once
        assert counts[f"{i} after"] == 1, counts


@pytest.mark.slow
def test_sigkill_while_suspended(own_server: ServerProcess, fleet: WorkerFleet) -> None:
    ids = [f"suspended-{i}-{uuid.uuid4().hex[:6]}" for i in range(5)]
    with Client(own_server.address) as client:
        first = start_worker(fleet, block_in_step=False)
        handles = [client.start("suspended_flow", id=i, group="crash") for i in ids]
        fleet.eventually(
            lambda: all(exists(client, f"{i}.1") for i in ids),
            15,
            "every workflow to wait on its approval",
        )
        fleet.kill(first)
        for i in ids:
            client.resolve(f"{i}.1", f"approved {i}")
        second = start_worker(fleet, block_in_step=False)
        assert [h.result(timeout=15) for h in handles] == [f"approved {i}" for i in ids]
        assert fleet.terminate(second) == 0
    assert "Traceback" not in fleet.logs()
    counts = fleet.counts()
    for i in ids:
        assert counts[f"{i} before"] == 1, counts
        assert counts[f"{i} after"] == 1, counts


if __name__ == "__main__":
    main(sys.argv[1])


@pytest.mark.slow
def test_worker_reconnects_after_the_server_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(EFFECTS_ENV, str(tmp_path / "effects"))
    workdir = tmp_path / "server"
    first = start_server(workdir, "--sweep-interval", "200ms")
    address = first.address
    restarted: ServerProcess | None = None
    try:
        with Client(address) as client:
            worker = Worker(client, group="crash", lease=timedelta(seconds=2))
            worker.workflow(suspended_flow)
            with worker:
                handle = client.start(suspended_flow, id="restart-1", group="crash")
                deadline = time.monotonic() + 30  # generous: a loaded machine is slow
                while not exists(client, "restart-1.1"):
                    assert time.monotonic() < deadline, "the workflow never suspended"
                    time.sleep(0.05)
                first.kill()
                restarted = start_server(
                    workdir, "--sweep-interval", "200ms", "--listen", address,
                    db_url=first.db_url,
                )  # fmt: skip
                client.resolve("restart-1.1", "after restart")
                assert handle.result(timeout=15) == "after restart"
                assert client.start(suspended_flow, id="restart-2", group="crash").id
                deadline = time.monotonic() + 30  # generous: a loaded machine is slow
                while not exists(client, "restart-2.1"):
                    assert time.monotonic() < deadline, "no new workflow ran after the restart"
                    time.sleep(0.05)
    finally:
        first.kill()
        if restarted is not None:
            restarted.stop()
    counts = collections.Counter((tmp_path / "effects").read_text().splitlines())
    assert counts["restart-1 before"] == counts["restart-1 after"] == 1
