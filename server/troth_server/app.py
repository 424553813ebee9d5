"""Composition root: store -> committer -> service -> gRPC servicers, sweeper, health.

The gRPC server is grpc.aio (one event loop). A thread-pool server was offered
too until it lost every benchmark that could tell them apart (bench/README.md).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from troth._grpc_args import (
    ARG_ALLOW_REUSEPORT,
    ARG_MAX_RECEIVE_MESSAGE_LENGTH,
    ARG_MAX_SEND_MESSAGE_LENGTH,
    server_keepalive,
)
from troth.errors import ConfigurationError
from troth.v1 import promises_pb2, tasks_pb2
from troth_server import _logging
from troth_server import _tracing as tracing
from troth_server._tls import TlsError, TlsMode, TlsServerFiles, load_server_tls
from troth_server.api import _audit as audit
from troth_server.api._admission import Admission, OverloadReport, backlog_options
from troth_server.api._decode import register
from troth_server.api._door import Door, DoorInterceptor
from troth_server.api._metrics import MetricsInterceptor
from troth_server.api._mux import CallMux
from troth_server.api.promises import PromiseServiceServicer
from troth_server.api.tasks import TaskServiceServicer
from troth_server.auth import AuthConfigError, Authenticator, VerifierPool
from troth_server.checks import SchemaChecks
from troth_server.clock import (
    Anchor,
    ClockFile,
    DatabaseClock,
    GuardedClock,
    OutageGuard,
    SharedClock,
    WallClock,
    monotonic_ms,
)
from troth_server.config import Limits, Settings, auth_refusal, is_loopback, settings_from
from troth_server.console import ConsoleUnavailable, start_hosted
from troth_server.console import require as require_console
from troth_server.dispatch import Dispatcher
from troth_server.domain.settle_tokens import KeysInvalid
from troth_server.guard import SettleGuard
from troth_server.metrics import Metrics
from troth_server.schedules import Scheduler, ScheduleService
from troth_server.service import PromiseService
from troth_server.settle_keys import SettleKeys
from troth_server.store import (
    StoreError,
    StoreEvent,
    open_store,
    shared_clock_path,
    supervise_alone,
)
from troth_server.supervisor import ChildRole, supervise
from troth_server.sweeper import LeaseExpiry, Sweeper
from troth_server.task_service import TaskService
from troth_server.watch import WatchHub
from troth_server.workflows import WorkflowService
from troth_server.writes.group_commit import GroupCommitter

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.console import HostedConsole
    from troth_server.domain.task import Task
    from troth_server.store import Held, Store
    from troth_server.writes.batch import StateChange

log = structlog.get_logger("troth.server")

PROMISES = promises_pb2.DESCRIPTOR.services_by_name["PromiseService"]
TASKS = tasks_pb2.DESCRIPTOR.services_by_name["TaskService"]
PROMISES_SERVICE = PROMISES.full_name
TASKS_SERVICE = TASKS.full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
SERVED = (PROMISES_SERVICE, TASKS_SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME)


SERVER_PING_INTERVAL_MS = 60_000
"""How often the server pings its clients (so that it notices a worker whose host died)."""


def grpc_options(settings: Settings) -> list[tuple[str, Any]]:
    """The gRPC server's options, keys from `troth._grpc_args` (gRPC ignores a misspelt
    key without a word; a test checks every one against gRPC's own list)."""
    # Room for two maximal payloads plus framing, so that an oversized payload
    # reaches validation and gets INVALID_ARGUMENT naming the field.
    max_message = 2 * settings.limits.max_payload_bytes + 1_048_576
    return [
        # Several processes share the port (`--processes`): the kernel spreads new
        # connections over their sockets. One alone: a second server on its port fails.
        (ARG_ALLOW_REUSEPORT, 1 if settings.processes > 1 else 0),
        (ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_message),
        # A task carries its workflow's whole history (50k steps is about 8 MB);
        # the SDK accepts up to 64 MiB.
        (ARG_MAX_SEND_MESSAGE_LENGTH, max(max_message, 64 * 1_048_576)),
        # Clients ping every minute on long watches and idle task streams; accept
        # that (gRPC's default minimum, 5 min, answers such pings with strikes and
        # then GOAWAY "too_many_pings").
        *server_keepalive(settings.keepalive_min_ping_interval_ms, SERVER_PING_INTERVAL_MS),
        # Room in gRPC core's backlog of calls not yet picked up, which it would
        # otherwise answer CANCELLED past 1000: the admission gates answer instead.
        *backlog_options(settings.max_concurrent_rpcs, settings.max_streams),
    ]


