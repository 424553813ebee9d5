"""`until_landed`: a finished result is retried until it lands, whatever the outage.

No per-call timeout, lease or count of attempts ends the retry; only the worker
giving up on its running tasks (`abandon`) does. Without a server: the record is
a function the test scripts.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping
from datetime import timedelta
from typing import Any

import grpc
import pytest

from troth import Client, Context
from troth._convert import payload_to_proto
from troth._leases import Leases
from troth._runner import Runner
from troth._step_writes import RECORD_BACKOFF, Stopping, until_landed
from troth._versions import registration
from troth.client import connection
from troth.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    ResourceExhaustedError,
    UnavailableError,
)
from troth.v1 import tasks_pb2, types_pb2


def _away(n: int) -> Exception:
    kinds = (
        UnavailableError(grpc.StatusCode.UNAVAILABLE, "", "cannot reach the troth server"),
        DeadlineExceededError(grpc.StatusCode.DEADLINE_EXCEEDED, "", "no answer in 10s"),
        ResourceExhaustedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED", "busy"),
    )
    return kinds[n % len(kinds)]


def test_a_record_is_tried_again_through_any_number_of_failures() -> None:
    waits: list[float] = []

    class Instant(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return False

    calls = 0

    def record() -> str:
        nonlocal calls
        calls += 1
        if calls <= 500:  # far past any call timeout, lease or retry policy's attempts
            raise _away(calls)
        return "recorded"

    assert until_landed(record, what="step 'r.0' finished", abandon=Instant(), extra={}) == (
        "recorded"
    )
    assert calls == 501
    # Never longer than a second between tries: the record lands soon after the return.
    assert max(waits) <= RECORD_BACKOFF[1]
    assert min(waits) >= RECORD_BACKOFF[0] / 2


def test_a_record_is_given_up_only_when_the_worker_stops_waiting() -> None:
    abandon = threading.Event()
    abandon.set()

    def record() -> str:
        raise _away(0)

    with pytest.raises(Stopping):
        until_landed(record, what="step 'r.0' finished", abandon=abandon, extra={})


def test_an_answer_about_the_record_is_not_retried() -> None:
    def record() -> str:
        raise FailedPreconditionError(grpc.StatusCode.FAILED_PRECONDITION, "STALE_COUNTER", "x")

    with pytest.raises(FailedPreconditionError):
        until_landed(record, what="workflow 'r' finished", abandon=threading.Event(), extra={})


# -- the workflow's outcome (CompleteTask) is kept the same way -----------------------------


class _Tasks:
    """`TaskCalls` as a server away for a while answers them: `complete` fails `away`
    times, then lands."""

    worker_id = "w1"

    def __init__(self, away: int) -> None:
        self.away = away
        self.completed: list[dict[str, Any]] = []
        self.released: list[str] = []

    def heartbeat(self, lease: timedelta, timeout: float) -> tasks_pb2.HeartbeatResponse:
        return tasks_pb2.HeartbeatResponse(task_ids=["t1"], counters={"t1": 3})

    def complete(self, task_id: str, counter: int, **outcome: Any) -> None:
        if self.away:
            self.away -= 1
            raise _away(self.away)
        self.completed.append({"task": (task_id, counter), **outcome})

    def release(self, task_id: str, counter: int) -> None:
        self.released.append(task_id)


def _returns(ctx: Context) -> Generator[Any, Any, str]:
    return "done"
    yield  # a generator


def test_a_workflows_outcome_is_completed_through_an_outage_not_given_back() -> None:
    tasks = _Tasks(away=4)
    with Client("127.0.0.1:1") as client:  # never contacted
        leases = Leases(tasks, timedelta(seconds=1))  # type: ignore[arg-type]
        registrations: Mapping[str, Any] = {"returns": registration("returns", _returns, None, ())}
        runner = Runner(
            client,
            connection(client),
            tasks,  # type: ignore[arg-type]
            leases,
            lambda: registrations,
            group="workers",
            cache_size=0,
            stopping=threading.Event(),
            abandon=threading.Event(),
        )
        delivery = tasks_pb2.PollResponse()
        delivery.task.id, delivery.task.counter, delivery.task.root_promise_id = "t1", 3, "wf"
        delivery.root.id = "wf"
        delivery.root.tags["troth:func"] = "returns"
        delivery.root.param.CopyFrom(payload_to_proto(client.encode([])))
        delivery.root.state = types_pb2.PROMISE_STATE_PENDING
        held = leases.accept(delivery.task)
        assert held is not None
        runner.run(held, delivery)
    assert tasks.released == []
    assert len(tasks.completed) == 1
    assert tasks.completed[0]["reject"] is None, tasks.completed
    assert client.decode(tasks.completed[0]["resolve"]) == "done"
