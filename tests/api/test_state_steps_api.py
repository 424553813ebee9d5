"""A workflow's state steps on the wire (`CreatePromise` with `state`), against a real
server on SQLite and PostgreSQL: only the worker holding the run's task now reads or
writes its slot (no fence, or a stale counter, is refused, and nothing is read or
written); a read is resolved with the slot's value and tagged with its version; a
write moves the version once, however often it is repeated; the request's shape is
checked naming the field; nobody forges a state step without the fence."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import grpc
import pytest
from _support import ServerProcess, error_info

from troth import Client
from troth.errors import PermissionDeniedError, Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

JSON = {"content-type": "application/json"}
READ = {"troth:kind": "state", "troth:func": "thread"}
WRITE = {"troth:kind": "state_set", "troth:func": "thread"}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


class Held:
    """A workflow's task taken by hand (a raw Poll stream)."""

    def __init__(self, server: ServerProcess, group: str) -> None:
        self.channel = grpc.insecure_channel(server.address)
        self.promises = promises_pb2_grpc.PromiseServiceStub(self.channel)
        self.stream = tasks_pb2_grpc.TaskServiceStub(self.channel).Poll(
            tasks_pb2.PollRequest(group=group, worker_id="w-hand", capacity=1)
        )
        task = next(self.stream).task
        self.fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id="w-hand")

    def step(
        self, step_id: str, *, write: bytes | None = None, fence: types_pb2.TaskFence | None = None
    ) -> promises_pb2.CreatePromiseResponse:
        request = promises_pb2.CreatePromiseRequest(
            id=step_id,
            tags=WRITE if write is not None else READ,
            fence=fence or self.fence,
            state=promises_pb2.WorkflowStateStep(name="thread", write=write is not None),
        )
        if write is not None:
            request.resolved_with.CopyFrom(types_pb2.Payload(headers=JSON, data=write))
        return self.promises.CreatePromise(request, timeout=10)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


def refusal(call: object) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()  # type: ignore[operator]
    info = error_info(caught.value)
    return caught.value.code(), info.reason, info.metadata.get("field", "")


def test_state_steps_read_and_write_the_slot_under_the_current_fence(
    client: Client, server: ServerProcess
) -> None:
    group, wid = f"g-{uuid.uuid4().hex[:8]}", f"wf-{uuid.uuid4().hex[:8]}"
    client.start("wf", id=wid, group=group, ttl=timedelta(hours=1))
    held = Held(server, group)
    try:
        read = held.step(f"{wid}.0").promise
        assert read.state == types_pb2.PROMISE_STATE_RESOLVED and read.parent_id == wid
        assert read.tags["troth:state-version"] == "0" and read.value.data == b""
        wrote = held.step(f"{wid}.1", write=b'["a"]')
        assert wrote.created and wrote.promise.tags["troth:state-version"] == "1"
        again = held.step(f"{wid}.1", write=b'["a"]')  # a retry after a lost reply
        assert not again.created and again.promise.tags["troth:state-version"] == "1"
        assert client.get_state(wid, "thread").version == 1
        seen = held.step(f"{wid}.2").promise
        assert (seen.tags["troth:state-version"], seen.value.data) == ("1", b'["a"]')
        # While its worker holds the task, the run is not parked.
        state = client.get_state(wid, "thread")
        assert state.parked is False and "holds its task" in state.not_parked_because
        stale = types_pb2.TaskFence(
            task_id=held.fence.task_id, counter=held.fence.counter + 1, worker_id="w-hand"
        )
        assert refusal(lambda: held.step(f"{wid}.3", write=b"[]", fence=stale))[:2] == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "STALE_COUNTER",
        )
        assert client.get_state(wid, "thread").version == 1  # nothing written
        # Checked naming the field.
        no_fence = promises_pb2.CreatePromiseRequest(
            id=f"{wid}.4", tags=READ, state=promises_pb2.WorkflowStateStep(name="thread")
        )
        assert refusal(lambda: held.promises.CreatePromise(no_fence, timeout=10)) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_ARGUMENT",
            "fence",
        )
        bad_name = promises_pb2.CreatePromiseRequest(
            id=f"{wid}.4", tags=READ, fence=held.fence,
            state=promises_pb2.WorkflowStateStep(name="no spaces"),
        )  # fmt: skip
        assert refusal(lambda: held.promises.CreatePromise(bad_name, timeout=10))[2] == (
            "state.name"
        )
        no_value = promises_pb2.CreatePromiseRequest(
            id=f"{wid}.4", tags=WRITE, fence=held.fence,
            state=promises_pb2.WorkflowStateStep(name="thread", write=True),
        )  # fmt: skip
        assert refusal(lambda: held.promises.CreatePromise(no_value, timeout=10))[2] == (
            "resolved_with"
        )
        not_json = promises_pb2.CreatePromiseRequest(
            id=f"{wid}.4", tags=WRITE, fence=held.fence,
            state=promises_pb2.WorkflowStateStep(name="thread", write=True),
            resolved_with=types_pb2.Payload(headers=JSON, data=b"{"),
        )  # fmt: skip
        assert refusal(lambda: held.promises.CreatePromise(not_json, timeout=10))[2] == (
            "resolved_with"
        )
    finally:
        held.close()
    # Nobody but the task's holder writes a state step: its kinds are checkpoints.
    with pytest.raises(PermissionDeniedError) as denied:
        client.create(f"{wid}.9", tags=WRITE)
    assert denied.value.reason == Reason.RESERVED_FOR_WORKFLOW
