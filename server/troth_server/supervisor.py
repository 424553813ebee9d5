"""`troth serve --processes N`: N server processes on one listen port and one store.

One Python process tops out near one core (its interpreter lock); several use
several. The supervisor (this module, in the process `troth serve` started):

- checks the configuration once, before any child starts (the settings, auth files,
  TLS files, settle keys, the console's dependencies), and opens the store once:
  it migrates SQLite (so that children never race to), checks PostgreSQL's schema,
  and on SQLite sets the clock every child reads (`clock.SharedClock`);
- starts child 0 on `--listen`; when that is port 0, the port child 0 bound is the
  one every other child binds. gRPC sets SO_REUSEPORT on the children's socket
  (`ARG_ALLOW_REUSEPORT`), so the kernel spreads new connections over them. A port
  shared so would take in another server's processes just as well (a second
  `troth serve --processes N` started on it, perhaps on a store of its own): before
  any child starts, the supervisor takes this machine's lock on the port for its
  lifetime and checks that nothing listens on it (`claim_port`), and refuses to
  start if either fails;
- writes `--port-file` once every child serves;
- forwards SIGTERM and SIGINT (a graceful stop of each), SIGHUP (reload) and SIGUSR1
  (statistics) to every child; exits once all have stopped;
- restarts a child that died, after a backoff that doubles while it keeps dying
  before it serves, and gives up (stopping the others, exiting 1) when one died
  `GIVE_UP_AFTER` times in a row without serving: a fault that a restart does not
  mend (the address taken, the database gone) is not hidden by restarting forever.

Child 0 serves the console (`--console-listen`). The metrics are served once, by the
supervisor on `--metrics-listen`: each scrape gathers every child's (each serves its
own on a loopback port of its own), every series labelled with its `process`, and
`troth_process_up` says which answered (`ChildMetrics`), so that none is hidden;
`docs/operations.md` says how to read them.

A child learns its part from `CHILD_ENV` (`ChildRole`), set only here, and dies
with the supervisor (PR_SET_PDEATHSIG: SIGTERM) if that is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from troth_server import _logging
from troth_server.config import split_listen

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence

    from troth_server.config import Settings

log = structlog.get_logger("troth.supervisor")

CHILD_ENV = "TROTH_SERVE_CHILD"
"""Set by the supervisor for each child: its `ChildRole` as JSON (never by hand)."""
GIVE_UP_AFTER = 5
"""A child that died this many times in a row before serving ends the supervisor."""
BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""The delays before restarting a child that died, by how many times in a row."""
STOP_EXTRA_S = 10.0
"""How long past `--shutdown-grace` a child may take to stop before it is killed."""
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildRole:
    """What the supervisor tells child `index` of `count`, over its own settings."""

    index: int
    count: int
    supervisor: int
    """The supervisor's pid (the child dies with it)."""
    listen: str
    port_file: str
    metrics_listen: str | None
    console: bool
    metrics_port_file: str | None = None
    """Where the child writes the port of its metrics (before its port file)."""

    def to_env(self) -> str:
        return orjson.dumps(self.__dict__).decode()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ChildRole | None:
        raw = environ.get(CHILD_ENV)
        return None if not raw else cls(**orjson.loads(raw))

    def apply(self, settings: Settings) -> Settings:
        """The settings this child serves with."""
        return replace(
            settings,
            processes=self.count,
            listen=self.listen,
            port_file=self.port_file,
            metrics_listen=self.metrics_listen,
            metrics_port_file=self.metrics_port_file,
            console_listen=settings.console_listen if self.console else None,
        )

    def die_with_supervisor(self) -> None:
        """Linux: SIGTERM this child when the supervisor dies (SIGKILL included)."""
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self.supervisor:  # it died before the line above
            os.kill(os.getpid(), signal.SIGTERM)


CHILD_METRICS = "127.0.0.1:0"
"""Where each child serves its metrics, for the supervisor to gather."""


