"""A worker frozen while the server leases it a task, and thawed after that lease ran
out, does not run the task: the server's `lease_expire_time` is what counts.

The frozen worker (SIGSTOP) has the RESUME delivery in its socket buffer; when
it thaws, the delivery is stale. Alone in its group, the same process gets the
task again at the next counter and must run the step once, not once per
delivery; with a peer, the peer runs it and the thawed worker must not.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_fencing.py ADDRESS WORKER_ID`); each run of the step
appends a line (with the worker's id) to the side-effect file.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from troth import Client, Context, Worker
from troth.v1 import tasks_pb2, tasks_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent.parent))

from _workers import WorkerFleet, effect, suspended

if TYPE_CHECKING:
    from _support import ServerProcess

GROUP = "fencing"
LEASE = timedelta(seconds=2)
WORKER_ENV = "TROTH_TEST_WORKER_ID"


# -- the worker process (run as a script) ------------------------------------------------


def mark(workflow_id: str) -> str:
    return effect(f"{workflow_id} step {os.environ[WORKER_ENV]} {os.getpid()}")


def gated_flow(ctx: Context) -> Generator[Any, Any, str]:
    gate = yield ctx.promise()
    yield gate
    yield ctx.run(mark, ctx.id)
    return "done"


def main(address: str, worker_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ[WORKER_ENV] = worker_id
    with Client(address, timeout=5) as client:
        worker = Worker(client, group=GROUP, worker_id=worker_id, lease=LEASE)
        worker.workflow(gated_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


# -- the tests -----------------------------------------------------------------------------


def _tasks(server: ServerProcess) -> list[tasks_pb2.Task]:
    with grpc.insecure_channel(server.address) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        request = tasks_pb2.SearchTasksRequest(group=GROUP, page_size=100)
        return list(stub.SearchTasks(request, timeout=10).tasks)


def _claimed_by(server: ServerProcess, root: str, worker_id: str) -> tasks_pb2.Task | None:
    for task in _tasks(server):
        if (
            task.root_promise_id == root
            and task.kind == tasks_pb2.TASK_KIND_RESUME
            and task.state == tasks_pb2.TASK_STATE_CLAIMED
            and task.worker_id == worker_id
        ):
            return task
    return None


def _freeze_with_a_resume_in_flight(
    fleet: WorkerFleet, server: ServerProcess, client: Client, worker_id: str
) -> tuple[str, Any]:
    """Start a workflow on `worker_id`, wait until it suspends, freeze the worker,
    settle the gate: the server leases the RESUME task to the frozen worker."""
    proc = fleet.start(worker_id)
    root = f"fenced-{uuid.uuid4().hex[:8]}"
    handle = client.start("gated_flow", id=root, group=GROUP)
    fleet.eventually(lambda: suspended(server.db_url, root) == 1, 30, "the workflow to suspend")
    proc.send_signal(signal.SIGSTOP)
    client.resolve(f"{root}.0", "go")
    fleet.eventually(
        lambda: _claimed_by(server, root, worker_id) is not None,
        30,
        "the RESUME task to be leased to the frozen worker",
    )
    return root, (proc, handle)


def _steps(fleet: WorkerFleet, root: str) -> list[str]:
    return [line for line in fleet.lines() if line.startswith(f"{root} step ")]


def test_a_worker_thawed_after_its_lease_alone_in_the_group_runs_the_step_once(
    fleet: WorkerFleet, own_server: ServerProcess
) -> None:
    with Client(own_server.address, timeout=10) as client:
        root, (proc, handle) = _freeze_with_a_resume_in_flight(fleet, own_server, client, "w-a")
        # The lease runs out while the worker is frozen; the server takes the task back.
        fleet.eventually(
            lambda: _claimed_by(own_server, root, "w-a") is None, 30, "the lease to run out"
        )
        time.sleep(LEASE.total_seconds())  # on purpose: frozen a lease longer still
        proc.send_signal(signal.SIGCONT)
        assert handle.result(timeout=60) == "done"
        time.sleep(2 * LEASE.total_seconds())  # a second run would come within this
    steps = _steps(fleet, root)
    assert len(steps) == 1, f"the step ran {len(steps)} times: {steps}\n{fleet.logs()[-4000:]}"


def test_a_worker_thawed_after_its_lease_does_not_run_what_its_peer_took(
    fleet: WorkerFleet, own_server: ServerProcess
) -> None:
    with Client(own_server.address, timeout=10) as client:
        root, (frozen, handle) = _freeze_with_a_resume_in_flight(fleet, own_server, client, "w-a")
        fleet.start("w-b")
        assert handle.result(timeout=60) == "done"  # the peer took the task and ran it
        frozen.send_signal(signal.SIGCONT)
        time.sleep(3 * LEASE.total_seconds())  # the thawed worker reads its stale delivery
        assert frozen.poll() is None, "the thawed worker died"
    steps = _steps(fleet, root)
    assert len(steps) == 1, f"the step ran {len(steps)} times: {steps}\n{fleet.logs()[-4000:]}"
    assert " w-b " in steps[0]
