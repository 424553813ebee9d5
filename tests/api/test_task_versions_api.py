"""Workflow versions over troth.v1.TaskService against a real server (each back end): Poll
streams listing their versions get only the tasks they may run, new starts go to the
newest version, and SearchTasks says what a waiting task waits for."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest
from _support import PollStream, ServerProcess, error_info

from troth import Client, Worker
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

WAIT = 15.0

Stubs = tuple[promises_pb2_grpc.PromiseServiceStub, tasks_pb2_grpc.TaskServiceStub]


class Poller(PollStream):
    """A Poll stream listing `workflows`, read on a thread."""

    def __init__(
        self,
        stub: tasks_pb2_grpc.TaskServiceStub,
        group: str,
        worker: str,
        workflows: list[tuple[str, str]],
        capacity: int = 4,
    ) -> None:
        request = tasks_pb2.PollRequest(
            group=group,
            worker_id=worker,
            capacity=capacity,
            workflows=[tasks_pb2.WorkflowVersion(name=n, version=v) for n, v in workflows],
        )
        super().__init__(stub, request, WAIT)

    def next(self) -> tasks_pb2.PollResponse:
        return self.next_response()


@pytest.fixture
def stubs(channel: grpc.Channel) -> Stubs:
    return promises_pb2_grpc.PromiseServiceStub(channel), tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def pollers() -> Iterator[list[Poller]]:
    made: list[Poller] = []
    yield made
    for p in made:
        p.cancel()


def start(promises: promises_pb2_grpc.PromiseServiceStub, root: str, group: str, func: str) -> None:
    promises.CreatePromise(
        pb.CreatePromiseRequest(
            id=root,
            param=types.Payload(data=b"[]"),
            tags={"troth:invoke": group, "troth:func": func},
        )
    )


def suspend(stubs: Stubs, delivery: tasks_pb2.PollResponse, worker: str) -> str:
    """Park the delivered workflow on a new latent step; return the step's id."""
    promises, tasks = stubs
    step = f"{delivery.task.root_promise_id}.0"
    task = delivery.task
    fence = types.TaskFence(task_id=task.id, counter=task.counter, worker_id=worker)
    promises.CreatePromise(pb.CreatePromiseRequest(id=step, fence=fence))
    tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(
            task_id=task.id, counter=task.counter, worker_id=worker, suspend_on=[step]
        )
    )
    return step


def search(tasks: tasks_pb2_grpc.TaskServiceStub, group: str) -> list[tasks_pb2.Task]:
    return list(tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=group)).tasks)


def wait_logged(server: ServerProcess, event: str, worker_id: str) -> None:
    """Wait for the server's log line saying a stream of `worker_id` connected or went
    away: from then on the dispatcher routes with (or without) it."""
    deadline = time.monotonic() + WAIT
    while True:
        for line in server.log().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == event and entry.get("worker_id") == worker_id:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"no {event} of {worker_id} in the server log")
        time.sleep(0.05)


def test_a_parked_workflow_resumes_only_on_its_version_while_new_starts_go_on(
    stubs: Stubs, group: str, pollers: list[Poller], server: ServerProcess
) -> None:
    promises, tasks = stubs
    old = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(old)
    start(promises, "old-wf-" + group, group, "publish")
    invoke = old.next()
    assert (invoke.task.workflow, invoke.task.workflow_version) == ("publish", "v1")
    assert invoke.root.workflow_version == "v1"  # the root records it, as delivered
    step = suspend(stubs, invoke, old.worker)
    old.cancel()
    wait_logged(server, "worker.disconnected", old.worker)

    new = Poller(tasks, group, f"w-v2-{group}", [("publish", "v2")])
    pollers.append(new)
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=step))
    start(promises, "new-wf-" + group, group, "publish")
    # The older task (the resume) is skipped, not delivered and not in the way.
    first = new.next()
    assert (first.task.root_promise_id, first.task.kind) == (
        "new-wf-" + group,
        tasks_pb2.TASK_KIND_INVOKE,
    )
    assert first.task.workflow_version == "v2" and first.root.workflow_version == "v2"
    (waiting,) = [t for t in search(tasks, group) if t.state == tasks_pb2.TASK_STATE_PENDING]
    assert (waiting.root_promise_id, waiting.kind, waiting.workflow_version) == (
        "old-wf-" + group, tasks_pb2.TASK_KIND_RESUME, "v1",
    )  # fmt: skip
    # Since when: the v1 stream left (this server's wall clock, for operators).
    assert re.fullmatch(
        rf"waiting for a worker of group {re.escape(repr(group))} running workflow 'publish' "
        r"version 'v1' \(none connected since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; "
        r"connected here: 'publish' versions 'v2'\)",
        waiting.waiting_for,
    ), waiting.waiting_for
    assert waiting.HasField("version_absent_since")
    assert waiting.HasField("create_time")

    # A worker whose author declared v1 compatible resumes it.
    compatible = Poller(tasks, group, f"w-v3-{group}", [("publish", "v3"), ("publish", "v1")])
    pollers.append(compatible)
    resume = compatible.next()
    assert (resume.task.id, resume.task.workflow_version) == (waiting.id, "v1")
    assert new.empty()


