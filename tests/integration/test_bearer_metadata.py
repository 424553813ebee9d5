"""The bearer token goes with every call the SDK makes, unary and streaming: a Client's
reads, writes and watches, and everything a Worker on that client sends (its Poll
stream, heartbeats, step writes, task completions); and it is never printed.

The server does not check tokens yet (that is the auth interceptor's job), so a
recording relay sits between the SDK and a real server: it forwards every call's
bytes untouched and writes down each call's method and metadata.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc
import pytest
from _support import ServerProcess, eventually, start_server

from troth import Client, Context, Worker
from troth.v1 import promises_pb2, tasks_pb2

TOKEN = "relay-token-5b1e0c9d44aa"
BEARER = ("authorization", f"Bearer {TOKEN}")


@dataclass
class Relay:
    """A gRPC server forwarding raw bytes to `upstream`, recording (method, metadata)."""

    upstream: grpc.Channel
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handler(self) -> grpc.GenericRpcHandler:
        streaming = {
            f"/{service.full_name}/{method.name}": method.server_streaming
            for module in (promises_pb2, tasks_pb2)
            for service in module.DESCRIPTOR.services_by_name.values()
            for method in service.methods
        }
        relay = self

        class Handler(grpc.GenericRpcHandler):
            def service(
                self, details: grpc.HandlerCallDetails
            ) -> grpc.RpcMethodHandler[Any, Any] | None:
                method: str = details.method
                metadata = {k: str(v) for k, v in details.invocation_metadata}
                with relay.lock:
                    relay.calls.append((method, metadata))
                forward = tuple(metadata.items())
                if streaming.get(method):
                    return grpc.unary_stream_rpc_method_handler(relay._stream(method, forward))
                return grpc.unary_unary_rpc_method_handler(relay._unary(method, forward))

        return Handler()

    def _unary(
        self, method: str, metadata: tuple[tuple[str, str], ...]
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.upstream.unary_unary(method)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return call(request, metadata=metadata, timeout=context.time_remaining())
            except grpc.RpcError as exc:
                error: Any = exc
                context.abort(error.code(), error.details() or "")

        return forward

    def _stream(
        self, method: str, metadata: tuple[tuple[str, str], ...]
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        call: grpc.UnaryStreamMultiCallable[bytes, bytes] = self.upstream.unary_stream(method)

        def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            upstream: Any = call(request, metadata=metadata)
            context.add_callback(lambda: upstream.cancel() and None)
            try:
                yield from upstream
            except grpc.RpcError as exc:
                error: Any = exc
                if error.code() is not grpc.StatusCode.CANCELLED:
                    context.abort(error.code(), error.details() or "")

        return forward

    def methods(self) -> set[str]:
        with self.lock:
            return {method.rsplit("/", 1)[1] for method, _ in self.calls}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = start_server(tmp_path_factory.mktemp("bearer"))
    yield proc
    assert proc.stop() == 0, proc.log()[-3000:]


@pytest.fixture
def relay(real_server: ServerProcess) -> Iterator[tuple[Relay, str]]:
    upstream = grpc.insecure_channel(real_server.address)
    relay = Relay(upstream)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((relay.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield relay, f"127.0.0.1:{port}"
    server.stop(grace=None)
    upstream.close()


def slow_step(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def held(ctx: Context) -> Generator[Any, Any, str]:
    # Long enough under a 1 s lease that the worker heartbeats while it runs.
    result = yield ctx.run(slow_step, 1.5)
    approval = yield ctx.promise(timeout=timedelta(seconds=30))
    decision = yield approval
    return f"{result} {decision}"


def test_every_client_and_worker_call_carries_the_bearer_token(
    relay: tuple[Relay, str], caplog: pytest.LogCaptureFixture
) -> None:
    recorder, address = relay
    caplog.set_level(logging.DEBUG, logger="troth")
    run = f"bearer-{uuid.uuid4().hex[:8]}"
    with Client(address, token=TOKEN, principal="gateway-1") as client:
        client.create(f"{run}-p", {"x": 1})
        assert client.get(f"{run}-p").id == f"{run}-p"
        client.search(f"{run}-*")
        client.resolve(f"{run}-p", {"ok": True})
        assert client.wait(f"{run}-p", timeout=10).id == f"{run}-p"  # on the Calls stream
        watched = [p.id for p in client.watch(f"{run}-p", timeout=10)]  # a WatchPromise stream
        assert watched == [f"{run}-p"]

        worker = Worker(client, group=f"g-{run}", lease=timedelta(seconds=1))
        worker.workflow(held)
        worker.start()
        try:
            handle = client.start("held", id=f"{run}-wf", group=f"g-{run}")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    client.resolve(f"{run}-wf.1", "approved")
                    break
                except Exception:
                    time.sleep(0.05)
            assert handle.result(timeout=20) == "done approved"
        finally:
            worker.stop()

    called = recorder.methods()
    # The client's creates, reads and settles, and the worker's heartbeats, steps and
    # completions, travel on their Calls streams (one each), the rest as themselves.
    expected = {"WatchPromise", "Poll", "Calls"}
    assert expected <= called, expected - called
    with recorder.lock:
        assert sum(method.endswith("/Calls") for method, _ in recorder.calls) >= 2
    with recorder.lock:
        missing = [method for method, metadata in recorder.calls if BEARER not in metadata.items()]
        assert not missing, f"calls without the bearer token: {missing}"
        assert all(metadata.get("troth-principal") == "gateway-1" for _, metadata in recorder.calls)
    assert TOKEN not in caplog.text


def test_a_server_without_tls_files_says_it_serves_plaintext(real_server: ServerProcess) -> None:
    eventually(lambda: '"server.started"' in real_server.log(), what="the server.started line")
    started = next(line for line in real_server.log().splitlines() if "server.started" in line)
    assert json.loads(started)["tls"] == "off"
