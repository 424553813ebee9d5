"""Composition root: store -> committer -> service -> gRPC servicers, sweeper, health."""

from __future__ import annotations

import os
import signal
import threading
from concurrent import futures
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from troth.v1 import promises_pb2, promises_pb2_grpc
from troth_server import _logging
from troth_server.api.promises import PromisesServicer
from troth_server.config import Settings, settings_from
from troth_server.group_commit import GroupCommitter, wall_clock_ms
from troth_server.service import PromiseService
from troth_server.store import StoreError, open_store
from troth_server.sweeper import Sweeper
from troth_server.watch import WatchHub

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

log = structlog.get_logger("troth.server")

PROMISES_SERVICE = promises_pb2.DESCRIPTOR.services_by_name["Promises"].full_name


def grpc_options(settings: Settings) -> list[tuple[str, int]]:
    # Room for two maximal payloads plus framing, so that an oversized payload
    # reaches validation and gets INVALID_ARGUMENT naming the field.
    max_message = 2 * settings.limits.max_payload_bytes + 1_048_576
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_send_message_length", max_message),
        ("grpc.keepalive_time_ms", 60_000),
        # Clients ping every 60 s on long watches; accept that instead of the
        # default 5 min, which answers such pings with "too_many_pings".
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


class Server:
    """A running troth server; `start()` binds, `stop()` shuts down in order."""

    def __init__(self, settings: Settings, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.settings = settings
        self.store = open_store(settings.db, sqlite_synchronous=settings.sqlite_synchronous)
        hub = WatchHub()
        self.committer = GroupCommitter(
            self.store,
            clock,
            on_commit=lambda changes: self.service.on_commit(changes),
            max_batch=settings.commit_max_batch,
        )
        self.service = PromiseService(self.store, self.committer, hub, clock)
        self.sweeper = Sweeper(
            self.service,
            interval=settings.sweep_interval_ms / 1000,
            batch_size=settings.sweep_batch,
        )
        self.health = health.HealthServicer(
            experimental_non_blocking=True,
            experimental_thread_pool=futures.ThreadPoolExecutor(max_workers=1),
        )
        self.grpc = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=settings.grpc_workers, thread_name_prefix="troth-rpc"
            ),
            options=grpc_options(settings),
        )
        promises_pb2_grpc.add_PromisesServicer_to_server(
            PromisesServicer(self.service, settings.limits), self.grpc
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            [
                PROMISES_SERVICE,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.grpc,
        )
        self.port = 0

    def start(self) -> int:
        cause: RuntimeError | None = None
        try:
            self.port = self.grpc.add_insecure_port(self.settings.listen)
        except RuntimeError as exc:
            self.port = 0
            cause = exc
        if not self.port:
            self.store.close()
            raise StoreError(
                f"cannot listen on {self.settings.listen}: the address is in use or invalid; "
                "pick another with --listen HOST:PORT"
            ) from cause
        self.committer.start()
        self.sweeper.start()
        self.grpc.start()
        for name in ("", PROMISES_SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "server.started",
            listen=self.settings.listen,
            port=self.port,
            db=_safe(self.settings.db),
        )
        return self.port

    def stop(self) -> None:
        log.info("server.stopping")
        self.health.enter_graceful_shutdown()
        self.service.stop_watches()
        self.grpc.stop(self.settings.shutdown_grace_ms / 1000).wait()
        self.sweeper.stop()
        self.committer.stop()
        self.store.close()
        self.log_stats()
        log.info("server.stopped")

    def log_stats(self) -> None:
        stats = self.committer.stats
        log.info(
            "stats",
            commits=stats.commits,
            requests=stats.requests,
            largest_batch=stats.largest_batch,
        )


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def serve(argv: list[str]) -> int:
    """`troth serve`: run until SIGTERM or SIGINT; SIGUSR1 logs commit statistics."""
    settings = settings_from(argv)
    _logging.configure(settings.log_level, settings.log_format)
    try:
        server = Server(settings)
        port = server.start()
    except StoreError as exc:
        log.error("server.cannot_start", error=str(exc))
        return 1
    if settings.port_file:
        tmp = Path(settings.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, settings.port_file)
    stop = threading.Event()

    def _on_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("server.signal", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, _on_stop)
    signal.signal(signal.SIGUSR1, lambda _s, _f: server.log_stats())
    stop.wait()
    server.stop()
    return 0
