"""The runner maps a pending step refused with WORKFLOW_SETTLED to `Cancelled` thrown
into the workflow at that yield, and compensation (`ctx.run` after it) still runs
and is recorded, with the task's fence on every step write.

No server: the runner's promise and task calls are answered by small fakes at the
SDK's own call boundary (`Connection`, `TaskCalls`), so the test shows the runner's
mapping, not the server's refusal (the integration tests do that end to end).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from troth import Cancelled, Client, Context, Promise, PromiseState
from troth._calls import Connection
from troth._convert import payload_from_proto
from troth._leases import Leases
from troth._runner import Runner
from troth._versions import registration
from troth.codec import Payload
from troth.errors import FailedPreconditionError, Reason
from troth.v1 import promises_pb2, tasks_pb2, types_pb2

ROOT = "wf-cancelled"


def _promise(
    id: str, state: PromiseState, value: Payload | None = None, tags: Mapping[str, str] = {}
) -> Promise:
    return Promise(
        id=id,
        state=state,
        param=Payload(),
        value=value or Payload(),
        tags=dict(tags),
        create_time=datetime.now(UTC),
    )


class FakeCalls:
    """Answers creates as a server would once the root is cancelled."""

    def __init__(self, root: PromiseState = PromiseState.REJECTED_CANCELED) -> None:
        self.root = root
        self.fences: list[tuple[str, types_pb2.TaskFence | None]] = []
        self.records: dict[str, Payload] = {}

    def get(self, id: str) -> Promise:
        assert id == ROOT
        return _promise(ROOT, self.root)

    create_request = staticmethod(Connection.create_request)

    def create(self, request: promises_pb2.CreatePromiseRequest) -> Any:
        """A step's create: refused while pending (the root is cancelled), else recorded."""
        self.fences.append((request.id, request.fence if request.HasField("fence") else None))
        if not request.HasField("resolved_with") and not request.HasField("rejected_with"):
            raise FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                Reason.WORKFLOW_SETTLED,
                f"workflow {ROOT!r} is cancelled",
            )
        value = payload_from_proto(request.resolved_with)
        self.records[request.id] = value

        class Created:
            promise = _promise(request.id, PromiseState.RESOLVED, value, request.tags)

        return Created()


class FakeTasks:
    worker_id = "w1"

    def __init__(self, calls: FakeCalls) -> None:
        self.completed: list[dict[str, Any]] = []
        self._calls = calls

    def heartbeat(self, lease: timedelta, timeout: float) -> tasks_pb2.HeartbeatResponse:
        return tasks_pb2.HeartbeatResponse(task_ids=["t1"], counters={"t1": 3})

    def complete(
        self,
        task_id: str,
        counter: int,
        record_step: promises_pb2.CreatePromiseRequest | None = None,
        **outcome: Any,
    ) -> Promise | None:
        # A step recorded with the completion (`troth._carry`): recorded as by its create.
        recorded = None if record_step is None else self._calls.create(record_step).promise
        self.completed.append({"task": (task_id, counter), **outcome})
        return recorded

    def suspend(self, *args: Any) -> list[Promise]:
        raise AssertionError("a cancelled workflow must not wait again")


def compensate(what: str) -> str:
    return f"undone {what}"


def cancellable(ctx: Context) -> Generator[Any, Any, str]:
    try:
        gate = yield ctx.promise()  # refused: the root is cancelled
        yield gate
    except Cancelled:
        undone: str = yield ctx.run(compensate, "booking")
        return undone
    return "not cancelled"


@pytest.fixture
def client() -> Iterator[Client]:
    with Client("127.0.0.1:1") as client:  # never contacted
        yield client


def _run(client: Client, calls: FakeCalls, tasks: FakeTasks) -> None:
    leases = Leases(tasks, timedelta(seconds=10))  # type: ignore[arg-type]
    registrations: Mapping[str, Any] = {
        "cancellable": registration("cancellable", cancellable, None, ())
    }
    runner = Runner(
        client,
        calls,  # type: ignore[arg-type]
        tasks,  # type: ignore[arg-type]
        leases,
        lambda: registrations,
        group="workers",
        cache_size=0,
        stopping=threading.Event(),
        abandon=threading.Event(),
    )
    delivery = tasks_pb2.PollResponse()
    delivery.task.id, delivery.task.counter, delivery.task.root_promise_id = "t1", 3, ROOT
    delivery.root.id = ROOT
    delivery.root.tags["troth:func"] = "cancellable"
    delivery.root.state = types_pb2.PROMISE_STATE_PENDING
    held = leases.accept(delivery.task)
    assert held is not None
    runner.run(held, delivery)


def test_workflow_settled_throws_cancelled_at_the_yield_and_compensation_runs(
    client: Client,
) -> None:
    calls = FakeCalls()
    tasks = FakeTasks(calls)
    _run(client, calls, tasks)

    # The gate was refused, Cancelled was thrown at its yield, the compensation ran.
    assert [id for id, _ in calls.fences] == [f"{ROOT}.0", f"{ROOT}.1"]
    assert client.decode(calls.records[f"{ROOT}.1"]) == "undone booking"
    # Every step write carried the task's fence.
    for _, fence in calls.fences:
        assert fence == types_pb2.TaskFence(task_id="t1", counter=3, worker_id="w1")
    (completed,) = tasks.completed
    assert completed["task"] == ("t1", 3)
    assert client.decode(completed["resolve"]) == "undone booking"


def test_a_root_settled_otherwise_ends_the_task_without_running_more(client: Client) -> None:
    calls = FakeCalls(PromiseState.REJECTED_TIMEDOUT)
    tasks = FakeTasks(calls)
    _run(client, calls, tasks)
    assert [id for id, _ in calls.fences] == [f"{ROOT}.0"]  # no compensation: not cancelled
    assert calls.records == {}
    assert tasks.completed == [{"task": ("t1", 3)}]  # completed, the root left as it is
