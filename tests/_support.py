"""Test support: real troth servers as subprocesses on free ports, and error helpers.

Every process a test starts is reaped (`reaped`, `reap`; from `_procs`), and the
servers started here die with the test run (`spawn`)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from _procs import reap, spawn, stop
from _procs import reaped as reaped  # re-exported: tests take it from here
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from troth import Client, NotFoundError
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import pytest


@dataclass(frozen=True)
class ServerTls:
    """TLS for a test server: its certificate and key, the CA that signed them (which
    clients trust), and for mTLS the client CA plus a client certificate of it, which
    the launcher's own health check and `ServerProcess.channel()` present."""

    cert: Path
    key: Path
    ca: Path
    client_ca: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def args(self) -> list[str]:
        args = ["--tls-cert", str(self.cert), "--tls-key", str(self.key)]
        return args + (["--tls-client-ca", str(self.client_ca)] if self.client_ca else [])

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.client_key.read_bytes() if self.client_key else None,
            certificate_chain=self.client_cert.read_bytes() if self.client_cert else None,
        )


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    db_url: str
    log_path: Path
    tls: ServerTls | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        if self.tls is not None:
            return grpc.secure_channel(self.address, self.tls.credentials())
        return grpc.insecure_channel(self.address)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait: a graceful shutdown (killed, and TimeoutError, if it does
        not end within `timeout`); its exit status."""
        return stop(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        reap(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


_AUTH_FLAGS = ("--no-auth", "--auth-tokens", "--jwt-key-file", "--jwt-jwks-file")


def _has_auth(args: Sequence[str]) -> bool:
    """Whether `troth serve` arguments choose authentication (else `--no-auth` is added:
    a server for tests on a loopback address)."""
    return any(arg.split("=", 1)[0] in _AUTH_FLAGS for arg in args)


def start_server(
    workdir: Path,
    *args: str,
    db_url: str | None = None,
    env: dict[str, str] | None = None,
    tls: ServerTls | None = None,
) -> ServerProcess:
    """Start `troth serve` on 127.0.0.1:0; return once the health check says SERVING
    (over TLS, and presenting the client certificate for mTLS, when `tls` is given)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = db_url or f"sqlite:///{workdir / 'troth.db'}"
    port_file = workdir / f"port-{time.monotonic_ns()}"
    log_path = workdir / f"server-{time.monotonic_ns()}.log"
    command = [
        sys.executable, "-m", "troth_server", "serve",
        "--listen", "127.0.0.1:0", "--db", db_url, "--port-file", str(port_file),
        *(tls.args() if tls else []),
        *(args if _has_auth(args) else ("--no-auth", *args)),
    ]  # fmt: skip
    with log_path.open("wb") as log_file:
        proc = spawn(command, stdout=log_file, stderr=log_file, env={**os.environ, **(env or {})})
    with reaped_unless_returned(proc):
        deadline = time.monotonic() + START_SECONDS
        while not port_file.exists() or not port_file.read_text():
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"server did not start within {START_SECONDS:g} s:\n{log_path.read_text()}"
                )
            time.sleep(0.02)
        server = ServerProcess(proc, int(port_file.read_text()), db_url, log_path, tls)
        wait_serving(server.address, deadline - time.monotonic(), tls)
        return server


START_SECONDS = 60.0
"""How long a test server may take to start (generous: a loaded machine is slow)."""