def store_clock(
    store: Store, wall: Callable[[], int], shared_clock: str | None = None
) -> Callable[[], int]:
    """The clock every decision is made by (`troth_server.clock`): the database's own
    where it has one (PostgreSQL), else this server's, guarded against wall clock jumps
    and never behind the newest time stored; with several processes on one SQLite
    file, the one they share, kept in the file `shared_clock` (set by the supervisor)."""
    if store.database_time() is None:
        if shared_clock is not None:
            try:
                return SharedClock(ClockFile(shared_clock), wall)
            except (OSError, ValueError) as exc:
                raise StoreError(
                    f"cannot read the clock the server processes share ({shared_clock}): "
                    f"{exc}; start them with troth serve --processes N"
                ) from exc
        return GuardedClock(wall, floor=store.newest_time())

    def database_time() -> int:
        now = store.database_time()
        assert now is not None
        return now

    return DatabaseClock(database_time)


class Core:
    """Everything but gRPC: the store, its single writer, the service, the sweeper."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], int] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        """Where the components report what they do (`--metrics-listen`); None: off."""
        # Settle tokens: keys from --settle-token-keys (re-read when the file changes).
        # Read first: a bad file stops the start before anything is opened.
        keys = SettleKeys(settings.settle_token_keys) if settings.settle_token_keys else None
        self.store = open_store(
            settings.db,
            sqlite_synchronous=settings.sqlite_synchronous,
            migrate=settings.migrate,
            application_name=f"troth-server {settings.listen} pid {os.getpid()}",
            listen_url=settings.db_listen_url,
            transaction_pooling=settings.db_transaction_pooling,
            processes=settings.processes,
        )
        if clock is None:
            shared = shared_clock_path(settings.db) if settings.processes > 1 else None
            clock = store_clock(self.store, WallClock.from_env(), shared)
        self.clock = clock
        # Leases are not taken until one lease length after the start (§2 Lease).
        self.outages = OutageGuard(clock(), monotonic_ms(), interval_ms=settings.sweep_interval_ms)
        self.committer = GroupCommitter(
            self.store,
            clock,
            on_commit=self._on_commit,
            max_batch=settings.commit_max_batch,
            on_pending_tasks=lambda groups: self.dispatcher.wake(groups),
            on_store_error=self.outages.store_failed,
            max_queued=settings.max_queued_writes,
            on_batch=None if metrics is None else metrics.commit,
            tracing=tracing,
        )
        # Schema checks run on their own small pool: off the writer, off the loop.
        self.checks = SchemaChecks(settings.limits.schema_bounds())
        guard = SettleGuard(self.store, self.committer, clock, keys)
        self.service = PromiseService(
            self.store, self.committer, WatchHub(), clock, self.checks, guard
        )
        self.tasks = TaskService(self.store, self.committer, clock, self.checks)
        self.workflows = WorkflowService(self.store, self.committer, clock, self.service.decided)
        self.dispatcher = Dispatcher(self.tasks, self.store)
        # A task created while a worker of its group has room is leased in the
        # transaction that creates it, and delivered with no claim of its own.
        self.committer.lease_on_commit(self.dispatcher)
        self.sweeper = Sweeper(
            self.service,
            interval=settings.sweep_interval_ms / 1000,
            batch_size=settings.sweep_batch,
            on_tick=self._tick,
            others_waiting=self.committer.busy,
            on_store_error=self.outages.store_failed,
            retention_ms=settings.retention_ms,
            forget_completed=self.tasks.forget_completed,
            on_pass=None if metrics is None else metrics.sweep,
            leases=LeaseExpiry(
                self.committer,
                # Back from being away (frozen, or cut off from the store)? Then workers
                # could not heartbeat: no lease is taken for one lease length from then.
                # Asked inside the sweep's transaction, at its time.
                came_back=self._came_back,
                on_expired=self.dispatcher.stall,
                on_lost=self._lost,
            ),
        )
        # Schedules: a firing pass on the sweeper's beat, in a thread of its own.
        self.schedules = ScheduleService(
            self.store,
            self.committer,
            clock,
            min(settings.limits.default_workflow_ttl_ms, settings.limits.max_ttl_ms),
        )
        self.scheduler = Scheduler(
            self.schedules,
            interval=settings.sweep_interval_ms / 1000,
            on_store_error=self.outages.store_failed,
        )
        if metrics is not None:
            live = metrics.live
            live.streams = self.dispatcher.streams
            live.live_counts = self.store.live_counts
            live.queued_writes = lambda: self.committer.queued
            live.absent_versions = self.dispatcher.absent_versions

    def _on_commit(self, changes: list[StateChange]) -> None:
        self.service.on_commit(changes)
        if self.metrics is not None:
            self.metrics.changes(changes)

    def _lost(self, lost: list[Task]) -> None:
        """Tasks the sweeper gave back (their lease ran out), after the commit."""
        if self.metrics is not None:
            self.metrics.lost(lost)
        self.dispatcher.lost(lost)

    def _tick(self) -> None:
        # The fallbacks: a missed wake-up (or announcement from another replica)
        # only delays a task or a watcher by one tick, never loses it.
        self.dispatcher.wake_all()
        if self.store.shared:
            self.dispatcher.reconcile()
            self.service.on_remote_settled(None)

    def _came_back(self, now: int) -> int:
        return self.outages.tick(now, monotonic_ms())

    def _on_store_event(self, event: StoreEvent) -> None:
        """Another replica committed: wake what waits here for it."""
        self.service.on_remote_changes(event)
        if event.resync:
            self.dispatcher.wake_all()
            self.service.on_remote_settled(None)
            return
        if event.groups:
            self.dispatcher.wake(event.groups)
        if event.settled_ids:
            self.service.on_remote_settled(event.settled_ids)

    def start(self) -> None:
        """Start the threads; with metrics, serve them (OSError: their address is taken)."""
        if self.metrics is not None and self.settings.metrics_listen is not None:
            self.metrics.serve(self.settings.metrics_listen)
        self.checks.start()
        self.committer.start()
        self.dispatcher.start()
        self.sweeper.start()
        self.scheduler.start()
        self.store.listen(self._on_store_event)

    def stop(self) -> None:
        """After the gRPC server stopped: queued writes commit, then the store closes."""
        self.scheduler.stop()
        self.sweeper.stop()
        self.dispatcher.stop()
        self.committer.stop()
        self.checks.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self.store.close()
        self.log_stats()

    def log_stats(self) -> None:
        stats = self.committer.stats
        log.info(
            "stats",
            commits=stats.commits,
            requests=stats.requests,
            largest_batch=stats.largest_batch,
        )
        _logging.flush()


def _listen_error(settings: Settings, cause: BaseException | None) -> StoreError:
    return StoreError(
        f"cannot listen on {settings.listen}: the address is in use or invalid; "
        "pick another with --listen HOST:PORT"
    )


def _bind(server: grpc.aio.Server, settings: Settings, tls: TlsServerFiles | None) -> int:
    try:
        if tls is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, tls.credentials())
    except RuntimeError as exc:
        raise _listen_error(settings, exc) from exc
    if not port:
        raise _listen_error(settings, None)
    return port


def _log_started(
    settings: Settings,
    port: int,
    authenticator: Authenticator | None,
    tls: TlsServerFiles | None,
    metrics: Metrics | None = None,
    console: HostedConsole | None = None,
) -> None:
    """The first line (after a no-auth warning): where gRPC, the console and the metrics
    are served, or the flag that turns each on."""
    from sqlalchemy.engine import make_url

    log.info(
        "server.started",
        grpc=_bound(settings.listen, port),
        console=console.url if console is not None else CONSOLE_OFF,
        metrics=_metrics_url(settings, metrics),
        listen=settings.listen,
        port=port,
        metrics_port=None if metrics is None else metrics.port,
        db=make_url(settings.db).render_as_string(hide_password=True),
        auth=_auth_mode(authenticator),
        tls=(tls.mode if tls is not None else TlsMode.OFF).value,
    )


CONSOLE_OFF = "off (--console-listen 127.0.0.1:7080 serves the web console)"
METRICS_OFF = "off (--metrics-listen 127.0.0.1:9464 serves /metrics)"


def _bound(listen: str, port: int) -> str:
    """`listen` with the port bound (port 0 picks one)."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return listen
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def _metrics_url(settings: Settings, metrics: Metrics | None) -> str:
    if metrics is None or settings.metrics_listen is None or metrics.port is None:
        return METRICS_OFF
    host = settings.metrics_listen.rsplit(":", 1)[0]
    return f"http://{host}:{metrics.port}/metrics"