class ChildMetrics(Collector):
    """Every child's metrics, gathered when the supervisor's `/metrics` is scraped:
    each sample labelled with its child's `process` (index), and `troth_process_up`
    1 for each child that answered, 0 for one that did not (dead, restarting)."""

    def __init__(self, ports: Callable[[], list[tuple[int, int | None]]]) -> None:
        self._ports = ports

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        up = GaugeMetricFamily(
            "troth_process_up",
            "1 if this server process answered this scrape, 0 if not (--processes)",
            labels=["process"],
        )
        for index, port in self._ports():
            text = None if port is None else _scrape(port)
            up.add_metric([str(index)], 0.0 if text is None else 1.0)
            for family in text_string_to_metric_families(text or ""):
                merged = families.get(family.name)
                if merged is None:
                    merged = Metric(family.name, family.documentation, family.type, family.unit)
                    families[family.name] = merged
                merged.samples.extend(
                    sample._replace(labels={**sample.labels, "process": str(index)})
                    for sample in family.samples
                )
        yield from families.values()
        yield up


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text: str = reply.read().decode()
            return text
    except (OSError, ValueError):
        return None


def restart_delay(deaths_before_serving: int) -> float | None:
    """How long to wait before restarting a child that died, given how many times in a
    row it died before it served (0: it had served); None: give up. Pure."""
    if deaths_before_serving >= GIVE_UP_AFTER:
        return None
    return BACKOFF_S[min(deaths_before_serving, len(BACKOFF_S) - 1)]


def resolved_listen(listen: str, port: int) -> str:
    """`listen` with the port child 0 bound (port 0 picks one)."""
    return f"{listen.rsplit(':', 1)[0]}:{port}"


def claim_port(listen: str) -> tuple[int | None, str | None]:
    """Claim `listen`'s port for one server's processes: (a descriptor holding this
    machine's lock on the port, to keep open while they serve, or None; why the port
    cannot be had, or None). Port 0 (each start picks a free one) needs no claim.

    The lock (`flock` on a file named by the port and the user, in the temporary
    directory: SO_REUSEPORT shares a port only between one user's sockets) keeps two
    supervisors starting at once from both passing the check; the check (a bind
    without SO_REUSEPORT, which fails while any socket listens on the port) finds a
    server already there, troth or not. Where the lock file cannot be opened (another
    user's, say), the check runs alone."""
    host, port = split_listen(listen)
    if port == 0:
        return None, None
    lock: int | None = None
    path = Path(tempfile.gettempdir()) / f"troth-port-{port}-uid{os.getuid()}.lock"
    with contextlib.suppress(OSError):
        lock = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if lock is not None:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            return None, (
                f"cannot listen on {listen}: the port is in use by another troth server "
                f"starting or serving on it (it holds {path}); stop it, or pick another "
                "port with --listen HOST:PORT"
            )
    if _listened_on(host, port):
        if lock is not None:
            os.close(lock)
        return None, (
            f"cannot listen on {listen}: the address is in use: another server listens "
            "on that port, whose processes would share it with these; stop it, or pick "
            "another port with --listen HOST:PORT"
        )
    return lock, None