def test_new_starts_go_to_the_newest_version_connected(
    stubs: Stubs, group: str, pollers: list[Poller], server: ServerProcess
) -> None:
    promises, tasks = stubs
    pollers.append(Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")]))
    # The first delivery proves the old stream is connected before the new one.
    start(promises, f"first-{group}", group, "publish")
    assert pollers[0].next().task.workflow_version == "v1"
    newest = Poller(tasks, group, f"w-v2-{group}", [("publish", "v2"), ("billing", "b7")])
    pollers.append(newest)
    wait_logged(server, "worker.connected", newest.worker)
    roots = [f"wf-{n}-{group}" for n in range(3)]
    for root in roots:
        start(promises, root, group, "publish")
    got = [newest.next() for _ in roots]
    assert sorted(d.task.root_promise_id for d in got) == sorted(roots)
    assert {d.task.workflow_version for d in got} == {"v2"}
    for root in roots:
        assert promises.GetPromise(pb.GetPromiseRequest(id=root)).promise.workflow_version == "v2"
    assert pollers[0].empty()


def test_a_workflow_no_worker_lists_goes_to_any_worker_unversioned(
    stubs: Stubs, group: str, pollers: list[Poller]
) -> None:
    promises, tasks = stubs
    poller = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(poller)
    start(promises, f"typo-{group}", group, "pubilsh")
    got = poller.next()
    # Its worker rejects it as not registered; no version is recorded for it.
    assert (got.task.workflow, got.task.workflow_version) == ("pubilsh", "")
    assert got.root.workflow_version == ""


def test_a_settle_says_its_run_waits_for_its_version_and_a_move_runs_it_elsewhere(
    stubs: Stubs, group: str, pollers: list[Poller], server: ServerProcess
) -> None:
    promises, tasks = stubs
    old = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(old)
    root = f"moved-{group}"
    start(promises, root, group, "publish")
    step = suspend(stubs, old.next(), old.worker)
    old.cancel()
    wait_logged(server, "worker.disconnected", old.worker)
    new = Poller(tasks, group, f"w-v2-{group}", [("publish", "v2")], capacity=1)
    pollers.append(new)
    wait_logged(server, "worker.connected", new.worker)

    settled = promises.ResolvePromise(pb.ResolvePromiseRequest(id=step))
    assert settled.applied
    assert settled.workflow_waiting.startswith(
        f"waiting for a worker of group {group!r} running workflow 'publish' version 'v1' "
        "(none connected since "
    ), settled.workflow_waiting
    (waiting,) = search(tasks, group)
    assert waiting.waiting_for == settled.workflow_waiting
    assert waiting.HasField("version_absent_since")

    moved = tasks.MoveWorkflow(tasks_pb2.MoveWorkflowRequest(id=root, to_version="v2"))
    assert moved.root.workflow_version == "v2"
    assert (moved.task.id, moved.task.workflow_version) == (waiting.id, "v2")
    resume = new.next()
    assert (resume.task.id, resume.task.workflow_version) == (waiting.id, "v2")
    assert resume.root.workflow_version == "v2"
    # Its task is held now: the run waits for nothing, and is not moved.
    with pytest.raises(grpc.RpcError) as held:
        tasks.MoveWorkflow(tasks_pb2.MoveWorkflowRequest(id=root, to_current=True))
    assert held.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(held.value).reason == "TASK_NOT_PENDING"
    with pytest.raises(grpc.RpcError) as both:
        tasks.MoveWorkflow(tasks_pb2.MoveWorkflowRequest(id=root, to_version="v2", to_current=True))
    assert both.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_a_settle_of_a_run_whose_version_is_connected_says_nothing_of_versions(
    stubs: Stubs, group: str, pollers: list[Poller]
) -> None:
    promises, tasks = stubs
    worker = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(worker)
    start(promises, f"served-{group}", group, "publish")
    step = suspend(stubs, worker.next(), worker.worker)
    settled = promises.ResolvePromise(pb.ResolvePromiseRequest(id=step))
    assert settled.applied and settled.workflow_waiting == ""
    assert worker.next().task.kind == tasks_pb2.TASK_KIND_RESUME


def test_a_stream_listing_nothing_takes_a_versioned_task(
    stubs: Stubs, group: str, pollers: list[Poller]
) -> None:
    promises, tasks = stubs
    versioned = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(versioned)
    start(promises, f"wf-{group}", group, "publish")
    step = suspend(stubs, versioned.next(), f"w-v1-{group}")
    versioned.cancel()
    legacy = Poller(tasks, group, f"w-legacy-{group}", [])
    pollers.append(legacy)
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=step))
    resume = legacy.next()
    assert (resume.task.kind, resume.task.workflow_version) == (tasks_pb2.TASK_KIND_RESUME, "v1")