_WILDCARDS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "::": "[::1]", "": "127.0.0.1"}


def own_address(listen: str, port: int) -> str:
    """Where a client in this process reaches the gRPC server bound on `listen`: its
    loopback address when it listens on every interface, else the address itself."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return listen
    host = listen.rsplit(":", 1)[0]
    return f"{_WILDCARDS.get(host, host)}:{port}"


def _start_console(settings: Settings, port: int) -> HostedConsole | None:
    """`--console-listen`: the console on a thread of its own, a client of `port`.

    Raises:
        StoreError: Its address cannot be bound, or TROTH_TOKEN is set.
    """
    if settings.console_listen is None:
        return None
    if not is_loopback(settings.console_listen):
        log.warning(
            "console.plain_http",
            message=f"the console serves plain HTTP on {settings.console_listen}, off "
            "loopback: the tokens people sign in with cross the network in the clear; "
            "put it behind an HTTPS proxy, or serve it on 127.0.0.1",
        )
    try:
        return start_hosted(settings.console_listen, own_address(settings.listen, port))
    except OSError as exc:
        raise StoreError(
            f"cannot serve the console on {settings.console_listen}: {exc.strerror or exc}; "
            "pick another address with --console-listen HOST:PORT"
        ) from exc
    except ConfigurationError as exc:
        raise StoreError(f"cannot serve the console: {exc}") from exc


def _auth_mode(authenticator: Authenticator | None) -> str:
    if authenticator is None:
        return "off"
    sources = authenticator.sources
    modes = (["tokens"] if sources.tokens_file else []) + (["jwt"] if sources.uses_jwt else [])
    return "+".join(modes)


def _warn_no_auth(settings: Settings) -> None:
    """Every start without authentication says so, first (`make run` shows it)."""
    if settings.allow_public_without_auth and not is_loopback(settings.listen):
        log.warning(
            "auth.off",
            message=f"authentication is off on {settings.listen}, a PUBLIC address "
            "(--no-auth --allow-public-without-auth): anyone who reaches it may settle, "
            "cancel and forge every workflow",
        )
        return
    log.warning(
        "auth.off",
        message="authentication is off (--no-auth): every caller may do everything; "
        "for local development only",
    )


def _authenticator(settings: Settings) -> Authenticator | None:
    sources = settings.auth_sources()
    return None if sources is None else Authenticator(sources)


def _reload_auth(authenticator: Authenticator, door: Door) -> None:
    """SIGHUP: re-read the token file and JWT keys (a file that fails keeps its old
    table); the door checks every open stream against them at once."""
    errors = authenticator.reload()
    door.reloaded()
    for error in errors:
        log.error("auth.reload_failed", error=error, kept="the previous table")
    if not errors:
        log.info("auth.reloaded", tokens=authenticator.token_count)


def _write_port_file(settings: Settings, port: int) -> None:
    if settings.port_file:
        tmp = Path(settings.port_file + ".tmp")
        tmp.write_text(str(port))
        os.replace(tmp, settings.port_file)


def serve(argv: list[str]) -> int:
    """`troth serve`: run until SIGTERM or SIGINT; SIGUSR1 logs commit statistics,
    SIGHUP reloads the token file and JWT keys."""
    settings = settings_from(argv)
    role = ChildRole.from_env()  # one of several processes (`--processes`)?
    if role is not None:
        settings = role.apply(settings)
    supervising = role is None and settings.processes > 1
    refusal = auth_refusal(settings)
    if refusal is not None:
        print(f"troth serve: error: {refusal}", file=sys.stderr)
        return 2
    which = "supervisor" if supervising else None if role is None else role.index
    _logging.configure(settings.log_level, settings.log_format, which)
    if settings.console_listen is not None:
        try:
            require_console()  # before anything is opened
        except ConsoleUnavailable as exc:
            print(f"troth serve: error: {exc}", file=sys.stderr)
            return 2
    if settings.no_auth and (role is None or role.index == 0):
        _warn_no_auth(settings)
    if supervising:
        try:
            alone = _prepare_processes(settings)
        except (StoreError, AuthConfigError, TlsError, KeysInvalid) as exc:
            log.error("server.cannot_start", error=str(exc))
            _logging.flush()
            return 1
        try:
            return supervise(settings, argv, () if alone is None else (alone.fileno(),))
        finally:
            if alone is not None:
                alone.close()
    if role is not None:
        role.die_with_supervisor()
    try:
        exporting = tracing.configure_exporter(settings.otlp_endpoint)
    except tracing.TracingUnavailable as exc:
        print(f"troth serve: error: {exc}", file=sys.stderr)
        return 2
    if exporting is not None:
        log.info("server.tracing", exporter=exporting)
    try:
        code = asyncio.run(_serve_aio(settings))
        # Stopped cleanly: a repeated SIGTERM or Ctrl-C must not turn the exit into
        # a death by signal while the interpreter winds down.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Everything is written and closed: the interpreter's collections at exit need
        # not walk this process's objects (they took 0.2-0.5 s of every stop).
        gc.freeze()
        return code
    except (StoreError, AuthConfigError, TlsError, KeysInvalid) as exc:
        log.error("server.cannot_start", error=str(exc))
        _logging.flush()
        return 1


def _prepare_processes(settings: Settings) -> Held | None:
    """Before the supervisor starts any child: every file the children will read is
    checked, the store opened once (SQLite migrated, PostgreSQL's schema checked), and
    on SQLite the clock they share set: at the wall clock, never behind the newest
    time stored (`clock.SharedClock`). On SQLite, the file is the supervisor's alone
    until the lock returned is closed.

    Raises:
        StoreError, AuthConfigError, TlsError, KeysInvalid: what a child would fail on.
    """
    _authenticator(settings)
    load_server_tls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    if settings.settle_token_keys:
        SettleKeys(settings.settle_token_keys)
    alone = supervise_alone(settings.db)  # SQLite: no other server on the file, from now on
    try:
        _open_once(settings)
    except BaseException:
        if alone is not None:
            alone.close()
        raise
    return alone


def _open_once(settings: Settings) -> None:
    store = open_store(
        settings.db,
        sqlite_synchronous=settings.sqlite_synchronous,
        migrate=settings.migrate,
        application_name=f"troth-server {settings.listen} supervisor pid {os.getpid()}",
        listen_url=settings.db_listen_url,
        transaction_pooling=settings.db_transaction_pooling,
        processes=settings.processes,
    )
    try:
        path = shared_clock_path(settings.db)
        if path is not None:
            wall = WallClock.from_env()
            ClockFile.create(path, Anchor.start(monotonic_ms(), wall(), store.newest_time()))
    finally:
        store.close()


async def _serve_aio(settings: Settings) -> int:
    authenticator = _authenticator(settings)  # before the store: a bad file opens nothing
    # A credential not seen before is verified on a small bounded pool of its own,
    # never on the loop's default executor (which the searches use): the door's
    # `await verifier.verify(token)`.
    verifier = None if authenticator is None else VerifierPool(authenticator)
    # Before the store opens: a bad certificate path stops the start with nothing to undo.
    tls = load_server_tls(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    metrics = Metrics() if settings.metrics_listen is not None else None
    core = Core(settings, metrics=metrics)
    admission = Admission.with_limits(
        settings.max_concurrent_rpcs, settings.max_streams, settings.max_queue_delay_ms
    )
    # Every call on every road passes the one door: admitted first (a refused flood
    # costs no authentication), then authenticated, authorized and recorded.
    door = Door(authenticator, admission, verify=None if verifier is None else verifier.verify)
    interceptors: list[grpc.aio.ServerInterceptor] = [DoorInterceptor(door)]
    if metrics is not None:
        # Outermost: every call counts with the code its caller saw.
        interceptors.insert(0, MetricsInterceptor(metrics))
        admission.on_refused = metrics.refused
        audit.count_auth_refusals(metrics.auth_refused)
        metrics.live.in_flight = lambda: {
            "unary": admission.unary.in_use,
            "stream": admission.streams.in_use,
        }
    overload = OverloadReport(
        admission,
        queued_writes=lambda: core.committer.queued,
        queue_limit=settings.max_queued_writes,
    )
    server = grpc.aio.server(
        options=grpc_options(settings),
        interceptors=interceptors,
    )
    health_servicer = health.aio.HealthServicer()
    # Not the generated add_*Servicer_to_server: their deserializers raise on bytes
    # that do not decode, which grpc answers UNKNOWN (api/_decode.py).
    limits = settings.limits
    promises, tasks = servicers(core, limits, door)
    register(server, PROMISES, promises, limits)
    register(server, TASKS, tasks, limits)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(SERVED, server)
    try:
        port = _bind(server, settings, tls)
    except StoreError:
        core.store.close()
        raise
    try:
        console = _start_console(settings, port)
    except StoreError:
        core.store.close()
        raise
    try:
        core.start()
    except OSError as exc:
        if console is not None:
            await asyncio.to_thread(console.stop)
        core.store.close()
        raise StoreError(
            f"cannot serve metrics on {settings.metrics_listen}: {exc.strerror or exc}; "
            "pick another address with --metrics-listen HOST:PORT"
        ) from exc
    overload.start()
    door.start()
    await server.start()
    for name in ("", PROMISES_SERVICE, TASKS_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _log_started(settings, port, authenticator, tls, metrics, console)
    _logging.flush()  # where it serves, at once (the port file follows)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _aio_stop, stop, signum)
    loop.add_signal_handler(signal.SIGUSR1, _log_stats, core, overload)
    if authenticator is not None:
        loop.add_signal_handler(signal.SIGHUP, _reload_auth, authenticator, door)
    if settings.metrics_port_file and metrics is not None and metrics.port is not None:
        # Before the port file, which tells the supervisor this child serves.
        Path(settings.metrics_port_file).write_text(str(metrics.port))
    _write_port_file(settings, port)
    await stop.wait()

    log.info("server.stopping")
    if console is not None:
        # First, while the server still answers the calls its pages are making.
        await asyncio.to_thread(console.stop)
    await health_servicer.enter_graceful_shutdown()
    core.service.stop_watches()
    core.dispatcher.end_streams()
    await server.stop(settings.shutdown_grace_ms / 1000)
    await door.stop()
    if verifier is not None:
        verifier.stop()
    await overload.stop()
    # The writer answers its last batch through this loop: stop it from a thread.
    await asyncio.to_thread(core.stop)
    log.info("server.stopped")
    _logging.flush()
    return 0


def servicers(
    core: Core, limits: Limits, door: Door
) -> tuple[PromiseServiceServicer, TaskServiceServicer]:
    """Both services' servicers over `core`, the `Calls` stream serving their unary
    methods (each call through `door`, as its unary RPC would be, and in the metrics
    as the RPC it is)."""
    promises = PromiseServiceServicer(core.service, limits)
    tasks = TaskServiceServicer(core.tasks, core.dispatcher, limits, core.workflows)
    tasks.schedules = core.schedules
    promises.workflow_waits = tasks
    tasks.mux = CallMux(
        ((PROMISES, promises), (TASKS, tasks)),
        limits,
        door,
        on_call=None if core.metrics is None else core.metrics.rpc,
    )
    return promises, tasks


def _log_stats(core: Core, overload: OverloadReport) -> None:
    overload.report(always=True)
    core.log_stats()


def _aio_stop(stop: asyncio.Event, signum: int) -> None:
    log.info("server.signal", signal=signal.Signals(signum).name)
    stop.set()
