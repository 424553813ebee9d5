"""`Client.execute`: a workflow's start and its result in one call (`CreatePromise` with
`wait`) while it finishes within a minute, and as `start` + `result()` otherwise, with
a real server on both stores."""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import error_info, logged_rpcs
from google.protobuf.duration_pb2 import Duration

import troth.client
from troth import (
    Client,
    Context,
    DeadlineExceededError,
    PromiseRejectedError,
    Worker,
    WorkflowFailed,
)
from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess


def double(n: int) -> int:
    return n * 2


def doubled(ctx: Context, n: int) -> Generator[Any, Any, int]:
    result: int = yield ctx.run(double, n)
    return result


def slow(ctx: Context, seconds: float) -> Generator[Any, Any, str]:
    yield ctx.sleep(timedelta(seconds=seconds))
    return "slept"


def fails(ctx: Context) -> Generator[Any, Any, None]:
    yield ctx.run(double, 1)
    raise WorkflowFailed("no")


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    group = f"exec-{uuid.uuid4().hex[:8]}"
    with Client(server.address, timeout=10) as client:
        worker = Worker(client, group=group, lease=timedelta(seconds=3))
        for workflow in (doubled, slow, fails):
            worker.workflow(workflow)
        worker.start()
        client.test_group = group  # type: ignore[attr-defined]
        try:
            yield client
        finally:
            worker.stop()


def test_a_workflow_started_and_awaited_in_one_call(server: ServerProcess, client: Client) -> None:
    run = f"exec-{uuid.uuid4().hex[:8]}"
    group = client.test_group  # type: ignore[attr-defined]
    assert client.execute(doubled, 21, id=run, group=group, timeout=20) == 42
    # A repeat of the start answers the existing run's result.
    assert client.execute(doubled, 21, id=run, group=group, timeout=20) == 42
    assert logged_rpcs(server, "CreatePromise", lambda id: id == run) == 2  # one call each
    assert logged_rpcs(server, "WaitPromise", lambda id: id == run) == 0


def test_a_workflow_longer_than_the_first_wait_is_awaited_after_it(
    server: ServerProcess, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(troth.client, "WAIT_CALL_S", 0.2)
    run = f"exec-{uuid.uuid4().hex[:8]}"
    group = client.test_group  # type: ignore[attr-defined]
    assert client.execute(slow, 1.0, id=run, group=group, timeout=20) == "slept"
    assert logged_rpcs(server, "WaitPromise", lambda id: id == run) >= 1


def test_a_timeout_and_a_failure_are_raised_as_a_result_raises_them(client: Client) -> None:
    group = client.test_group  # type: ignore[attr-defined]
    with pytest.raises(DeadlineExceededError):
        client.execute(slow, 5.0, id=f"exec-{uuid.uuid4().hex[:8]}", group=group, timeout=0.5)
    with pytest.raises(PromiseRejectedError) as caught:
        client.execute(fails, id=f"exec-{uuid.uuid4().hex[:8]}", group=group, timeout=20)
    assert caught.value.value["type"] == "troth.errors.WorkflowFailed"


def test_a_bad_wait_is_refused_before_anything_is_created(server: ServerProcess) -> None:
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        bad = f"exec-bad-{uuid.uuid4().hex[:8]}"
        for wait, fence in (
            (Duration(seconds=-1), None),
            (Duration(seconds=301), None),
            (Duration(seconds=1), types_pb2.TaskFence(task_id="t", counter=1, worker_id="w")),
        ):
            request = promises_pb2.CreatePromiseRequest(id=bad, wait=wait)
            if fence is not None:
                request.fence.CopyFrom(fence)
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreatePromise(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error_info(caught.value).metadata["field"] == "wait"
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetPromise(promises_pb2.GetPromiseRequest(id=bad), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        # A promise created with a wait, and settled meanwhile, is answered settled.
        plain = f"exec-plain-{uuid.uuid4().hex[:8]}"
        created = stub.CreatePromise(
            promises_pb2.CreatePromiseRequest(id=plain, wait=Duration(nanos=300_000_000)),
            timeout=10,
        )
        assert created.created and created.promise.state == types_pb2.PROMISE_STATE_PENDING