def test_search_tasks_lists_open_tasks_oldest_first_and_why_they_wait(
    stubs: Stubs, group: str, pollers: list[Poller]
) -> None:
    promises, tasks = stubs
    roots = [f"s{n}-{group}" for n in range(3)]
    for root in roots:
        start(promises, root, group, "publish")
    found = search(tasks, group)
    assert [t.root_promise_id for t in found] == roots
    assert {t.waiting_for for t in found} == {
        f"waiting for a worker of group {group!r}: none is connected to this server"
    }
    assert all(t.workflow == "publish" and t.workflow_version == "" for t in found)
    busy = Poller(tasks, group, f"w-busy-{group}", [("publish", "v1")], capacity=1)
    pollers.append(busy)
    held = busy.next()
    found = search(tasks, group)
    assert [t.root_promise_id for t in found] == roots
    claimed = [t for t in found if t.state == tasks_pb2.TASK_STATE_CLAIMED]
    assert [(t.id, t.worker_id, t.waiting_for) for t in claimed] == [
        (held.task.id, f"w-busy-{group}", "")
    ]
    assert {t.waiting_for for t in found if t.state == tasks_pb2.TASK_STATE_PENDING} == {
        f"waiting for a free worker of group {group!r} (1 connected here can run it; "
        "all are at capacity or not heartbeating)"
    }
    page = tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=group, page_size=2)).tasks
    assert [t.root_promise_id for t in page] == roots[:2]
    assert search(tasks, f"{group}-empty") == []


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (tasks_pb2.SearchTasksRequest(), "group"),
        (tasks_pb2.SearchTasksRequest(group="bad group"), "group"),
        (tasks_pb2.SearchTasksRequest(group="g", page_size=-1), "page_size"),
        (tasks_pb2.SearchTasksRequest(group="g", page_size=100_000), "page_size"),
    ],
)
def test_bad_searches_are_refused_naming_the_field(
    stubs: Stubs, request_: tasks_pb2.SearchTasksRequest, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stubs[1].SearchTasks(request_, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)


@pytest.mark.parametrize(
    ("workflows", "field"),
    [
        ([("", "v1")], "workflows.name"),
        ([("publish", "")], "workflows.version"),
        ([("publish", " v1")], "workflows.version"),
        ([("publish", "v" * 129)], "workflows.version"),
        ([("x" * 257, "v1")], "workflows.name"),
    ],
)
def test_bad_workflow_versions_in_a_poll_are_refused_naming_the_field(
    stubs: Stubs, workflows: list[tuple[str, str]], field: str
) -> None:
    request = tasks_pb2.PollRequest(
        group="g",
        worker_id="w",
        workflows=[tasks_pb2.WorkflowVersion(name=n, version=v) for n, v in workflows],
    )
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(stubs[1].Poll(request, timeout=10)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == field


def test_an_sdk_worker_gives_back_a_task_of_a_version_it_does_not_run(
    stubs: Stubs,
    group: str,
    pollers: list[Poller],
    server: ServerProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defence in depth: a server routing without versions (here: a stream listing
    nothing, as an old server would treat every stream) hands the worker a workflow
    started on other code; the worker releases it instead of replaying it."""
    promises, tasks = stubs
    versioned = Poller(tasks, group, f"w-v1-{group}", [("publish", "v1")])
    pollers.append(versioned)
    start(promises, f"wf-{group}", group, "publish")
    step = suspend(stubs, versioned.next(), f"w-v1-{group}")
    versioned.cancel()
    stream = Poller(tasks, group, "sdk-worker", [])
    pollers.append(stream)
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=step))
    delivery = stream.next()
    assert delivery.task.workflow_version == "v1"

    with Client(server.address) as client:
        worker = Worker(client, group=group, worker_id="sdk-worker")

        @worker.workflow(name="publish", version="v2")
        def publish(ctx: object) -> Iterator[None]:
            raise AssertionError("v2 code must not replay a v1 workflow")
            yield

        from troth._leases import Held

        held = Held(delivery.task.id, delivery.task.counter, delivery.task.root_promise_id)
        with caplog.at_level(logging.WARNING, logger="troth.worker"):
            worker._runner.run(held, delivery)
    assert "was started with version 'v1'; this worker runs publish version v2" in caplog.text
    # Released: the group offers it again (here, to the same stream), at a new counter.
    again = stream.next()
    assert (again.task.id, again.task.counter) == (delivery.task.id, delivery.task.counter + 1)
    root = promises.GetPromise(pb.GetPromiseRequest(id=f"wf-{group}")).promise
    assert root.state == types.PROMISE_STATE_PENDING
