"""A version bump while 50 workflows are parked: the old code finishes them, the new code
takes new starts, and none runs on the wrong code. On SQLite and on PostgreSQL.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_versions.py ADDRESS v1|v2`). v1 and v2 register different code under
one workflow name, with versions derived from their source. Their steps are the
same commands (so replaying v1's history on v2 would raise no non-determinism
error: only routing keeps it from happening); each step appends a line naming
its code to a side-effect file, and each result says which code returned it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from troth import Client, Context, Worker
from troth._cli import main as troth_cli
from troth._versions import code_version
from troth.v1 import tasks_pb2, tasks_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent.parent))

from _pg import fresh_schema
from _support import ServerProcess, start_server
from _workers import WorkerFleet, effect

GROUP = "editors"
PARKED = 50
NEW = 10


def publish_v1(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    yield ctx.run(effect, f"{ctx.id} v1 asked")
    decision = yield approval
    yield ctx.run(effect, f"{ctx.id} v1 published")
    return {"code": "v1", "post": post, "decision": decision}


def publish_v2(ctx: Context, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(timeout=timedelta(minutes=5))
    yield ctx.run(effect, f"{ctx.id} v2 asked")
    decision = yield approval
    yield ctx.run(effect, f"{ctx.id} v2 published")
    return {"code": "v2", "post": post, "decision": decision.upper()}


CODE = {"v1": publish_v1, "v2": publish_v2}
V1, V2 = code_version(publish_v1), code_version(publish_v2)


def main(address: str, code: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(
            client,
            group=GROUP,
            worker_id=f"{code}-{os.getpid()}",
            concurrency=16,
            lease=timedelta(seconds=5),
            shutdown_grace=timedelta(seconds=5),
        )
        worker.workflow(name="publish")(CODE[code])
        worker.run()


# -- the test ------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(tmp_path / "server", "--sweep-interval", "200ms", db_url=db_url)
        yield proc
        proc.stop()


@pytest.fixture
def fleet(tmp_path: Path, server: ServerProcess) -> Iterator[WorkerFleet]:
    workers = WorkerFleet(tmp_path, __file__, server.address)
    yield workers
    workers.stop_all()


def open_tasks(stub: tasks_pb2_grpc.TaskServiceStub) -> list[tasks_pb2.Task]:
    request = tasks_pb2.SearchTasksRequest(group=GROUP, page_size=1000)
    return list(stub.SearchTasks(request, timeout=10).tasks)


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """For what follows a worker's (clean) exit, which `WorkerFleet.eventually` reports."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def logged(server: ServerProcess, event: str, worker_id: str) -> bool:
    """Whether the server logged `event` for a stream of `worker_id` (connected, or gone:
    from then on its dispatcher routes with, or without, that stream)."""
    for line in server.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and entry.get("worker_id") == worker_id:
            return True
    return False


