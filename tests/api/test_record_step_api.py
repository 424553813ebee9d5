"""A step's record carried in the call that ends a task's hold (`CompleteTask` with
`record_step`): one call where a worker made two, with the same rules as the step's own
`CreatePromise` (fence, first writer wins), on both stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest
from _support import PollStream, error_info, start_workflow

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

WAIT = 15.0
Stubs = tuple[promises_pb2_grpc.PromiseServiceStub, tasks_pb2_grpc.TaskServiceStub]


@pytest.fixture
def stubs(channel: grpc.Channel) -> Stubs:
    return promises_pb2_grpc.PromiseServiceStub(channel), tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def run(stubs: Stubs) -> Iterator[tuple[str, dict[str, object], PollStream]]:
    """A started workflow whose INVOKE task worker `w1` holds: (root, held, its stream)."""
    promises, tasks = stubs
    group = f"g-{uuid.uuid4().hex[:8]}"
    poller = PollStream(tasks, tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=4), WAIT)
    root = f"wf-{uuid.uuid4().hex[:8]}"
    start_workflow(promises, group, root)
    task = poller.next_response().task
    try:
        yield root, {"task_id": task.id, "counter": task.counter, "worker_id": "w1"}, poller
    finally:
        poller.cancel()


def _step(root: str, n: int, held: dict[str, object], data: bytes) -> pb.CreatePromiseRequest:
    """Step `n`'s record as the SDK writes it: created settled, under the task's fence."""
    return pb.CreatePromiseRequest(
        id=f"{root}.{n}",
        tags={"troth:kind": "run", "troth:func": "notify"},
        fence=types.TaskFence(**held),  # type: ignore[arg-type]
        resolved_with=types.Payload(data=data),
    )


def _get(promises: promises_pb2_grpc.PromiseServiceStub, id: str) -> types.Promise:
    return promises.GetPromise(pb.GetPromiseRequest(id=id)).promise


def test_a_suspension_records_the_last_step_in_the_same_call(
    stubs: Stubs, run: tuple[str, dict[str, object], PollStream]
) -> None:
    promises, tasks = stubs
    root, held, poller = run
    fence = types.TaskFence(**held)  # type: ignore[arg-type]
    promises.CreatePromise(pb.CreatePromiseRequest(id=f"{root}.0", fence=fence))  # the wait
    call = tasks_pb2.CompleteTaskRequest(
        **held,  # type: ignore[arg-type]
        suspend_on=[f"{root}.0"],
        record_step=_step(root, 1, held, b'"sent"'),
    )
    done = tasks.CompleteTask(call)
    assert done.task.state == tasks_pb2.TASK_STATE_COMPLETED
    assert (done.recorded_step.id, done.recorded_step.state) == (
        f"{root}.1",
        types.PROMISE_STATE_RESOLVED,
    )
    step = _get(promises, f"{root}.1")
    assert (step.state, step.value.data, step.parent_id) == (
        types.PROMISE_STATE_RESOLVED,
        b'"sent"',
        root,
    )
    # The same call again (its answer lost): the same result counts as recorded.
    again = tasks.CompleteTask(call)
    assert again.task.state == tasks_pb2.TASK_STATE_COMPLETED
    assert _get(promises, f"{root}.1") == step
    # And the suspension stands: settling the wait resumes the workflow.
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=f"{root}.0"))
    resume = poller.next_response()
    assert resume.task.kind == tasks_pb2.TASK_KIND_RESUME
    assert {p.id for p in resume.history} == {f"{root}.0", f"{root}.1"}


def test_a_completion_records_the_last_step_and_settles_the_root_at_once(
    stubs: Stubs, run: tuple[str, dict[str, object], PollStream]
) -> None:
    promises, tasks = stubs
    root, held, _ = run
    done = tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(
            **held,  # type: ignore[arg-type]
            resolve_root=types.Payload(data=b'"done"'),
            record_step=_step(root, 0, held, b"9"),
        )
    )
    assert done.root.state == types.PROMISE_STATE_RESOLVED
    assert done.recorded_step.id == f"{root}.0"
    assert _get(promises, f"{root}.0").value.data == b"9"
    assert _get(promises, root).value.data == b'"done"'


def test_a_step_recorded_first_with_another_result_stands_and_nothing_is_done(
    stubs: Stubs, run: tuple[str, dict[str, object], PollStream]
) -> None:
    """An earlier holder of the task recorded the step first: its record stands (first
    writer wins), the task is not suspended, nothing is registered: STEP_RECORDED."""
    promises, tasks = stubs
    root, held, _ = run
    fence = types.TaskFence(**held)  # type: ignore[arg-type]
    promises.CreatePromise(pb.CreatePromiseRequest(id=f"{root}.0", fence=fence))
    promises.CreatePromise(_step(root, 1, held, b'"first"'))
    with pytest.raises(grpc.RpcError) as caught:
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                **held,  # type: ignore[arg-type]
                suspend_on=[f"{root}.0"],
                record_step=_step(root, 1, held, b'"second"'),
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(caught.value)
    assert info.reason == "STEP_RECORDED" and info.metadata["promise_id"] == f"{root}.1"
    assert _get(promises, f"{root}.1").value.data == b'"first"'
    # Nothing was done: the task is still the worker's, and a plain suspension works.
    beat = tasks.Heartbeat(tasks_pb2.HeartbeatRequest(worker_id="w1"))
    assert held["task_id"] in beat.task_ids
    done = tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(**held, suspend_on=[f"{root}.0"])  # type: ignore[arg-type]
    )
    assert done.task.state == tasks_pb2.TASK_STATE_COMPLETED


def test_a_suspension_that_finds_its_wait_settled_still_records_the_step(
    stubs: Stubs, run: tuple[str, dict[str, object], PollStream]
) -> None:
    promises, tasks = stubs
    root, held, _ = run
    fence = types.TaskFence(**held)  # type: ignore[arg-type]
    promises.CreatePromise(pb.CreatePromiseRequest(id=f"{root}.0", fence=fence))
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=f"{root}.0"))
    answer = tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(
            **held,  # type: ignore[arg-type]
            suspend_on=[f"{root}.0"],
            record_step=_step(root, 1, held, b"1"),
        )
    )
    assert [p.id for p in answer.settled] == [f"{root}.0"]
    assert answer.task.state == tasks_pb2.TASK_STATE_CLAIMED
    assert answer.recorded_step.id == f"{root}.1"
    assert _get(promises, f"{root}.1").state == types.PROMISE_STATE_RESOLVED


def test_a_refused_suspension_keeps_the_finished_step_as_its_own_call_would(
    stubs: Stubs, run: tuple[str, dict[str, object], PollStream]
) -> None:
    """A finished step is accepted at any counter its task had; the suspension of a task
    no longer this worker's is refused (STALE_COUNTER) and the step stays recorded."""
    promises, tasks = stubs
    root, held, _ = run
    fence = types.TaskFence(**held)  # type: ignore[arg-type]
    promises.CreatePromise(pb.CreatePromiseRequest(id=f"{root}.0", fence=fence))
    tasks.ReleaseTask(tasks_pb2.ReleaseTaskRequest(**held))  # type: ignore[arg-type]
    with pytest.raises(grpc.RpcError) as caught:
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                **held,  # type: ignore[arg-type]
                suspend_on=[f"{root}.0"],
                record_step=_step(root, 1, held, b"1"),
            )
        )
    assert error_info(caught.value).reason in ("STALE_COUNTER", "TASK_NOT_PENDING")
    assert _get(promises, f"{root}.1").value.data == b"1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda step: step.ClearField("resolved_with"), "record_step"),
        (lambda step: setattr(step, "id", "has spaces"), "record_step.id"),
        (lambda step: step.fence.__setattr__("counter", 99), "record_step.fence"),
        (lambda step: step.ClearField("fence"), "record_step.fence"),
        (lambda step: setattr(step, "schema", '{"type": "object"}'), "record_step.schema"),
    ],
    ids=["no-result", "bad-id", "other-fence", "no-fence", "schema"],
)
def test_a_bad_carried_step_is_refused_naming_its_field_and_nothing_is_done(
    stubs: Stubs,
    run: tuple[str, dict[str, object], PollStream],
    change: object,
    field: str,
) -> None:
    promises, tasks = stubs
    root, held, _ = run
    fence = types.TaskFence(**held)  # type: ignore[arg-type]
    promises.CreatePromise(pb.CreatePromiseRequest(id=f"{root}.0", fence=fence))
    step = _step(root, 1, held, b"1")
    change(step)  # type: ignore[operator]
    with pytest.raises(grpc.RpcError) as caught:
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                **held,  # type: ignore[arg-type]
                suspend_on=[f"{root}.0"],
                record_step=step,
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).metadata["field"] == field
    beat = tasks.Heartbeat(tasks_pb2.HeartbeatRequest(worker_id="w1"))
    assert held["task_id"] in beat.task_ids  # not suspended
