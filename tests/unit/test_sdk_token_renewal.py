"""A token renewed while calls and streams are open (issue 26), against a bare gRPC
server that checks the bearer token on every call and ends a stream whose token it
no longer accepts, as troth's server does once it re-checks credentials per call:

- a call refused `UNAUTHENTICATED` (answered so on the `Calls` stream, or cut off
  by the stream's end) is made again, once, with the source's new token, on a new
  stream; with no new token the refusal is raised, at once;
- a new token opens a new `Calls` stream for the next calls, and the old one ends;
- a `WatchPromises` stream and a worker's `Poll` stream ended `UNAUTHENTICATED`
  reopen at once with the new token; with none, the watch raises and the worker
  logs the refusal as an ERROR, as before.

The source's clock stands still unless a test moves it: the SDK sends its cached
token until the server refuses it, the case that needs `refresh()`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from troth import Client, Worker
from troth._credentials import TOKEN_CHECK_S, token_source
from troth._events import WATCH_READY_METADATA, PromiseEventStream
from troth._transport import Transport
from troth.errors import UnauthenticatedError
from troth.v1 import promises_pb2 as pb
from troth.v1 import tasks_pb2, types_pb2

OLD = "tok-old-1d6e0f"
NEW = "tok-new-93a2bc"
GET = "/troth.v1.PromiseService/GetPromise"
WATCH = "/troth.v1.PromiseService/WatchPromises"
CALLS = "/troth.v1.TaskService/Calls"
POLL = "/troth.v1.TaskService/Poll"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]


class Door:
    """A bare server that accepts the tokens in `accepted`, checked on every call, and
    ends a stream (within 20 ms) once its token is no longer accepted. On `Calls` a call
    with a refused token is answered UNAUTHENTICATED, or (`end_calls`) ends the stream."""

    def __init__(self, *, end_calls: bool = False) -> None:
        self.accepted = {OLD}
        self.end_calls = end_calls
        self.opened: list[tuple[str, str]] = []
        """(method, token) of every stream opened and unary call made."""
        self.ended: list[str] = []
        """The token of every `Calls` stream that ended."""
        self.events: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def opens(self, method: str) -> list[str]:
        return [token for name, token in list(self.opened) if name == method]

    async def _start(self) -> Any:
        server = grpc.aio.server()
        handlers = {
            "troth.v1.PromiseService": {
                "GetPromise": grpc.unary_unary_rpc_method_handler(self._get),
                "WatchPromises": grpc.unary_stream_rpc_method_handler(self._watch),
            },
            "troth.v1.TaskService": {
                "Calls": grpc.stream_stream_rpc_method_handler(self._calls),
                "Poll": grpc.unary_stream_rpc_method_handler(self._poll),
            },
        }
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(s, m) for s, m in handlers.items()]
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _door(self, method: str, context: Any) -> str:
        token = dict(context.invocation_metadata()).get("authorization", "")
        token = token.removeprefix("Bearer ")
        self.opened.append((method, token))
        if token not in self.accepted:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token refused")
        return token

    async def _until_revoked(self, token: str, context: Any) -> None:
        while token in self.accepted:
            await asyncio.sleep(0.02)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token revoked")

    @staticmethod
    def _answer(request: bytes, token: str) -> bytes:
        asked = pb.GetPromiseRequest.FromString(request)
        return pb.GetPromiseResponse(
            promise={"id": asked.id, "settled_by": token}
        ).SerializeToString()

    async def _get(self, request: bytes, context: Any) -> bytes:
        return self._answer(request, await self._door("GetPromise", context))

    async def _calls(self, requests: Any, context: Any) -> Any:
        token = await self._door("Calls", context)
        try:
            async for raw in requests:
                message = tasks_pb2.CallsRequest.FromString(raw)
                if token not in self.accepted:
                    if self.end_calls:
                        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token revoked")
                    yield tasks_pb2.CallsResponse(
                        id=message.id, code=UNAUTHENTICATED, message="token revoked"
                    ).SerializeToString()
                    continue
                yield tasks_pb2.CallsResponse(
                    id=message.id, response=self._answer(message.request, token)
                ).SerializeToString()
        finally:
            self.ended.append(token)

    async def _watch(self, request: bytes, context: Any) -> Any:
        sent = len(self.events)  # before the open is recorded: what comes after is sent
        token = await self._door("WatchPromises", context)
        await context.send_initial_metadata((WATCH_READY_METADATA,))
        while token in self.accepted:
            while sent < len(self.events):
                sent += 1
                yield self.events[sent - 1]
            await asyncio.sleep(0.02)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token revoked")

    async def _poll(self, request: bytes, context: Any) -> Any:
        token = await self._door("Poll", context)
        await self._until_revoked(token, context)
        yield b""  # not reached: a generator, as a stream handler is


class Supplier:
    """A token callable whose answer the test sets; counts how often it is asked."""

    def __init__(self) -> None:
        self.token = OLD
        self.asked = 0

    def __call__(self) -> str:
        self.asked += 1
        return self.token


@pytest.fixture
def supplier() -> Supplier:
    return Supplier()


def _transport(door: Door, supplier: Supplier, *, multiplexed: bool = True) -> Transport:
    still = token_source(supplier, clock=lambda: 0.0)  # never time to ask again by itself
    transport = Transport(f"127.0.0.1:{door.port}", token=still)
    return transport.multiplexed() if multiplexed else transport


def _settled_by(transport: Transport, promise_id: str = "p") -> str:
    request = pb.GetPromiseRequest(id=promise_id)
    return transport.call(transport.promises.GetPromise, request, timeout=10).promise.settled_by


def _revoke_and_renew(door: Door, supplier: Supplier) -> None:
    door.accepted = {NEW}
    supplier.token = NEW


@pytest.fixture(params=["answered", "stream ended"])
def door(request: pytest.FixtureRequest) -> Iterator[Door]:
    server = Door(end_calls=request.param == "stream ended")
    yield server
    server.close()


@pytest.mark.parametrize("multiplexed", [True, False], ids=["Calls", "unary"])
def test_a_call_refused_with_an_old_token_is_made_again_with_the_new_one(
    door: Door, supplier: Supplier, multiplexed: bool
) -> None:
    transport = _transport(door, supplier, multiplexed=multiplexed)
    try:
        assert _settled_by(transport) == OLD
        _revoke_and_renew(door, supplier)
        assert _settled_by(transport) == NEW
        assert _settled_by(transport) == NEW
        if multiplexed:
            assert door.opens("Calls") == [OLD, NEW]
        else:
            assert door.opens("GetPromise") == [OLD, OLD, NEW, NEW]
    finally:
        transport.close_calls()
        transport.close()


@pytest.mark.parametrize("multiplexed", [True, False], ids=["Calls", "unary"])
def test_with_no_new_token_the_refusal_is_raised_at_once(
    door: Door, supplier: Supplier, multiplexed: bool
) -> None:
    transport = _transport(door, supplier, multiplexed=multiplexed)
    try:
        assert _settled_by(transport) == OLD
        door.accepted = set()
        asked = supplier.asked
        with pytest.raises(UnauthenticatedError):
            _settled_by(transport)
        assert supplier.asked == asked + 1  # asked once, found the same token: no retry
        if not multiplexed:
            assert door.opens("GetPromise") == [OLD, OLD]
    finally:
        transport.close_calls()
        transport.close()


def test_a_new_token_opens_a_new_calls_stream_and_the_old_one_ends(
    supplier: Supplier,
) -> None:
    door = Door()
    clock = [0.0]
    source = token_source(supplier, clock=lambda: clock[0])
    transport = Transport(f"127.0.0.1:{door.port}", token=source).multiplexed()
    try:
        assert _settled_by(transport) == OLD
        supplier.token = NEW  # renewed ahead of time: the server still takes both
        door.accepted = {OLD, NEW}
        clock[0] += TOKEN_CHECK_S
        assert _settled_by(transport) == NEW
        assert door.opens("Calls") == [OLD, NEW]
        deadline = time.monotonic() + 10
        while door.ended != [OLD]:
            assert time.monotonic() < deadline, door.ended
            time.sleep(0.01)
    finally:
        transport.close_calls()
        transport.close()
        door.close()


@pytest.fixture
def plain_door() -> Iterator[Door]:
    server = Door()
    yield server
    server.close()


def _event(promise_id: str) -> bytes:
    return pb.WatchPromisesResponse(
        type=pb.PROMISE_EVENT_TYPE_CREATED,
        promise={"id": promise_id, "state": types_pb2.PROMISE_STATE_PENDING},
    ).SerializeToString()


def test_a_watch_ended_for_its_token_reopens_with_the_new_one(
    plain_door: Door, supplier: Supplier
) -> None:
    door = plain_door
    transport = _transport(door, supplier, multiplexed=False)
    reconnected: list[int] = []
    events = PromiseEventStream(
        transport, pb.WatchPromisesRequest(id="*"), lambda: reconnected.append(1)
    )
    try:
        first: list[str] = []
        opening = threading.Thread(target=lambda: first.append(next(events).promise.id))
        opening.start()
        # The fake server sends only the events appended after a watch opened.
        _wait_for(lambda: door.opens("WatchPromises") == [OLD])
        door.events.append(_event("before"))
        opening.join(10)
        assert first == ["before"]
        _revoke_and_renew(door, supplier)
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(next(events).promise.id))
        reader.start()
        _wait_for(lambda: door.opens("WatchPromises") == [OLD, NEW])
        door.events.append(_event("after"))
        reader.join(10)
        assert got == ["after"]
        assert reconnected == [1]
    finally:
        events.close()
        transport.close()


def test_a_watch_ended_for_its_token_with_no_new_one_raises(
    plain_door: Door, supplier: Supplier
) -> None:
    door = plain_door
    transport = _transport(door, supplier, multiplexed=False)
    events = PromiseEventStream(transport, pb.WatchPromisesRequest(id="*"), None)
    try:
        door.accepted = set()
        with pytest.raises(UnauthenticatedError):
            next(events)
        assert door.opens("WatchPromises") == [OLD]
    finally:
        events.close()
        transport.close()


def test_a_worker_whose_poll_stream_is_ended_for_its_token_reopens_with_the_new_one(
    plain_door: Door, supplier: Supplier, caplog: pytest.LogCaptureFixture
) -> None:
    door = plain_door
    caplog.set_level(logging.INFO, logger="troth")
    with Client(f"127.0.0.1:{door.port}", token=supplier) as client:
        worker = Worker(client, group="g", max_reconnect_backoff=30)
        worker.start()
        try:
            _wait_for(lambda: door.opens("Poll") == [OLD])
            _revoke_and_renew(door, supplier)
            _wait_for(lambda: door.opens("Poll") == [OLD, NEW])
        finally:
            worker.stop()
    assert "reconnecting with the client's new token" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert OLD not in caplog.text and NEW not in caplog.text


def test_a_worker_whose_poll_stream_is_refused_with_no_new_token_logs_an_error(
    plain_door: Door, supplier: Supplier, caplog: pytest.LogCaptureFixture
) -> None:
    door = plain_door
    caplog.set_level(logging.INFO, logger="troth")
    with Client(f"127.0.0.1:{door.port}", token=supplier) as client:
        worker = Worker(client, group="g", max_reconnect_backoff=0.2)
        worker.start()
        try:
            _wait_for(lambda: door.opens("Poll") == [OLD])
            door.accepted = set()
            # Refused again and again, slowly; a token renewed later is taken.
            _wait_for(lambda: len(door.opens("Poll")) >= 3)
            assert "was refused its task stream (UNAUTHENTICATED" in caplog.text
            supplier.token = NEW
            door.accepted = {NEW}
            _wait_for(lambda: door.opens("Poll")[-1] == NEW)
        finally:
            worker.stop()


def _wait_for(check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
