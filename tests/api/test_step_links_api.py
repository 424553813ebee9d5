"""Steps belong to their workflow by record (issue 9, items 5-7), on every server kind.

The server records a step's root and parent from the writer's fence; the ttl
cap, the cancel cascade and the history follow that record, never the id
prefix. Only the worker holding the workflow's task writes its checkpoints; a
settled root takes no new pending step, and its pending steps end with it.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from troth import Client, Context, Worker, WorkflowFailed
from troth.errors import (
    AlreadySettledError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    PromiseRejectedError,
    Reason,
)
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess

HOUR = timedelta(hours=1)
RUN_TAGS = {"troth:kind": "run", "troth:func": "charge"}
JSON = {"content-type": "application/json"}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


def _wid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _expires_in(client: Client, promise_id: str) -> timedelta:
    expire = client.get(promise_id).expire_time
    assert expire is not None
    return expire - datetime.now(UTC)


def _error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _reason(exc: grpc.RpcError) -> str:
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info.reason
    return ""


class Held:
    """A workflow's task taken by hand (a raw Poll stream), to write steps with its fence."""

    def __init__(self, server: ServerProcess, group: str, worker_id: str = "w-hand") -> None:
        self.channel = grpc.insecure_channel(server.address)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(self.channel)
        self.promises = promises_pb2_grpc.PromiseServiceStub(self.channel)
        self.worker_id = worker_id
        self.stream = self.tasks.Poll(
            tasks_pb2.PollRequest(group=group, worker_id=worker_id, capacity=1)
        )
        self.delivery = next(self.stream)

    @property
    def fence(self) -> types_pb2.TaskFence:
        task = self.delivery.task
        return types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id=self.worker_id)

    def create(self, promise_id: str, *, record: bytes | None = None, **fields: Any) -> Any:
        request = promises_pb2.CreatePromiseRequest(id=promise_id, fence=self.fence, **fields)
        if record is not None:
            request.resolved_with.CopyFrom(types_pb2.Payload(headers=JSON, data=record))
        return self.promises.CreatePromise(request, timeout=10)

    def close(self) -> None:
        self.stream.cancel()
        self.channel.close()


# -- item 5: by record, not by prefix ------------------------------------------------


def test_a_promise_that_merely_shares_the_prefix_keeps_its_own_ttl(client: Client) -> None:
    wid = _wid("acme")
    client.start("never-run", id=wid, group=_wid("nobody"), ttl=HOUR)
    invoice = client.create(f"{wid}.invoice-42", ttl=timedelta(days=7)).promise
    assert _expires_in(client, invoice.id) > timedelta(days=6)  # not cut to the root's hour
    child = client.start("other", id=f"{wid}.child", group=_wid("nobody"), ttl=timedelta(days=2))
    assert _expires_in(client, child.id) > timedelta(days=1)
    assert (invoice.root_id, invoice.parent_id) == ("", "")  # nobody's step


def test_a_promise_that_merely_shares_the_prefix_outlives_the_workflows_cancel(
    client: Client,
) -> None:
    wid = _wid("acme")
    client.start("never-run", id=wid, group=_wid("nobody"), ttl=HOUR)
    invoice = client.create(f"{wid}.invoice-42", ttl=timedelta(days=7)).promise
    child = client.start("other", id=f"{wid}.child", group=_wid("nobody"), ttl=HOUR)
    client.cancel(wid)
    assert client.get(invoice.id).state == "PENDING"
    assert client.get(child.id).state == "PENDING"  # a workflow of its own