@contextmanager
def reaped_unless_returned(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Reap `proc` if the block raises (a launcher that failed leaves nothing running)."""
    try:
        yield
    except BaseException:
        reap(proc, grace=5)
        raise


def wait_serving(address: str, timeout: float, tls: ServerTls | None = None) -> None:
    channel = (
        grpc.secure_channel(address, tls.credentials()) if tls else grpc.insecure_channel(address)
    )
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=max(timeout, 1), wait_for_ready=True
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def promises_stub(channel: grpc.Channel) -> promises_pb2_grpc.PromiseServiceStub:
    return promises_pb2_grpc.PromiseServiceStub(channel)


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call (fails the test if there is none)."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status on {error}"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError(f"no ErrorInfo in {status}")


# --- for tests of workflows run by an in-process Worker ---------------------------------


def append(path: str, line: str) -> str:
    """A workflow step's side effect: one line appended to a file."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
    return line


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def eventually(check: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `check` until it returns something true; AssertionError naming `what` after
    `timeout` seconds (generous by default: a loaded machine is slow; a condition
    that holds returns at once)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def exists(client: Client, promise_id: str) -> bool:
    try:
        client.get(promise_id)
    except NotFoundError:
        return False
    return True


def settled(client: Client, promise_id: str) -> bool:
    """Whether `promise_id` exists and is settled (for `eventually`)."""
    found = client.search(promise_id).promises
    return bool(found) and found[0].is_settled


def troth_cli(
    address: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed `troth` command against `address`, as CI runs it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "troth"), "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def start_workflow(
    promises: promises_pb2_grpc.PromiseServiceStub, group: str, root: str | None = None
) -> str:
    """Start workflow `publish` (no arguments) for `group` by a raw CreatePromise, as a
    client does; returns its root id (`wf-<random>` unless given)."""
    root = root or f"wf-{uuid.uuid4().hex[:8]}"
    promises.CreatePromise(
        promises_pb2.CreatePromiseRequest(
            id=root,
            param=types_pb2.Payload(data=b"[]"),
            tags={"troth:invoke": group, "troth:func": "publish"},
        )
    )
    return root


class PollStream:
    """A raw `Poll` stream read on a thread, so tests can wait for the next delivery
    with a deadline (one home for the tests that play a worker by hand)."""

    def __init__(
        self, stub: tasks_pb2_grpc.TaskServiceStub, request: tasks_pb2.PollRequest, wait: float
    ) -> None:
        self.worker = request.worker_id
        self._wait = wait
        self._call = stub.Poll(request)
        self._queue: queue.Queue[tasks_pb2.PollResponse | Exception] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self._queue.put(response)
        except grpc.RpcError as exc:
            self._queue.put(exc)

    def next_response(self) -> tasks_pb2.PollResponse:
        got = self._queue.get(timeout=self._wait)
        assert isinstance(got, tasks_pb2.PollResponse), got
        return got

    def nothing_within(self, seconds: float) -> bool:
        try:
            got = self._queue.get(timeout=seconds)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected delivery: {got}")

    def empty(self) -> bool:
        return self._queue.empty()

    def cancel(self) -> None:
        self._call.cancel()


def run_cli(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    """Run the `troth` command in this process against `server`: its exit status,
    stdout and stderr (one home for the CLI tests that read both)."""
    from troth._cli import main  # the CLI is a wing of its own: imported when used

    capsys.readouterr()
    code = main(["--server", server.address, *argv])
    out, err = capsys.readouterr()
    return code, out, err


class LoadClients:
    """Client threads that run a load until `finish` (one home for the outage tests'
    loads): a subclass, a dataclass, has `clients`, `stop` and `threads` and writes
    `_run(client)`, which loops until `stop` is set."""

    clients: int
    stop: threading.Event
    threads: list[threading.Thread]

    def _run(self, client: int) -> None:
        raise NotImplementedError

    def start(self) -> None:
        for client in range(self.clients):
            thread = threading.Thread(target=self._run, args=(client,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self.threads), "a load client hangs"


def logged_rpcs(server: ServerProcess, method: str, promise: Callable[[str], bool]) -> int:
    """How many `method` calls the server's rpc log names with a promise id `promise`
    accepts (after the 0.2 s in which the server flushes its log lines)."""
    time.sleep(0.5)
    count = 0
    for line in server.log().splitlines():
        if f'"{method}"' not in line:
            continue
        record = json.loads(line)
        if record.get("event") == "rpc" and record.get("method") == method:
            count += promise(str(record.get("promise_id") or ""))
    return count
