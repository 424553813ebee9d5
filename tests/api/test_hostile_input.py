"""Issue 10's client mistakes that were answered as outages or crashes, now each
`INVALID_ARGUMENT` (or `INVALID_PAGE_TOKEN`) naming the field, on SQLite and PostgreSQL.

Before: a NUL byte was UNAVAILABLE on PostgreSQL (and retried by the SDK) but
stored on SQLite; over 65,535 awaited ids UNAVAILABLE on PostgreSQL; a page token
of 3,000 `[` INTERNAL; `created_before` >= 10^17 s or an edited token INTERNAL on
SQLite and UNAVAILABLE on PostgreSQL; undecodable bytes UNKNOWN without ErrorInfo;
Durations with bad nanos accepted.
"""

from __future__ import annotations

import base64
import json
import uuid

import grpc
import pytest
from _support import ServerProcess, error_info, eventually
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from troth import Client, InvalidArgumentError
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types


def uid() -> str:
    return f"h-{uuid.uuid4().hex[:12]}"


def refused(call: object, request: object, field: str, reason: str = "INVALID_ARGUMENT") -> str:
    with pytest.raises(grpc.RpcError) as caught:
        answer = call(request, timeout=10)  # type: ignore[operator]
        if not hasattr(answer, "promise") and hasattr(answer, "__next__"):
            next(answer)  # a stream: its first message or its error
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info(error)
    assert (info.reason, info.metadata.get("field")) == (reason, field), error.details()
    return error.details() or ""


@pytest.fixture(scope="module")
def tasks(channel: grpc.Channel) -> tasks_pb2_grpc.TaskServiceStub:
    return tasks_pb2_grpc.TaskServiceStub(channel)


# --- NUL -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.CreatePromiseRequest(id="n", title="a\x00b"), "title"),
        (pb.CreatePromiseRequest(id="n", message="a\x00b"), "message"),
        (pb.CreatePromiseRequest(id="n", idempotency_key="k\x00"), "idempotency_key"),
        (pb.CreatePromiseRequest(id="n", tags={"team": "a\x00"}), "tags[team]"),
        (pb.CreatePromiseRequest(id="n", tags={"te\x00am": "a"}), "tags"),
        (
            pb.CreatePromiseRequest(id="n", param=types.Payload(headers={"h": "\x00"})),
            "param.headers[h]",
        ),
        (pb.CreatePromiseRequest(id="n", requested_by="\x00"), "requested_by"),
        (pb.CreatePromiseRequest(id="n", schema='{"type": "string"}\x00'), "schema"),
    ],
)
def test_a_nul_in_a_create_is_refused_naming_the_field(
    stub: promises_pb2_grpc.PromiseServiceStub, request_: pb.CreatePromiseRequest, field: str
) -> None:
    request_.id = uid()
    assert "NUL" in refused(stub.CreatePromise, request_, field)
    with pytest.raises(grpc.RpcError) as missing:  # and nothing was stored
        stub.GetPromise(pb.GetPromiseRequest(id=request_.id))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_nul_in_a_settle_or_a_search_is_refused(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=pid, idempotency_key="\x00"),
        "idempotency_key",
    )
    refused(
        stub.RejectPromise,
        pb.RejectPromiseRequest(id=pid, value=types.Payload(headers={"x": "\x00"})),
        "value.headers[x]",
    )
    refused(stub.SearchPromises, pb.SearchPromisesRequest(tags={"k": "\x00"}), "tags[k]")
    refused(stub.WatchPromises, pb.WatchPromisesRequest(tags={"k": "\x00"}), "tags[k]")
    assert (
        stub.GetPromise(pb.GetPromiseRequest(id=pid)).promise.state == types.PROMISE_STATE_PENDING
    )


def test_the_sdk_gets_invalid_argument_at_once_and_does_not_retry(
    server: ServerProcess, stub: promises_pb2_grpc.PromiseServiceStub
) -> None:
    pid, marker = uid(), uid()
    with Client(server.address) as client, pytest.raises(InvalidArgumentError) as caught:
        client.create(pid, {"n": 1}, title="Approve\x00?")
    assert caught.value.field == "title"
    # A call after it: once its line is in the (buffered) log, every attempt's is.
    with pytest.raises(grpc.RpcError):
        stub.GetPromise(pb.GetPromiseRequest(id=marker))

    def lines(promise_id: str) -> list[str]:
        return [line for line in server.log().splitlines() if f'"{promise_id}"' in line]

    eventually(lambda: bool(lines(marker)), what="the marker call's log line")
    attempts = lines(pid)
    assert len(attempts) == 1, attempts
    assert '"code":"INVALID_ARGUMENT"' in attempts[0].replace(" ", "")


# --- lists -----------------------------------------------------------------------------


