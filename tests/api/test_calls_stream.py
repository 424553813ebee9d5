"""`TaskService.Calls` against a real server, on both stores: each call on the stream is
answered exactly as its unary RPC answers the same request (response, or code, message
and ErrorInfo), by id, concurrently; what the stream does not serve is refused by name;
the SDK's multiplexed transport maps its errors as a unary call's."""

from __future__ import annotations

import queue
import threading
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from _support import ServerProcess, error_info, eventually, start_server
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc

WAIT = 15.0


def _on_the_stream(
    stub: tasks_pb2_grpc.TaskServiceStub, calls: list[tuple[str, Any]]
) -> dict[int, tasks_pb2.CallsResponse]:
    requests = [
        tasks_pb2.CallsRequest(id=n, method=method, request=request.SerializeToString())
        for n, (method, request) in enumerate(calls, start=1)
    ]
    return {answer.id: answer for answer in stub.Calls(iter(requests), timeout=WAIT)}


def _unary(channel: grpc.Channel, method: str, request: Any) -> tuple[int, bytes, str, str]:
    service = "TaskService" if method in ("CompleteTask", "Heartbeat") else "PromiseService"
    call = channel.unary_unary(f"/troth.v1.{service}/{method}")
    try:
        response = call(request.SerializeToString(), timeout=WAIT)
    except grpc.RpcError as exc:
        return exc.code().value[0], b"", exc.details(), error_info(exc).reason
    return 0, response, "", ""


def _answered(answer: tasks_pb2.CallsResponse) -> tuple[int, bytes, str, str]:
    if answer.code == 0:
        return 0, answer.response, "", ""
    status = rpc_status.status_pb2.Status.FromString(answer.status_details)
    assert status.code == answer.code and status.message == answer.message
    reasons = [d for d in status.details if d.type_url.endswith("google.rpc.ErrorInfo")]
    info = error_details_pb2.ErrorInfo()
    reasons[0].Unpack(info)
    return answer.code, b"", answer.message, info.reason


def test_each_call_is_answered_as_its_unary_rpc_answers_it(
    server: ServerProcess, channel: grpc.Channel
) -> None:
    run = uuid.uuid4().hex[:8]
    promises = promises_pb2_grpc.PromiseServiceStub(channel)
    # What the creates below find: both ways answer a repeat (created false).
    for existing in (f"calls-{run}", f"calls-{run}.0"):
        promises.CreatePromise(pb.CreatePromiseRequest(id=existing), timeout=WAIT)
    requests = [
        ("GetPromise", pb.GetPromiseRequest(id=f"calls-{run}")),
        ("GetPromise", pb.GetPromiseRequest(id=f"calls-{run}-missing")),  # NOT_FOUND
        ("GetPromise", pb.GetPromiseRequest(id="")),  # INVALID_ARGUMENT
        ("CreatePromise", pb.CreatePromiseRequest(id=f"calls-{run}")),  # a repeat: OK
        ("CreatePromise", pb.CreatePromiseRequest(id=f"calls-{run}.0")),  # not a workflow's
        ("CreatePromise", pb.CreatePromiseRequest(id="x" * 100_000)),  # INVALID_ARGUMENT
        ("CompleteTask", tasks_pb2.CompleteTaskRequest(task_id="t-none", counter=1, worker_id="w")),
        ("Heartbeat", tasks_pb2.HeartbeatRequest(worker_id=f"w-{run}")),
    ]
    answers = _on_the_stream(tasks_pb2_grpc.TaskServiceStub(channel), requests)
    assert sorted(answers) == list(range(1, len(requests) + 1))
    for n, (method, request) in enumerate(requests, start=1):
        got, want = _answered(answers[n]), _unary(channel, method, request)
        if method == "Heartbeat":  # its answer carries the server's time of the call
            got, want = got[0:1] + got[2:], want[0:1] + want[2:]
        assert got == want, (method, request)
    codes = [answers[n].code for n in range(1, len(requests) + 1)]
    assert codes[1] == grpc.StatusCode.NOT_FOUND.value[0]
    assert codes[2] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_a_method_the_stream_does_not_serve_is_refused_by_name(channel: grpc.Channel) -> None:
    stub = tasks_pb2_grpc.TaskServiceStub(channel)
    (answer,) = _on_the_stream(
        stub, [("SearchTasks", tasks_pb2.SearchTasksRequest(group="g"))]
    ).values()
    assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "'SearchTasks' cannot be called on the Calls stream" in answer.message
    assert "unary" in answer.message


