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
from google.protobuf.duration_pb2 import Duration
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
    for existing in (f"calls-{run}", f"calls-{run}.note"):
        promises.CreatePromise(pb.CreatePromiseRequest(id=existing), timeout=WAIT)
    settled = f"calls-{run}-settled"  # what the settles below find: refused both ways
    promises.CreatePromise(pb.CreatePromiseRequest(id=settled), timeout=WAIT)
    promises.ResolvePromise(pb.ResolvePromiseRequest(id=settled), timeout=WAIT)
    requests = [
        ("GetPromise", pb.GetPromiseRequest(id=f"calls-{run}")),
        ("GetPromise", pb.GetPromiseRequest(id=f"calls-{run}-missing")),  # NOT_FOUND
        ("GetPromise", pb.GetPromiseRequest(id="")),  # INVALID_ARGUMENT
        ("CreatePromise", pb.CreatePromiseRequest(id=f"calls-{run}")),  # a repeat: OK
        ("CreatePromise", pb.CreatePromiseRequest(id=f"calls-{run}.note")),  # not a workflow's
        ("CreatePromise", pb.CreatePromiseRequest(id=f"calls-{run}.7")),  # a step's id: refused
        ("CreatePromise", pb.CreatePromiseRequest(id="x" * 100_000)),  # INVALID_ARGUMENT
        ("CompleteTask", tasks_pb2.CompleteTaskRequest(task_id="t-none", counter=1, worker_id="w")),
        ("Heartbeat", tasks_pb2.HeartbeatRequest(worker_id=f"w-{run}")),
        ("ResolvePromise", pb.ResolvePromiseRequest(id=f"calls-{run}-missing")),  # NOT_FOUND
        ("RejectPromise", pb.RejectPromiseRequest(id=settled)),  # ALREADY_SETTLED
        ("CancelPromise", pb.CancelPromiseRequest(id="")),  # INVALID_ARGUMENT
        ("WaitPromise", pb.WaitPromiseRequest(id=settled)),  # settled: at once
        ("WaitPromise", pb.WaitPromiseRequest(id=f"calls-{run}", wait=Duration())),  # pending
        ("WaitPromise", pb.WaitPromiseRequest(id=settled, wait=Duration(seconds=-1))),  # bad
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


BATCH = ("troth-calls-batch", "1")


def _get_missing(n: int, run: str) -> tasks_pb2.CallsRequest:
    request = pb.GetPromiseRequest(id=f"batch-{run}-{n}").SerializeToString()
    return tasks_pb2.CallsRequest(id=n, method="GetPromise", request=request)


def _batched(
    stub: tasks_pb2_grpc.TaskServiceStub,
    messages: list[tasks_pb2.CallsRequest],
    metadata: tuple[tuple[str, str], ...],
) -> tuple[list[tasks_pb2.CallsResponse], tuple[Any, ...]]:
    """The answer messages to `messages` (sent at once) and the server's initial metadata."""
    stream = stub.Calls(iter(messages), timeout=WAIT, metadata=metadata)
    answers = list(stream)
    return answers, tuple(stream.initial_metadata())


def _five(run: str) -> tasks_pb2.CallsRequest:
    """One message carrying five reads of missing promises (ids 1 to 5)."""
    batch = _get_missing(1, run)
    batch.more.extend(_get_missing(n, run) for n in range(2, 6))
    return batch


def _ids(message: tasks_pb2.CallsResponse) -> list[int]:
    return [message.id, *(answer.id for answer in message.more)]


def test_calls_in_one_message_are_each_answered_and_ready_answers_come_in_one(
    channel: grpc.Channel,
) -> None:
    run = uuid.uuid4().hex[:8]
    messages, initial = _batched(tasks_pb2_grpc.TaskServiceStub(channel), [_five(run)], (BATCH,))
    assert BATCH in initial  # the server says it reads batches
    # Five reads answered at once (NOT_FOUND needs no write): one message carries them.
    assert [sorted(_ids(m)) for m in messages] == [[1, 2, 3, 4, 5]]
    for answer in (messages[0], *messages[0].more):
        code, _, message, reason = _answered(answer)
        assert code == grpc.StatusCode.NOT_FOUND.value[0] and reason == "NOT_FOUND"
        assert f"batch-{run}-{answer.id}" in message


def test_a_worker_that_does_not_say_it_reads_batches_gets_one_answer_per_message(
    channel: grpc.Channel,
) -> None:
    messages, _ = _batched(
        tasks_pb2_grpc.TaskServiceStub(channel), [_five(uuid.uuid4().hex[:8])], ()
    )
    assert sorted(m.id for m in messages) == [1, 2, 3, 4, 5]
    assert not any(m.more for m in messages)


def test_answers_batch_up_to_a_mebibyte(channel: grpc.Channel) -> None:
    run = uuid.uuid4().hex[:8]
    promises = promises_pb2_grpc.PromiseServiceStub(channel)
    big = {"data": b"x" * 600_000}  # two such answers pass 1 MiB: each goes alone
    ids = [f"big-{run}-{n}" for n in range(3)]
    for promise_id in ids:
        promises.CreatePromise(pb.CreatePromiseRequest(id=promise_id, param=big))
    calls = [
        tasks_pb2.CallsRequest(
            id=n,
            method="GetPromise",
            request=pb.GetPromiseRequest(id=promise_id).SerializeToString(),
        )
        for n, promise_id in enumerate(ids, start=1)
    ]
    batch, *rest = calls
    batch.more.extend(rest)
    messages, _ = _batched(tasks_pb2_grpc.TaskServiceStub(channel), [batch], (BATCH,))
    assert sorted(m.id for m in messages) == [1, 2, 3] and not any(m.more for m in messages)
    assert all(m.code == 0 for m in messages)


def test_a_call_nested_in_more_is_refused_by_id_and_the_others_answered(
    channel: grpc.Channel,
) -> None:
    run = uuid.uuid4().hex[:8]
    nested = _get_missing(3, run)
    nested.more.append(_get_missing(4, run))
    batch = _get_missing(1, run)
    batch.more.extend([_get_missing(2, run), nested])
    messages, _ = _batched(tasks_pb2_grpc.TaskServiceStub(channel), [batch], ())
    answers = {m.id: m for m in messages}
    assert sorted(answers) == [1, 2, 3]
    assert [answers[n].code for n in (1, 2)] == [grpc.StatusCode.NOT_FOUND.value[0]] * 2
    code, _, message, reason = _answered(answers[3])
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "INVALID_ARGUMENT")
    assert "`more`" in message


def test_the_sdk_batches_calls_made_at_once_and_each_gets_its_answer(
    server: ServerProcess,
) -> None:
    from troth._transport import Transport

    run = uuid.uuid4().hex[:8]
    transport = Transport(server.address).multiplexed()
    got: dict[int, str] = {}
    try:
        create = transport.promises.CreatePromise

        def call(n: int) -> None:
            request = pb.CreatePromiseRequest(id=f"sdk-batch-{run}-{n}")
            got[n] = transport.call(create, request, timeout=WAIT).promise.id

        threads = [threading.Thread(target=call, args=(n,)) for n in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        transport.close()
    assert got == {n: f"sdk-batch-{run}-{n}" for n in range(100)}
