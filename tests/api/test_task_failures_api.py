"""FailTask and FailWorkflow against a real server, on SQLite and PostgreSQL (issue 12
item 5): a failed task comes back after its backoff with the failure recorded and the
root left PENDING; a stale fail is refused; an operator's fail rejects the root and
ends its task; bad requests are refused naming the field."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from _support import PollStream, error_info, start_workflow

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types
from troth_server.domain.task import MAX_ERROR_CHARS, MAX_TRACEBACK_CHARS

WAIT = 15.0
Stubs = tuple[promises_pb2_grpc.PromiseServiceStub, tasks_pb2_grpc.TaskServiceStub]


@pytest.fixture
def stubs(channel: grpc.Channel) -> Stubs:
    return promises_pb2_grpc.PromiseServiceStub(channel), tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def poller(stubs: Stubs, group: str) -> Iterator[PollStream]:
    request = tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=4)
    stream = PollStream(stubs[1], request, WAIT)
    yield stream
    stream.cancel()


def fail(task: tasks_pb2.Task, error: str = "NameError: name 'x' is not defined") -> Any:
    return tasks_pb2.FailTaskRequest(
        task_id=task.id,
        counter=task.counter,
        worker_id="w1",
        error=error,
        traceback='Traceback (most recent call last):\n  File "wf.py", line 3\nNameError: x\n',
    )


def state(promises: promises_pb2_grpc.PromiseServiceStub, promise_id: str) -> int:
    value: int = promises.GetPromise(pb.GetPromiseRequest(id=promise_id)).promise.state
    return value


def test_a_failed_task_comes_back_after_its_backoff_with_the_failure_recorded(
    stubs: Stubs, group: str, poller: PollStream
) -> None:
    promises, tasks = stubs
    root = start_workflow(promises, group)
    first = poller.next_response().task
    before = time.time()
    failed = tasks.FailTask(fail(first), timeout=10).task
    assert failed.state == tasks_pb2.TASK_STATE_PENDING
    assert (failed.failed_attempts, failed.worker_id) == (1, "")
    assert failed.last_error == "NameError: name 'x' is not defined"
    assert failed.last_traceback.endswith("NameError: x\n")
    retry = failed.next_attempt_time.ToMilliseconds() / 1000
    assert before - 1 <= retry - 0.5 and retry <= time.time() + 1.5  # within [0.5 s, 1 s)
    assert state(promises, root) == types.PROMISE_STATE_PENDING  # the root waits for fixed code

    # Not before its time, then to the same stream again, with the failure on it.
    again = poller.next_response().task
    assert time.time() >= retry - 0.05
    assert again.id == first.id and again.counter == first.counter + 1
    assert (again.failed_attempts, again.last_error) == (1, failed.last_error)
    # The old lease's fail is refused, as its other calls are.
    with pytest.raises(grpc.RpcError) as caught:
        tasks.FailTask(fail(first), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "STALE_COUNTER"

    twice = tasks.FailTask(fail(again, "KeyError: 'k'"), timeout=10).task
    assert (twice.failed_attempts, twice.last_error) == (2, "KeyError: 'k'")
    listed = tasks.SearchTasks(
        tasks_pb2.SearchTasksRequest(group=group, root_promise_id=root)
    ).tasks
    assert [(t.id, t.failed_attempts) for t in listed] == [(first.id, 2)]
    assert listed[0].HasField("next_attempt_time")
    assert listed[0].waiting_for.startswith("waiting out its retry backoff until ")
    assert "failed 2 time(s) (last: KeyError: 'k')" in listed[0].waiting_for


def test_an_operator_fails_a_paused_workflow_and_its_task_ends(
    stubs: Stubs, group: str, poller: PollStream
) -> None:
    promises, tasks = stubs
    root = start_workflow(promises, group)
    task = poller.next_response().task
    step = f"{root}.0"
    fence = types.TaskFence(task_id=task.id, counter=task.counter, worker_id="w1")
    promises.CreatePromise(pb.CreatePromiseRequest(id=step, fence=fence))  # a human waits
    tasks.FailTask(fail(task), timeout=10)

    answer = tasks.FailWorkflow(
        tasks_pb2.FailWorkflowRequest(id=root, reason="the typo cannot be fixed"), timeout=10
    )
    assert answer.root.state == types.PROMISE_STATE_REJECTED
    assert json.loads(answer.root.value.data) == {
        "type": "troth.errors.WorkflowFailed",
        "message": "the typo cannot be fixed",
    }
    assert answer.root.value.headers["content-type"] == "application/json"
    assert state(promises, step) == types.PROMISE_STATE_REJECTED_CANCELED  # nobody is left waiting
    listed = tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=group, root_promise_id=root))
    assert list(listed.tasks) == []
    assert poller.nothing_within(1.5)  # the task, once out of its backoff, is not delivered

    with pytest.raises(grpc.RpcError) as caught:
        tasks.FailWorkflow(tasks_pb2.FailWorkflowRequest(id=root, reason="again"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(caught.value).reason == "ALREADY_SETTLED"


def test_a_fail_after_the_root_settled_completes_the_task(
    stubs: Stubs, group: str, poller: PollStream
) -> None:
    promises, tasks = stubs
    root = start_workflow(promises, group)
    task = poller.next_response().task
    tasks.FailWorkflow(tasks_pb2.FailWorkflowRequest(id=root, reason="stop"), timeout=10)
    # The worker, still holding it, reports the bug: the task ends, it is not retried.
    done = tasks.FailTask(fail(task), timeout=10).task
    assert done.state == tasks_pb2.TASK_STATE_COMPLETED
    assert not done.HasField("next_attempt_time")


def test_only_a_workflow_can_be_failed(stubs: Stubs) -> None:
    promises, tasks = stubs
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    promises.CreatePromise(pb.CreatePromiseRequest(id=plain))
    for promise_id, code, reason in (
        (plain, grpc.StatusCode.FAILED_PRECONDITION, "NOT_A_WORKFLOW"),
        (f"missing-{uuid.uuid4().hex[:8]}", grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            tasks.FailWorkflow(tasks_pb2.FailWorkflowRequest(id=promise_id, reason="r"))
        assert (caught.value.code(), error_info(caught.value).reason) == (code, reason)
    assert state(promises, plain) == types.PROMISE_STATE_PENDING


_OK = {"task_id": "t", "counter": 1, "worker_id": "w", "error": "NameError: x"}


@pytest.mark.parametrize(
    ("call", "request_", "field"),
    [
        ("FailTask", tasks_pb2.FailTaskRequest(**{**_OK, "error": ""}), "error"),
        ("FailTask", tasks_pb2.FailTaskRequest(**{**_OK, "error": "x" * (MAX_ERROR_CHARS + 1)}),
         "error"),
        ("FailTask",
         tasks_pb2.FailTaskRequest(**_OK, traceback="x" * (MAX_TRACEBACK_CHARS + 1)),
         "traceback"),
        ("FailTask", tasks_pb2.FailTaskRequest(**{**_OK, "counter": 0}), "counter"),
        ("FailTask", tasks_pb2.FailTaskRequest(**{**_OK, "worker_id": ""}), "worker_id"),
        ("FailTask", tasks_pb2.FailTaskRequest(**{**_OK, "task_id": ""}), "task_id"),
        ("FailWorkflow", tasks_pb2.FailWorkflowRequest(id="wf", reason=""), "reason"),
        ("FailWorkflow", tasks_pb2.FailWorkflowRequest(id="wf", reason="  "), "reason"),
        ("FailWorkflow",
         tasks_pb2.FailWorkflowRequest(id="wf", reason="x" * (MAX_ERROR_CHARS + 1)), "reason"),
        ("FailWorkflow", tasks_pb2.FailWorkflowRequest(reason="why"), "id"),
        ("SearchTasks", tasks_pb2.SearchTasksRequest(group="g", root_promise_id="x" * 5000),
         "root_promise_id"),
    ],
)  # fmt: skip
def test_bad_fail_calls_are_refused_naming_the_field(
    stubs: Stubs, call: str, request_: object, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        getattr(stubs[1], call)(request_, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)