def test_many_calls_in_flight_on_one_stream_each_get_their_own_answer(
    channel: grpc.Channel,
) -> None:
    """Sent from threads while the stream is open, as the worker's runner threads do."""
    run = uuid.uuid4().hex[:8]
    stub = tasks_pb2_grpc.TaskServiceStub(channel)
    outgoing: queue.SimpleQueue[tasks_pb2.CallsRequest | None] = queue.SimpleQueue()
    answers = stub.Calls(iter(outgoing.get, None), timeout=WAIT)

    def send(n: int) -> None:
        request = pb.CreatePromiseRequest(id=f"many-{run}-{n}")
        outgoing.put(
            tasks_pb2.CallsRequest(
                id=n, method="CreatePromise", request=request.SerializeToString()
            )
        )

    threads = [threading.Thread(target=send, args=(n,)) for n in range(1, 201)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got: dict[int, tasks_pb2.CallsResponse] = {}
    for answer in answers:
        got[answer.id] = answer
        if len(got) == 200:
            outgoing.put(None)
    assert sorted(got) == list(range(1, 201))
    for n, answer in got.items():
        assert answer.code == 0
        assert pb.CreatePromiseResponse.FromString(answer.response).promise.id == f"many-{run}-{n}"


def test_the_sdk_stream_maps_errors_as_unary_calls_and_a_closed_one_refuses(
    server: ServerProcess,
) -> None:
    from troth._transport import Transport
    from troth.errors import NotFoundError

    transport = Transport(server.address).multiplexed()
    try:
        get = transport.promises.GetPromise
        with pytest.raises(NotFoundError, match="no-such"):
            transport.call(get, pb.GetPromiseRequest(id="no-such"), timeout=WAIT)
        assert transport.calls is not None
        transport.calls.close()  # ends the stream: later calls are refused at once
        with pytest.raises(Exception, match="closed"):
            transport.call(get, pb.GetPromiseRequest(id="no-such"), timeout=WAIT)
    finally:
        transport.close()


def test_streams_cancelled_with_calls_in_flight_give_their_slots_back(tmp_path: Path) -> None:
    """Each call on the stream holds a `--max-concurrent-rpcs` slot: cancelling the stream
    at once, before its calls ran, must give every one back."""
    server = start_server(tmp_path, "--max-concurrent-rpcs", "8")
    try:
        with server.channel() as channel:
            stub = tasks_pb2_grpc.TaskServiceStub(channel)
            for round_ in range(25):
                requests = [
                    tasks_pb2.CallsRequest(
                        id=n,
                        method="CreatePromise",
                        request=pb.CreatePromiseRequest(
                            id=f"slot-{round_}-{n}"
                        ).SerializeToString(),
                    )
                    for n in range(8)
                ]
                stream = stub.Calls(iter(requests), timeout=WAIT)
                stream.cancel()
            promises = promises_pb2_grpc.PromiseServiceStub(channel)

            def answered_not_found() -> bool:
                try:
                    promises.GetPromise(pb.GetPromiseRequest(id="slot-missing"), timeout=WAIT)
                except grpc.RpcError as exc:
                    return exc.code() is grpc.StatusCode.NOT_FOUND
                return False

            # A leaked slot per cancelled call would have filled all 8 long ago.
            eventually(answered_not_found, what="a unary call answered, not refused")
            for _ in range(20):
                assert answered_not_found()
    finally:
        assert server.stop() == 0
