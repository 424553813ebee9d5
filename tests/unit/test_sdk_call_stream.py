"""The SDK's `Calls` stream (`troth._mux`) against bare gRPC servers: against a server
that has no `Calls` (an older troth) the calls go as unary RPCs; calls cut off by a
stream that breaks fail UNAVAILABLE, and the next call opens a new stream; calls
queued together go in one message, to a server that says it reads them, and answers
batched in one message each reach their caller."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from troth import Client
from troth._mux import (
    BATCH_CALLS,
    BATCH_METADATA,
    END,
    UNARY_ABOVE_BYTES,
    CallError,
    take_batch,
)
from troth._transport import Transport
from troth.errors import ConfigurationError
from troth.v1 import promises_pb2 as pb
from troth.v1 import tasks_pb2

GET = "/troth.v1.PromiseService/GetPromise"
CALLS = "/troth.v1.TaskService/Calls"


class BareServer:
    """A grpc.aio server on its own loop with the handlers given (raw bytes in and out)."""

    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(handlers), self.loop).result(10)

    async def _start(self, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]) -> Any:
        server = grpc.aio.server()
        by_service: dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]] = {}
        for path, handler in handlers.items():
            service, method = path.strip("/").split("/")
            by_service.setdefault(service, {})[method] = handler
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(s, m) for s, m in by_service.items()]
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _get(served: list[str]) -> grpc.RpcMethodHandler[Any, Any]:
    async def get(request: bytes, context: Any) -> bytes:
        served.append("unary")
        asked = pb.GetPromiseRequest.FromString(request)
        return pb.GetPromiseResponse(promise={"id": asked.id}).SerializeToString()

    return grpc.unary_unary_rpc_method_handler(get)


@pytest.fixture
def served() -> list[str]:
    return []


@pytest.fixture
def older(served: list[str]) -> Iterator[BareServer]:
    server = BareServer({GET: _get(served)})  # no Calls: UNIMPLEMENTED
    yield server
    server.close()


def _three_gets(transport: Transport) -> None:
    """Three GetPromise calls through the transport, each answered with its own id."""
    for n in range(3):
        request = pb.GetPromiseRequest(id=f"p-{n}")
        answer = transport.call(transport.promises.GetPromise, request, timeout=10)
        assert answer.promise.id == f"p-{n}"


def test_against_a_server_without_calls_the_calls_go_as_unary_rpcs(
    older: BareServer, served: list[str]
) -> None:
    transport = Transport(f"127.0.0.1:{older.port}").multiplexed()
    try:
        _three_gets(transport)
        assert served == ["unary"] * 3
        assert transport.calls is not None and transport.calls.unsupported
    finally:
        transport.close()


def _refusing(code: grpc.StatusCode, opened: list[int]) -> grpc.RpcMethodHandler[Any, Any]:
    """A `Calls` that refuses every stream at its opening, as an interceptor does."""

    async def calls(requests: Any, context: Any) -> Any:
        opened.append(1)
        await context.abort(code, "refused at opening")
        yield b""  # not reached: a generator, as a stream handler is

    return grpc.stream_stream_rpc_method_handler(calls)


@pytest.mark.parametrize(
    ("code", "for_good"),
    [
        (grpc.StatusCode.PERMISSION_DENIED, True),  # a server that lets only workers open it
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),  # --max-streams are open, for now
        (grpc.StatusCode.UNAUTHENTICATED, False),  # the unary RPC's own refusal, or a token
    ],
)
def test_a_call_on_a_stream_refused_at_opening_is_made_as_its_unary_rpc(
    served: list[str], code: grpc.StatusCode, for_good: bool
) -> None:
    """A client's call must never fail for its stream: a stream refused before it opened
    reached no handler, so each call is made again as the unary RPC it is; after a
    refusal that lasts (a role), without trying the stream again."""
    opened: list[int] = []
    server = BareServer({GET: _get(served), CALLS: _refusing(code, opened)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    try:
        _three_gets(transport)
        assert served == ["unary"] * 3
        assert transport.calls is not None and transport.calls.unsupported is for_good
        assert len(opened) == (1 if for_good else 3)
    finally:
        transport.close()
        server.close()


def test_a_stream_broken_after_it_opened_is_no_refusal_and_its_calls_are_retried() -> None:
    """RESOURCE_EXHAUSTED after the server took the stream (a message over its limit)
    may follow calls it handled: not made again as unary calls behind the retry policy."""
    served: list[str] = []

    async def calls(requests: Any, context: Any) -> Any:
        await context.send_initial_metadata((BATCH_METADATA,))
        async for _ in requests:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "message too large")
        yield b""  # not reached

    server = BareServer({GET: _get(served), CALLS: grpc.stream_stream_rpc_method_handler(calls)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    try:
        stream = transport.calls
        assert stream is not None
        with pytest.raises(CallError) as broken:
            stream.invoke("GetPromise", b"", pb.GetPromiseResponse, 10)
        assert broken.value.stream_failed and not broken.value.refused
        assert served == []
    finally:
        transport.close()
        server.close()


def test_calls_cut_off_by_a_broken_stream_fail_unavailable_and_the_next_one_reopens() -> None:
    opened: list[int] = []

    async def calls(requests: Any, context: Any) -> Any:
        opened.append(1)
        if len(opened) == 1:
            async for _ in requests:  # take the call, then break the stream unanswered
                await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        async for raw in requests:
            request = tasks_pb2.CallsRequest.FromString(raw)
            asked = pb.GetPromiseRequest.FromString(request.request)
            response = pb.GetPromiseResponse(promise={"id": asked.id})
            yield tasks_pb2.CallsResponse(
                id=request.id, code=0, response=response.SerializeToString()
            ).SerializeToString()

    server = BareServer({CALLS: grpc.stream_stream_rpc_method_handler(calls)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    try:
        stream = transport.calls
        assert stream is not None
        with pytest.raises(CallError) as cut:  # the stream itself, without the retries
            first = pb.GetPromiseRequest(id="first").SerializeToString()
            stream.invoke("GetPromise", first, pb.GetPromiseResponse, 10)
        assert cut.value.code() is grpc.StatusCode.UNAVAILABLE and cut.value.stream_failed
        # Through the transport, as the worker calls: a new stream answers it.
        get = transport.promises.GetPromise
        answer = transport.call(get, pb.GetPromiseRequest(id="second"), timeout=10)
        assert answer.promise.id == "second"
        assert len(opened) == 2
    finally:
        transport.close()
        server.close()


def test_a_large_request_goes_as_a_unary_call_not_on_the_stream(served: list[str]) -> None:
    """So that one over the server's message limit fails alone, not every call on the
    stream with it."""

    async def calls(requests: Any, context: Any) -> Any:
        async for raw in requests:
            served.append("stream")
            request = tasks_pb2.CallsRequest.FromString(raw)
            response = pb.GetPromiseResponse(promise={"id": "small"})
            yield tasks_pb2.CallsResponse(
                id=request.id, code=0, response=response.SerializeToString()
            ).SerializeToString()

    server = BareServer({GET: _get(served), CALLS: grpc.stream_stream_rpc_method_handler(calls)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    try:
        get = transport.promises.GetPromise
        transport.call(get, pb.GetPromiseRequest(id="small"), timeout=10)
        large = "x" * (UNARY_ABOVE_BYTES + 1)
        assert transport.call(get, pb.GetPromiseRequest(id=large), timeout=10).promise.id == large
        assert served == ["stream", "unary"]
    finally:
        transport.close()
        server.close()


def _queued(*sizes: int) -> queue.SimpleQueue[object]:
    outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()
    for n, size in enumerate(sizes, start=2):
        outgoing.put(tasks_pb2.CallsRequest(id=n, method="GetPromise", request=b"x" * size))
    return outgoing


def _first() -> tasks_pb2.CallsRequest:
    return tasks_pb2.CallsRequest(id=1, method="GetPromise", request=b"x")


def test_calls_queued_together_go_in_one_message() -> None:
    first, outgoing = _first(), _queued(1, 1, 1)
    assert take_batch(first, outgoing) is None
    assert [c.id for c in first.more] == [2, 3, 4] and outgoing.empty()


def test_a_batch_stops_at_its_call_and_byte_caps_and_at_the_end() -> None:
    first, outgoing = _first(), _queued(*([1] * (BATCH_CALLS + 5)))
    carried = take_batch(first, outgoing)
    assert carried is None and len(first.more) == BATCH_CALLS - 1  # the rest wait their turn
    half = UNARY_ABOVE_BYTES // 2 + 1
    first, outgoing = _first(), _queued(half, half)
    carried = take_batch(first, outgoing)
    assert [c.id for c in first.more] == [2]
    assert isinstance(carried, tasks_pb2.CallsRequest) and carried.id == 3  # sent next, alone
    first, outgoing = _first(), _queued(1)
    outgoing.put(END)
    assert take_batch(first, outgoing) is END and [c.id for c in first.more] == [2]


def _answering(
    batched: bool, received: list[tasks_pb2.CallsRequest], metadata: list[Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """Calls that answers each message's calls (every one in `more` too), batched in one
    message when `batched` (and then saying so in its initial metadata)."""

    async def calls(requests: Any, context: Any) -> Any:
        metadata.append(tuple(context.invocation_metadata()))
        if batched:
            await context.send_initial_metadata((BATCH_METADATA,))
        async for raw in requests:
            message = tasks_pb2.CallsRequest.FromString(raw)
            received.append(message)
            answers = []
            for call in (message, *message.more):
                asked = pb.GetPromiseRequest.FromString(call.request)
                response = pb.GetPromiseResponse(promise={"id": asked.id})
                answers.append(
                    tasks_pb2.CallsResponse(id=call.id, response=response.SerializeToString())
                )
            if batched:
                answers[0].more.extend(answers[1:])
                answers = answers[:1]
            for answer in answers:
                yield answer.SerializeToString()

    return grpc.stream_stream_rpc_method_handler(calls)


@pytest.mark.parametrize("batched", [True, False], ids=["batching-server", "older-server"])
def test_calls_from_many_threads_each_get_their_answer_batched_only_if_the_server_reads_it(
    batched: bool,
) -> None:
    received: list[tasks_pb2.CallsRequest] = []
    metadata: list[Any] = []
    server = BareServer({CALLS: _answering(batched, received, metadata)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    got: dict[int, str] = {}
    try:
        get = transport.promises.GetPromise

        def call(n: int) -> None:
            got[n] = transport.call(get, pb.GetPromiseRequest(id=f"p-{n}"), timeout=10).promise.id

        call(0)  # the stream is open, and the worker knows whether the server reads batches
        for _round in range(5):
            threads = [threading.Thread(target=call, args=(n,)) for n in range(1, 41)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert got == {n: f"p-{n}" for n in range(41)}
    finally:
        transport.close()
        server.close()
    assert all(BATCH_METADATA in m for m in metadata)  # the worker says it reads batches
    if batched:
        # 40 threads calling at once queue calls faster than one message goes out
        # (about half the messages carry several, seen here): batched answers were read.
        assert any(m.more for m in received)
    else:
        assert not any(m.more for m in received)  # an older server would leave them unanswered


def test_a_client_told_not_to_multiplex_opens_no_stream(served: list[str]) -> None:
    """`Client(multiplex_calls=False)`, as the CLI makes it: each call its own RPC."""
    opened: list[int] = []
    server = BareServer(
        {GET: _get(served), CALLS: _refusing(grpc.StatusCode.UNIMPLEMENTED, opened)}
    )
    try:
        client = Client(f"127.0.0.1:{server.port}", multiplex_calls=False)
        with client, pytest.raises(ValueError, match="promise state 0"):  # a bare answer
            client.get("p-1")
        assert served == ["unary"] and opened == []
    finally:
        server.close()


def test_multiplex_calls_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="multiplex_calls='yes' must be True or False"):
        Client("127.0.0.1:1", multiplex_calls="yes")  # type: ignore[arg-type]


def test_closing_a_stream_waits_until_its_reader_saw_the_end() -> None:
    """So that the channel closes after gRPC is done with the cancelled call."""

    async def calls(requests: Any, context: Any) -> Any:
        async for raw in requests:
            request = tasks_pb2.CallsRequest.FromString(raw)
            response = pb.GetPromiseResponse(promise={"id": "p"})
            yield tasks_pb2.CallsResponse(
                id=request.id, code=0, response=response.SerializeToString()
            ).SerializeToString()

    server = BareServer({CALLS: grpc.stream_stream_rpc_method_handler(calls)})
    transport = Transport(f"127.0.0.1:{server.port}").multiplexed()
    try:
        transport.call(transport.promises.GetPromise, pb.GetPromiseRequest(id="p"), timeout=10)
        assert [t for t in threading.enumerate() if t.name == "troth-calls"]
        transport.close_calls()
        assert not [t for t in threading.enumerate() if t.name == "troth-calls"]
    finally:
        transport.close()
        server.close()
