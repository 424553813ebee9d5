"""A real server in this process: the composition root `Core` and its gRPC servicers
on an event loop of their own thread. For the tests that must see inside the server
(the statements it sends, the spans it makes); the others start it as a subprocess
(`_support.start_server`)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2_grpc

from troth.v1 import promises_pb2_grpc, tasks_pb2_grpc
from troth_server.api._admission import Admission
from troth_server.api._door import Door, DoorInterceptor
from troth_server.api._metrics import MetricsInterceptor
from troth_server.app import Core, grpc_options, servicers
from troth_server.config import settings_from
from troth_server.metrics import Metrics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@contextmanager
def in_process_server(
    db_url: str, *flags: str, clock: Callable[[], int] | None = None
) -> Iterator[tuple[str, int]]:
    """The server's `Core` and servicers on an event loop of their own, with metrics;
    yields its address and its metrics port. `clock`: the store clock every decision
    is made by (default: the server's own, as `troth serve` has it)."""
    settings = settings_from(
        [
            "--db",
            db_url,
            "--listen",
            "127.0.0.1:0",
            "--migrate",
            "--no-auth",
            "--sweep-interval",
            "100ms",
            "--metrics-listen",
            "127.0.0.1:0",
            *flags,
        ]
    )
    started: dict[str, Any] = {}
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        metrics = Metrics()
        core = Core(settings, clock=clock, metrics=metrics)
        # Authentication off, as `--no-auth` has it: every caller is the local developer.
        admission = Admission.with_limits(settings.max_concurrent_rpcs, settings.max_streams)
        door = Door(None, admission)
        server = grpc.aio.server(
            options=grpc_options(settings),
            interceptors=[MetricsInterceptor(metrics), DoorInterceptor(door)],
        )
        promises, tasks = servicers(core, settings.limits, door)
        promises_pb2_grpc.add_PromiseServiceServicer_to_server(promises, server)
        tasks_pb2_grpc.add_TaskServiceServicer_to_server(tasks, server)
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        core.start()
        await server.start()
        stop = asyncio.Event()
        started.update(port=port, stop=stop, metrics_port=metrics.port)
        ready.set()
        await stop.wait()
        core.service.stop_watches()
        core.dispatcher.end_streams()
        await server.stop(1)
        await asyncio.to_thread(core.stop)

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(30), "the in-process server did not start"
    try:
        yield f"127.0.0.1:{started['port']}", started["metrics_port"]
    finally:
        loop.call_soon_threadsafe(started["stop"].set)
        thread.join(30)
        loop.close()