def test_nobody_but_the_task_holder_writes_a_workflows_checkpoints(
    client: Client, server: ServerProcess
) -> None:
    group, wid = _wid("g"), _wid("wf")
    # Before the workflow exists: a `run` step's tags are reserved anyway, and so is
    # every id of a numbered step's form.
    with pytest.raises(PermissionDeniedError) as denied:
        client.create(f"{wid}.0", tags=RUN_TAGS)
    assert denied.value.reason == Reason.RESERVED_FOR_WORKFLOW
    with pytest.raises(PermissionDeniedError, match="numbered step"):
        client.create(f"{wid}.0")
    client.start("wf", id=wid, group=group, ttl=HOUR)
    # After it: its whole `<wid>.<n>` namespace, whatever the tags.
    with pytest.raises(PermissionDeniedError, match="numbered step"):
        client.create(f"{wid}.5")
    with pytest.raises(PermissionDeniedError, match="step namespace"):
        client.create(f"{wid}.5.note")
    with pytest.raises(PermissionDeniedError, match="numbered step"):
        client.resolve(f"{wid}.6", {"forged": True}, create_if_missing=True)
    # A plain settle of a wait the workflow has not reached yet is NOT_FOUND (the
    # caller retries), not a refusal it would give up on (found by chaos seed 9001).
    with pytest.raises(NotFoundError):
        client.resolve(f"{wid}.6", {"approved": True})
    with pytest.raises(NotFoundError):
        client.reject(f"{wid}.6", {"approved": False})

    held = Held(server, group)
    try:
        gate = held.create(f"{wid}.0")  # the default ttl (a day), capped by the root's hour
        assert (gate.promise.root_id, gate.promise.parent_id) == (wid, wid)
        root_expiry = client.get(wid).expire_time
        assert root_expiry is not None
        assert gate.promise.expire_time.ToDatetime(UTC) <= root_expiry
        ran = held.create(f"{wid}.1", record=b'"charged"', tags=RUN_TAGS)
        assert (
            ran.promise.state == types_pb2.PROMISE_STATE_RESOLVED and ran.promise.parent_id == wid
        )
        # A run step, even one created pending, is settled only with the fence.
        held.create(f"{wid}.2", tags=RUN_TAGS)
        with pytest.raises(PermissionDeniedError, match="'run' step"):
            client.resolve(f"{wid}.2", "forged")
        settle = promises_pb2.ResolvePromiseRequest(id=f"{wid}.2", fence=held.fence)
        assert held.promises.ResolvePromise(settle, timeout=10).applied
        # A latent step is anyone's to settle (a human, a gateway).
        assert client.resolve(f"{wid}.0", {"approved": True}).applied
        # A stale counter writes no pending step; a finished result is still recorded.
        stale = types_pb2.TaskFence(
            task_id=held.fence.task_id, counter=held.fence.counter + 1, worker_id=held.worker_id
        )
        exc = _error(
            lambda: held.promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=f"{wid}.3", fence=stale), timeout=10
            )
        )
        assert (exc.code(), _reason(exc)) == (grpc.StatusCode.FAILED_PRECONDITION, "STALE_COUNTER")
    finally:
        held.close()


def test_a_fenced_create_of_an_id_taken_by_another_is_already_exists(
    client: Client, server: ServerProcess
) -> None:
    group, wid = _wid("g"), _wid("wf")
    client.start("wf", id=wid, group=group, ttl=HOUR)
    client.create("taken-elsewhere")
    held = Held(server, group)
    try:
        exc = _error(lambda: held.create("taken-elsewhere"))
        assert exc.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "not this workflow's step" in (exc.details() or "")
    finally:
        held.close()


def test_a_fenced_write_creates_numbered_ids_only_in_its_own_workflow(
    client: Client, server: ServerProcess
) -> None:
    """Workflow A's fence does not take workflow B's `B.0`, started or not (issue 26)."""
    group, wid, other = _wid("g"), _wid("wf"), _wid("wf")
    client.start("wf", id=wid, group=group, ttl=HOUR)
    held = Held(server, group)
    try:
        early = promises_pb2.ResolvePromiseRequest(
            id=f"{other}.1", create_if_missing=True, fence=held.fence
        )
        for write in (
            lambda: held.create(f"{other}.0"),
            lambda: held.create(f"{wid}.0.1"),  # its child's, were it to start one
            lambda: held.promises.ResolvePromise(early, timeout=10),
        ):
            exc = _error(write)
            assert (exc.code(), _reason(exc)) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "RESERVED_FOR_WORKFLOW",
            )
            assert f"not one of workflow {wid!r}" in (exc.details() or "")
        client.start("wf", id=other, group=_wid("g"), ttl=HOUR)
        assert _reason(_error(lambda: held.create(f"{other}.0"))) == "RESERVED_FOR_WORKFLOW"
        assert held.create(f"{wid}.0").promise.parent_id == wid  # its own
        assert held.create(f"{other}.named").promise.parent_id == wid  # a name, not a number
    finally:
        held.close()
    with pytest.raises(NotFoundError):
        client.get(f"{other}.0")


