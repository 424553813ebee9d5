"""The SDK's `Calls` stream (`troth._mux`) against bare gRPC servers: against a server
that has no `Calls` (an older troth) the calls go as unary RPCs; calls cut off by a
stream that breaks fail UNAVAILABLE, and the next call opens a new stream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from troth._mux import UNARY_ABOVE_BYTES, CallError
from troth._transport import Transport
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


def test_against_a_server_without_calls_the_calls_go_as_unary_rpcs(
    older: BareServer, served: list[str]
) -> None:
    transport = Transport(f"127.0.0.1:{older.port}").multiplexed()
    try:
        for n in range(3):
            request = pb.GetPromiseRequest(id=f"p-{n}")
            answer = transport.call(transport.promises.GetPromise, request, timeout=10)
            assert answer.promise.id == f"p-{n}"
        assert served == ["unary"] * 3
        assert transport.calls is not None and transport.calls.unsupported
    finally:
        transport.close()


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
