"""A trivial ``troth.v1.PromiseService`` server: the gRPC ceiling for ``bench/promises.py``.

CreatePromise and ResolvePromise answer with a Promise built from the request
(same id, state PENDING or RESOLVED, the param or value echoed back) and store
nothing. Everything else is left unimplemented. The server is built with the
same grpcio settings as the troth server (the constants below), in one of two
variants: the thread-pool server (``--mode sync``) or ``grpc.aio`` (``--mode aio``).

Run by the benchmark as a subprocess::

    python bench/_echo.py --mode sync --listen 127.0.0.1:0 --port-file /tmp/x/port

It writes the bound port to ``--port-file`` once it is serving, answers the
standard health check with SERVING, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from troth._grpc_args import (
    ARG_ALLOW_REUSEPORT,
    ARG_MAX_RECEIVE_MESSAGE_LENGTH,
    ARG_MAX_SEND_MESSAGE_LENGTH,
    PERMITTED_PING_INTERVAL_MS,
    server_keepalive,
)
from troth.v1 import promises_pb2, promises_pb2_grpc, types_pb2

# Keep these aligned with the troth server's own gRPC server (server/troth_server/
# app.py `grpc_options` and config.py defaults: 1 MiB payload limit, 128 workers).
_MAX_MESSAGE = 2 * 1_048_576 + 1_048_576
SERVER_OPTIONS: list[tuple[str, int | str]] = [
    (ARG_ALLOW_REUSEPORT, 0),
    (ARG_MAX_RECEIVE_MESSAGE_LENGTH, _MAX_MESSAGE),
    (ARG_MAX_SEND_MESSAGE_LENGTH, _MAX_MESSAGE),
    *server_keepalive(PERMITTED_PING_INTERVAL_MS, 60_000),
]
SYNC_MAX_WORKERS = 128
STOP_GRACE_S = 1.0


# The generated gRPC module is untyped; calls go through Any.
add_servicer: Any = promises_pb2_grpc.add_PromiseServiceServicer_to_server


def _create_response(
    request: promises_pb2.CreatePromiseRequest,
) -> promises_pb2.CreatePromiseResponse:
    return promises_pb2.CreatePromiseResponse(
        promise=types_pb2.Promise(
            id=request.id, state=types_pb2.PROMISE_STATE_PENDING, param=request.param
        ),
        created=True,
    )


def _resolve_response(
    request: promises_pb2.ResolvePromiseRequest,
) -> promises_pb2.ResolvePromiseResponse:
    return promises_pb2.ResolvePromiseResponse(
        promise=types_pb2.Promise(
            id=request.id, state=types_pb2.PROMISE_STATE_RESOLVED, value=request.value
        ),
        applied=True,
    )


class SyncEchoServicer(promises_pb2_grpc.PromiseServiceServicer):
    def CreatePromise(
        self, request: promises_pb2.CreatePromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.CreatePromiseResponse:
        return _create_response(request)

    def ResolvePromise(
        self, request: promises_pb2.ResolvePromiseRequest, context: grpc.ServicerContext
    ) -> promises_pb2.ResolvePromiseResponse:
        return _resolve_response(request)


class AioEchoServicer(promises_pb2_grpc.PromiseServiceServicer):
    async def CreatePromise(
        self,
        request: promises_pb2.CreatePromiseRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> promises_pb2.CreatePromiseResponse:
        return _create_response(request)

    async def ResolvePromise(
        self,
        request: promises_pb2.ResolvePromiseRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> promises_pb2.ResolvePromiseResponse:
        return _resolve_response(request)


def write_port_file(path: Path, port: int) -> None:
    """Write atomically, so a reader never sees a half-written port."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def _health() -> health.HealthServicer:
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("troth.v1.PromiseService", health_pb2.HealthCheckResponse.SERVING)
    return servicer


def serve_sync(listen: str, port_file: Path | None) -> None:
    server = grpc.server(ThreadPoolExecutor(max_workers=SYNC_MAX_WORKERS), options=SERVER_OPTIONS)
    add_servicer(SyncEchoServicer(), server)
    health_pb2_grpc.add_HealthServicer_to_server(_health(), server)
    port = server.add_insecure_port(listen)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    if port_file is not None:
        write_port_file(port_file, port)
    stop.wait()
    server.stop(STOP_GRACE_S).wait()


async def serve_aio(listen: str, port_file: Path | None) -> None:
    server = grpc.aio.server(options=SERVER_OPTIONS)
    add_servicer(AioEchoServicer(), server)
    health_pb2_grpc.add_HealthServicer_to_server(_health(), server)
    port = server.add_insecure_port(listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    if port_file is not None:
        write_port_file(port_file, port)
    await stop.wait()
    await server.stop(STOP_GRACE_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mode", choices=["sync", "aio"], default="sync")
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--port-file", type=Path)
    args = parser.parse_args()
    if args.mode == "sync":
        serve_sync(args.listen, args.port_file)
    else:
        asyncio.run(serve_aio(args.listen, args.port_file))


if __name__ == "__main__":
    main()