def _run_worker(client: Client, group: str, build: Any) -> Iterator[Worker]:
    worker = Worker(client, group=group, worker_id=_wid("w"), lease=timedelta(seconds=5))
    build(worker)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def test_a_forged_checkpoint_is_never_taken_as_the_steps_result(
    client: Client, stub: promises_pb2_grpc.PromiseServiceStub
) -> None:
    """A `<wid>.0` written before the workflow starts: refused, whatever its tags and
    however it is written (a create, a create already settled, an early settle), so
    the step's id stays the workflow's and the run records its own result (issue 26:
    an early settle used to take the id, and the run failed saying it was taken)."""
    group = _wid("forge")
    ran: list[str] = []

    def charge(order: str) -> str:
        ran.append(order)
        return f"charged {order}"

    def build(worker: Worker) -> None:
        @worker.workflow(name="pay")
        def pay(ctx: Context, order: str) -> Generator[Any, Any, str]:
            return (yield ctx.run(charge, order))

    clean, early = _wid("pay"), _wid("pay")
    for tags in (RUN_TAGS, {}):
        forged = promises_pb2.CreatePromiseRequest(
            id=f"{clean}.0",
            tags=tags,
            resolved_with=types_pb2.Payload(headers=JSON, data=b'"forged"'),
        )
        exc = _error(lambda: stub.CreatePromise(forged, timeout=10))  # noqa: B023
        assert (exc.code(), _reason(exc)) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "RESERVED_FOR_WORKFLOW",
        )
    with pytest.raises(PermissionDeniedError, match="numbered step"):
        client.resolve(f"{early}.0", "forged", create_if_missing=True)
    for _ in _run_worker(client, group, build):
        for wid, order in ((clean, "o-1"), (early, "o-2")):
            result = client.start("pay", order, id=wid, group=group).result(timeout=30)
            assert result == f"charged {order}"
    assert ran == ["o-1", "o-2"]  # the function ran; no forged value was ever there
    assert client.get(f"{early}.0").parent_id == early
    assert client.get(f"{clean}.0").parent_id == clean


# -- items 6 and 7: a settled root ------------------------------------------------------


def test_a_settled_root_takes_no_new_pending_step_but_records_results(
    client: Client, server: ServerProcess
) -> None:
    group, wid = _wid("g"), _wid("wf")
    client.start("wf", id=wid, group=group, ttl=HOUR)
    held = Held(server, group)
    try:
        held.create(f"{wid}.0")
        client.cancel(wid)
        assert client.get(f"{wid}.0").state == "REJECTED_CANCELED"
        exc = _error(lambda: held.create(f"{wid}.1"))
        assert (exc.code(), _reason(exc)) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "WORKFLOW_SETTLED",
        )
        assert wid in (exc.details() or "") and "REJECTED_CANCELED" in (exc.details() or "")
        # Compensation after Cancelled: a finished result is still recorded.
        undo = held.create(f"{wid}.1", record=b'"refunded"', tags=RUN_TAGS)
        assert undo.promise.state == types_pb2.PROMISE_STATE_RESOLVED
    finally:
        held.close()


def _approvals(client: Client, group: str) -> list[str]:
    tags = {"troth:kind": "promise", "troth:group": group}
    return [p.id for p in client.search_all("*", states=["PENDING"], tags=tags)]


def _ended(client: Client, promise_id: str) -> dict[str, Any]:
    promise = client.get(promise_id)
    assert promise.state == "REJECTED_CANCELED"
    value: dict[str, Any] = json.loads(promise.value.data)
    return value