def _listened_on(host: str, port: int) -> bool:
    """Whether a socket cannot bind `host:port` without SO_REUSEPORT because something
    listens there (on any address the host names: gRPC binds them all). An address
    this machine cannot bind for another reason (a host it cannot resolve, a family it
    lacks) is left to gRPC's own bind, which says so."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return False
    for family, kind, proto, _name, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                # As gRPC sets it: a connection of the last server in TIME_WAIT is no listener.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
    return False


@dataclass
class _Child:
    index: int
    port_file: Path
    metrics_port_file: Path
    metrics_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    serving: bool = False
    failures: int = 0
    """Deaths in a row before serving."""
    restart_at: float | None = None


class Supervisor:
    """The processes of one `troth serve --processes N`, from their start to their stop
    (`run`); each child's port file, in a directory of its own, says it serves."""

    def __init__(
        self, settings: Settings, argv: Sequence[str], inherited: Sequence[int] = ()
    ) -> None:
        self.settings = settings
        self._argv = list(argv)
        self._inherited = tuple(inherited)
        self._dir = Path(tempfile.mkdtemp(prefix="troth-serve-"))
        self._children = [
            _Child(i, self._dir / f"port-{i}", self._dir / f"metrics-{i}")
            for i in range(settings.processes)
        ]
        self._metrics: tuple[Any, threading.Thread] | None = None
        self._listen = settings.listen
        self._port: int | None = None

    def _spawn(self, child: _Child) -> None:
        for stale in (child.port_file, child.metrics_port_file):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        child.metrics_port = None
        role = ChildRole(
            index=child.index,
            count=len(self._children),
            supervisor=os.getpid(),
            listen=self._listen,
            port_file=str(child.port_file),
            metrics_listen=CHILD_METRICS if self.settings.metrics_listen else None,
            console=child.index == 0,
            metrics_port_file=str(child.metrics_port_file),
        )
        _logging.flush()
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "troth_server", "serve", *self._argv],
            env={**os.environ, CHILD_ENV: role.to_env()},
            pass_fds=self._inherited,
        )
        child.serving = False
        child.restart_at = None
        log.info("supervisor.child_started", child=child.index, child_pid=child.proc.pid)

    def _check_serving(self, child: _Child) -> bool:
        if not child.serving and child.port_file.exists():
            text = child.port_file.read_text().strip()
            if text:
                child.serving = True
                child.failures = 0
                if child.metrics_port_file.exists():
                    child.metrics_port = int(child.metrics_port_file.read_text())
                if self._port is None:
                    self._port = int(text)
        return child.serving

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCHLD)
        for signum in handled:
            signal.signal(signum, lambda *_: None)
        claim: int | None = None
        try:
            claim, refusal = claim_port(self.settings.listen)
            if refusal is not None:
                log.error("supervisor.cannot_start", error=refusal)
                return 1
            code = self._serve_metrics()
            if code is None:
                code = self._start(wake_read)
            if code is None:
                code = self._serve(wake_read)
            return code
        finally:
            self._stop_all()
            if self._metrics is not None:
                self._metrics[0].shutdown()
                self._metrics[0].server_close()
            signal.set_wakeup_fd(-1)
            os.close(wake_read)
            os.close(wake_write)
            if claim is not None:
                os.close(claim)  # (after the children: they no longer listen)
            shutil.rmtree(self._dir, ignore_errors=True)
            _logging.flush()

    def _metric_ports(self) -> list[tuple[int, int | None]]:
        return [(c.index, c.metrics_port if c.serving else None) for c in self._children]

    def _serve_metrics(self) -> int | None:
        """`--metrics-listen`: every child's metrics, gathered (`ChildMetrics`)."""
        if self.settings.metrics_listen is None:
            return None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ChildMetrics(self._metric_ports))
        host, port = split_listen(self.settings.metrics_listen)
        try:
            self._metrics = start_http_server(port, host, registry=registry)
        except OSError as exc:
            log.error(
                "server.cannot_start",
                error=f"cannot serve metrics on {self.settings.metrics_listen}: "
                f"{exc.strerror or exc}; pick another address with --metrics-listen HOST:PORT",
            )
            return 1
        log.info("supervisor.metrics", port=self._metrics[0].server_port)
        return None

    def _start(self, wake: int) -> int | None:
        """Start every child, child 0 first; None once all serve, else the exit code."""
        for child in self._children:
            self._spawn(child)
            while not self._check_serving(child):
                assert child.proc is not None
                if child.proc.poll() is not None:
                    log.error(
                        "supervisor.cannot_start",
                        child=child.index,
                        exit_code=child.proc.returncode,
                        error="a server process exited before it served; its log says why",
                    )
                    return 1
                code = self._on_signals(self._signals(wake, 0.05))
                if code is not None:
                    return code
            if child.index == 0:
                assert self._port is not None
                self._listen = resolved_listen(self.settings.listen, self._port)
        assert self._port is not None
        if self.settings.port_file:
            tmp = Path(self.settings.port_file + ".tmp")
            tmp.write_text(str(self._port))
            os.replace(tmp, self.settings.port_file)
        log.info(
            "supervisor.serving",
            processes=len(self._children),
            listen=self._listen,
            metrics=None if self._metrics is None else self._metrics[0].server_port,
            child_pids=[c.proc.pid for c in self._children if c.proc is not None],
        )
        _logging.flush()
        return None

    def _serve(self, wake: int) -> int:
        while True:
            # The children first: one may have died while the supervisor was starting
            # the others (its SIGCHLD read then), or since the last wait.
            code = self._tend()
            if code is not None:
                return code
            now = time.monotonic()
            due = [c.restart_at for c in self._children if c.restart_at is not None]
            starting = any(c.proc is not None and not c.serving for c in self._children)
            timeout = 0.05 if starting else (max(0.0, min(due) - now) if due else None)
            code = self._on_signals(self._signals(wake, timeout))
            if code is not None:
                return code

    def _on_signals(self, signals: list[int]) -> int | None:
        """Act on the signals received; the exit code once they stopped everything."""
        for signum in signals:
            if signum in (signal.SIGTERM, signal.SIGINT):
                log.info("supervisor.signal", signal=signal.Signals(signum).name)
                return self._stop_all(signum)
            if signum == signal.SIGHUP and self.settings.auth_sources() is None:
                # A server without authentication has nothing to reload (and leaves
                # SIGHUP to its default: it would end).
                log.info("supervisor.nothing_to_reload", why="authentication is off")
            elif signum in (signal.SIGHUP, signal.SIGUSR1):
                self._forward(signum)
        return None

    def _tend(self) -> int | None:
        """Restart the children due, note the ones that died; 1 when giving up."""
        for child in self._children:
            if child.proc is None:
                if child.restart_at is not None and time.monotonic() >= child.restart_at:
                    self._spawn(child)
                continue
            self._check_serving(child)
            code = child.proc.poll()
            if code is None:
                continue
            if not self._died(child, code):
                log.error(
                    "supervisor.giving_up",
                    child=child.index,
                    deaths=child.failures,
                    error=f"a server process died {child.failures} times in a row "
                    "before it served; its log says why",
                )
                self._stop_all(signal.SIGTERM)
                return 1
        return None

    def _died(self, child: _Child, code: int) -> bool:
        """Schedule `child`'s restart; False when it keeps dying before it served."""
        assert child.proc is not None
        pid = child.proc.pid
        child.proc = None
        if not child.serving:
            child.failures += 1
        delay = restart_delay(child.failures)
        how = (
            {"signal": signal.Signals(-code).name}
            if code < 0 and -code in signal.Signals._value2member_map_
            else {"exit_code": code}
        )
        log.error(
            "supervisor.child_died",
            child=child.index,
            child_pid=pid,
            **how,
            restart_in=delay,
            deaths_before_serving=child.failures,
        )
        _logging.flush()
        if delay is None:
            return False
        child.restart_at = time.monotonic() + delay
        return True

    def _signals(self, wake: int, timeout: float | None) -> list[int]:
        with contextlib.suppress(InterruptedError):
            select.select([wake], [], [], timeout)
        try:
            return list(os.read(wake, 256))
        except BlockingIOError:
            return []

    def _forward(self, signum: int) -> None:
        log.info("supervisor.forwarding", signal=signal.Signals(signum).name)
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    def _stop_all(self, signum: int = signal.SIGTERM) -> int:
        """Stop every child (`signum`, then SIGKILL past the grace); 0 if all stopped
        cleanly (one still starting may end by `signum` itself: it had nothing to stop)."""
        running = [c for c in self._children if c.proc is not None]
        for child in running:
            self._check_serving(child)
        if running:
            self._forward(signum)
        deadline = time.monotonic() + self.settings.shutdown_grace_ms / 1000 + STOP_EXTRA_S
        clean = True
        for child in running:
            assert child.proc is not None
            try:
                code = child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("supervisor.child_killed", child=child.index, child_pid=child.proc.pid)
                child.proc.kill()
                code = child.proc.wait()
            if code != 0 and (child.serving or code != -signum):
                clean = False
                log.error(
                    "supervisor.child_unclean_stop",
                    child=child.index,
                    child_pid=child.proc.pid,
                    exit_code=code,
                )
            child.proc = None
        if running:
            log.info("supervisor.stopped", clean=clean)
        return 0 if clean else 1


def supervise(settings: Settings, argv: Sequence[str], inherited: Sequence[int] = ()) -> int:
    """Run `settings.processes` server processes until SIGTERM or SIGINT (the children
    are started with `argv`, `troth serve`'s own arguments, and inherit the files
    `inherited`: the SQLite file's serving lock, held until the last of them ends)."""
    log.info("supervisor.starting", processes=settings.processes)
    return Supervisor(settings, argv, inherited).run()