def test_over_65535_awaited_ids_are_refused_naming_the_limit(
    tasks: tasks_pb2_grpc.TaskServiceStub,
) -> None:
    ids = [f"p{i}" for i in range(70_000)]
    held = {"task_id": "t", "counter": 1, "worker_id": "w"}
    details = refused(
        tasks.CompleteTask, tasks_pb2.CompleteTaskRequest(**held, suspend_on=ids), "suspend_on"
    )
    assert "70000" in details and "10000" in details and "--max-callback-ids" in details
    refused(
        tasks.RegisterCallbacks,
        tasks_pb2.RegisterCallbacksRequest(**held, promise_ids=ids),
        "promise_ids",
    )


# --- page tokens -----------------------------------------------------------------------


def test_a_deep_page_token_is_an_invalid_page_token(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    deep = base64.urlsafe_b64encode(b"[" * 3000).decode()
    refused(
        stub.SearchPromises,
        pb.SearchPromisesRequest(page_token=deep),
        "page_token",
        "INVALID_PAGE_TOKEN",
    )


def test_a_hand_edited_page_token_is_an_invalid_page_token(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    run = uid()
    for i in range(3):
        stub.CreatePromise(pb.CreatePromiseRequest(id=f"{run}.p{i}"))
    for order in (
        pb.PROMISE_ORDER_CREATED_ASC,
        pb.PROMISE_ORDER_CREATED_DESC,
        pb.PROMISE_ORDER_EXPIRE_TIME_ASC,
    ):
        query = {"id": f"{run}.*", "page_size": 1, "order": order}
        issued = stub.SearchPromises(pb.SearchPromisesRequest(**query)).next_page_token  # type: ignore[arg-type]
        fields = json.loads(base64.urlsafe_b64decode(issued + "=" * (-len(issued) % 4)))
        for edit in ({"after": 10**30}, {"after": -3}, {"after": 2.5}, {"extra": True}):
            edited = base64.urlsafe_b64encode(json.dumps({**fields, **edit}).encode()).decode()
            refused(
                stub.SearchPromises,
                pb.SearchPromisesRequest(**query, page_token=edited.rstrip("=")),  # type: ignore[arg-type]
                "page_token",
                "INVALID_PAGE_TOKEN",
            )
        if order == pb.PROMISE_ORDER_EXPIRE_TIME_ASC:
            edited = base64.urlsafe_b64encode(json.dumps({**fields, "expire": 10**25}).encode())
            refused(
                stub.SearchPromises,
                pb.SearchPromisesRequest(**query, page_token=edited.decode().rstrip("=")),  # type: ignore[arg-type]
                "page_token",
                "INVALID_PAGE_TOKEN",
            )


# --- times -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "created_before",
    [Timestamp(seconds=10**17), Timestamp(seconds=253_402_300_800), Timestamp(nanos=10**9)],
)
def test_a_far_future_created_before_is_refused(
    stub: promises_pb2_grpc.PromiseServiceStub, created_before: Timestamp
) -> None:
    refused(
        stub.SearchPromises,
        pb.SearchPromisesRequest(created_before=created_before),
        "created_before",
    )


def test_the_latest_timestamp_is_still_accepted(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    stub.SearchPromises(
        pb.SearchPromisesRequest(id=uid(), created_before=Timestamp(seconds=253_402_300_799)),
        timeout=10,
    )


@pytest.mark.parametrize(
    "duration",
    [
        Duration(seconds=60, nanos=-500_000_000),
        Duration(seconds=60, nanos=1_000_000_000),
        Duration(seconds=60, nanos=-1_000_000_000),
        Duration(seconds=-1, nanos=500_000_000),
    ],
)
def test_durations_with_bad_nanos_are_refused(
    stub: promises_pb2_grpc.PromiseServiceStub,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    duration: Duration,
) -> None:
    refused(stub.CreatePromise, pb.CreatePromiseRequest(id=uid(), ttl=duration), "ttl")
    refused(tasks.Heartbeat, tasks_pb2.HeartbeatRequest(worker_id="w", lease=duration), "lease")
    refused(tasks.Poll, tasks_pb2.PollRequest(group="g", worker_id="w", lease=duration), "lease")


# --- undecodable bytes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "data", "field"),
    [
        ("/troth.v1.PromiseService/GetPromise", b"\x0a\x02\xff\xfe", "id"),
        ("/troth.v1.PromiseService/CreatePromise", b"\x0a\x01a\x62\x03\xed\xa0\x80", "title"),
        ("/troth.v1.PromiseService/GetPromise", b"\x0a\x10abc", "id"),
        ("/troth.v1.TaskService/Heartbeat", b"\xff\xff", "request"),
    ],
)
def test_undecodable_bytes_are_invalid_argument_with_error_info(
    channel: grpc.Channel, method: str, data: bytes, field: str
) -> None:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as caught:
        call(data, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    info = error_info(caught.value)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field)