def test_a_workflow_that_returns_or_fails_leaves_no_waiting_human(client: Client) -> None:
    group = _wid("inbox")
    asked = threading.Event()

    def build(worker: Worker) -> None:
        @worker.workflow(name="either")
        def either(ctx: Context) -> Generator[Any, Any, Any]:
            first = yield ctx.promise(title="first")
            second = yield ctx.promise(title="second")
            return (yield ctx.any([first, second]))

        @worker.workflow(name="fails")
        def fails(ctx: Context) -> Generator[Any, Any, Any]:
            yield ctx.promise(title="never waited for")
            asked.set()
            raise WorkflowFailed("gave up")  # on purpose: a bare RuntimeError would pause it

    returns, failing = _wid("either"), _wid("fails")
    for _ in _run_worker(client, group, build):
        handle = client.start("either", id=returns, group=group, ttl=HOUR)
        _eventually(lambda: len(_approvals(client, group)) == 2, "two approvals asked")
        client.resolve(f"{returns}.0", "yes")
        assert handle.result(timeout=30) == "yes"
        with pytest.raises(PromiseRejectedError):
            client.start("fails", id=failing, group=group, ttl=HOUR).result(timeout=30)

    assert _approvals(client, group) == []
    assert _ended(client, f"{returns}.1")["reason"] == "workflow ended"
    assert _ended(client, f"{failing}.0") == {
        "reason": "workflow ended",
        "workflow": failing,
        "workflow_state": "REJECTED",
    }
    with pytest.raises(AlreadySettledError, match="workflow ended"):
        client.resolve(f"{returns}.1", "too late")


def test_cancelling_a_parent_ends_its_child_workflows_steps(
    client: Client, server: ServerProcess
) -> None:
    group, wid = _wid("g"), _wid("wf")
    client.start("parent", id=wid, group=group, ttl=HOUR)
    parent = Held(server, group, "w-parent")
    try:
        child_id = f"{wid}.0"
        start_tags = {"troth:kind": "start", "troth:func": "child", "troth:invoke": group}
        child_root = parent.create(child_id, tags=start_tags, param=types_pb2.Payload(data=b"[]"))
        assert (child_root.promise.root_id, child_root.promise.parent_id) == (wid, wid)
        child = Held(server, group, "w-child")
        try:
            assert child.delivery.task.root_promise_id == child_id
            step = child.create(f"{child_id}.0").promise
            assert (step.root_id, step.parent_id) == (wid, child_id)
            # The parent's history carries its own steps, not its child's.
            client.cancel(wid)
            assert _ended(client, child_id)["reason"] == "workflow cancelled"
            assert _ended(client, f"{child_id}.0") == {
                "reason": "workflow cancelled",
                "workflow": child_id,
                "workflow_state": "REJECTED_CANCELED",
            }
        finally:
            child.close()
    finally:
        parent.close()


def _eventually(check: Any, what: str, timeout: float = 20) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_search_by_parent_lists_a_workflows_steps_named_ones_too(client: Client) -> None:
    """`SearchPromises.parent_id` (`Client.search(parent_id=...)`, what `troth export`
    reads a history with): by record, so a named step is listed and a promise that
    merely shares the prefix is not; its page tokens are bound to it."""
    group, wid = _wid("g"), _wid("wf")
    named = f"approve-{wid}"

    def build(worker: Worker) -> None:
        @worker.workflow(name="asks")
        def asks(ctx: Context) -> Generator[Any, Any, Any]:
            yield ctx.run(str.upper, "a")
            approval = yield ctx.promise(id=named)
            yield ctx.run(str.upper, "b")
            return (yield approval)

    client.create(f"{wid}.note-99")  # shares the prefix, belongs to no one
    for _ in _run_worker(client, group, build):
        handle = client.start("asks", id=wid, group=group, ttl=HOUR)
        _eventually(lambda: len(client.search(parent_id=wid).promises) == 3, "three steps")
        client.resolve(named, "ok")
        assert handle.result(timeout=30) == "ok"

    steps = [p.id for p in client.search_all(parent_id=wid)]
    assert steps == [f"{wid}.0", named, f"{wid}.2"]
    first = client.search(parent_id=wid, page_size=1)
    assert first.next_page_token is not None
    with pytest.raises(InvalidArgumentError):  # the token was issued for that parent
        client.search(parent_id=f"{wid}.note-99", page_size=1, page_token=first.next_page_token)
    with pytest.raises(InvalidArgumentError) as caught:
        client.search(parent_id="not an id")
    assert caught.value.field == "parent_id"