def test_a_version_bump_while_50_workflows_are_parked(
    server: ServerProcess, fleet: WorkerFleet
) -> None:
    assert V1 != V2
    began = time.monotonic()
    with Client(server.address, timeout=10) as client, server.channel() as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)

        def parked(ids: list[str], code: str) -> bool:
            counts = fleet.counts()
            if any(counts[f"{i} {code} asked"] != 1 for i in ids):
                return False
            waiting = {t.root_promise_id for t in open_tasks(tasks)}
            return not waiting & set(ids)  # suspended: no task of theirs open

        v1 = fleet.start("v1")
        old = [f"old-{n}" for n in range(PARKED)]
        handles = {i: client.start("publish", f"post {i}", id=i, group=GROUP) for i in old}
        fleet.eventually(lambda: parked(old, "v1"), 20, "the old workflows to park on v1")
        assert {client.get(i).workflow_version for i in old} == {V1}

        # Deploy v2 next to v1: new starts go to it from the moment it is connected.
        v2 = fleet.start("v2")
        fleet.eventually(
            lambda: logged(server, "worker.connected", f"v2-{v2.pid}"), 15, "v2 to connect"
        )
        new = [f"new-{n}" for n in range(NEW)]
        handles |= {i: client.start("publish", f"post {i}", id=i, group=GROUP) for i in new}
        fleet.eventually(lambda: parked(new, "v2"), 20, "the new workflows to park on v2")
        assert {client.get(i).workflow_version for i in new} == {V2}

        # v1 is stopped; an old workflow's approval arrives: only v1 may resume it.
        assert fleet.terminate(v1) == 0
        wait_until(
            lambda: logged(server, "worker.disconnected", f"v1-{v1.pid}"), 15, "v1 to be gone"
        )
        client.resolve(f"{old[0]}.0", "approved")
        expected = re.compile(
            rf"waiting for a worker of group {GROUP!r} running workflow 'publish' version "
            rf"{V1!r} \(none connected since [0-9T:Z-]+; connected here: 'publish' versions "
            rf"{V2!r}\)"
        )

        def waits_for_v1() -> bool:
            found = [t for t in open_tasks(tasks) if t.root_promise_id == old[0]]
            return [(t.kind, t.state, bool(expected.fullmatch(t.waiting_for))) for t in found] == [
                (tasks_pb2.TASK_KIND_RESUME, tasks_pb2.TASK_STATE_PENDING, True)
            ]

        wait_until(waits_for_v1, 10, "the resume to wait for a v1 worker")
        # What an operator sees.
        out = io.StringIO()
        with redirect_stdout(out):
            status = troth_cli(
                ["--server", server.address, "--json", "tasks", "list", "--group", GROUP]
            )
        assert status == 0
        (listed,) = [json.loads(line) for line in out.getvalue().splitlines()]
        assert (listed["root_promise_id"], listed["workflow_version"]) == (old[0], V1)
        assert expected.fullmatch(listed["waiting_for"]), listed["waiting_for"]
        assert listed["version_absent_since"] is not None

        # v1 is back: it finishes the old workflows while v2 runs the new ones.
        fleet.start("v1")
        for i in [*old[1:], *new]:
            client.resolve(f"{i}.0", "approved")
        results = {i: handle.result(timeout=30) for i, handle in handles.items()}

    for i in old:
        assert results[i] == {"code": "v1", "post": f"post {i}", "decision": "approved"}
    for i in new:
        assert results[i] == {"code": "v2", "post": f"post {i}", "decision": "APPROVED"}
    counts = fleet.counts()
    for i in old:
        assert (counts[f"{i} v1 asked"], counts[f"{i} v1 published"]) == (1, 1), i
        assert counts[f"{i} v2 asked"] == counts[f"{i} v2 published"] == 0, i
    for i in new:
        assert (counts[f"{i} v2 asked"], counts[f"{i} v2 published"]) == (1, 1), i
        assert counts[f"{i} v1 asked"] == counts[f"{i} v1 published"] == 0, i
    assert open_tasks_after(server) == []
    for proc in fleet.procs:
        if proc.poll() is None:
            assert fleet.terminate(proc) == 0
    assert "Traceback" not in fleet.logs()
    logging.getLogger(__name__).info("version bump: %.1fs", time.monotonic() - began)


def test_replicas_resume_parked_workflows_only_where_their_version_is_connected(
    tmp_path: Path,
) -> None:
    """Two replicas on one PostgreSQL schema, v1 connected to A only, v2 to B only:
    approvals settled through B create resumes there, which B (routing among its
    own streams) must leave to A."""
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema())
        a = start_server(tmp_path / "a", "--sweep-interval", "200ms", db_url=db_url)
        stack.callback(a.stop)
        b = start_server(tmp_path / "b", "--sweep-interval", "200ms", db_url=db_url)
        stack.callback(b.stop)
        old_fleet = WorkerFleet(tmp_path / "a", __file__, a.address)
        stack.callback(old_fleet.stop_all)
        new_fleet = WorkerFleet(tmp_path / "b", __file__, b.address)
        stack.callback(new_fleet.stop_all)
        client_a = stack.enter_context(Client(a.address, timeout=10))
        client_b = stack.enter_context(Client(b.address, timeout=10))

        old_fleet.start("v1")
        ids = [f"replicated-{n}" for n in range(NEW)]
        handles = [client_a.start("publish", f"post {i}", id=i, group=GROUP) for i in ids]
        old_fleet.eventually(
            lambda: (
                all(old_fleet.counts()[f"{i} v1 asked"] == 1 for i in ids)
                and all(client_a.get(i).workflow_version == V1 for i in ids)
            ),
            20,
            "the workflows to park on v1",
        )
        v2 = new_fleet.start("v2")
        new_fleet.eventually(
            lambda: logged(b, "worker.connected", f"v2-{v2.pid}"), 15, "v2 to connect to B"
        )
        for i in ids:
            client_b.resolve(f"{i}.0", "approved")
        results = [h.result(timeout=30) for h in handles]
    assert {r["code"] for r in results} == {"v1"}
    assert new_fleet.lines() == []  # v2 ran no step of them
    assert all(old_fleet.counts()[f"{i} v1 published"] == 1 for i in ids)


def open_tasks_after(server: ServerProcess) -> list[tasks_pb2.Task]:
    with server.channel() as channel:
        return open_tasks(tasks_pb2_grpc.TaskServiceStub(channel))


if __name__ == "__main__":
    main(*sys.argv[1:])
