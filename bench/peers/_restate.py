"""Restate as `bench/peers/run.py` measures it: restate-server and the Python service
`_restate_service.py` under hypercorn, driven over the ingress's HTTP API.

Flows (a driver is ``"<flow>/<client>"``, the client ``threads``, one thread per
workflow in flight on `http.client`, or ``async``, one asyncio loop on
`_aio_load`):

- ``workflow``: the Workflow API. W1: ``POST /Hitl/<id>/run/send``, the
  notification, ``POST /Hitl/<id>/approve`` (a shared handler that resolves the
  workflow's durable promise), ``GET /restate/workflow/Hitl/<id>/attach``: three
  HTTP calls and two invocations of the service per cycle. W2: ``POST
  /TenSteps/<id>/run``, which answers with the result.
- ``awakeable`` (W1): ``POST /HitlAwakeable/run`` with the workflow id, left
  open; its notification step publishes the awakeable's id (`_awakeables.py`);
  ``POST /restate/awakeables/<awakeable id>/resolve`` (the server settles it
  itself, no invocation of the service); the result comes on the open request.
  The invocation is live when it is settled (it suspends only after its
  inactivity timeout, a minute by default), as it is in the eager variant of
  troth.
- ``awakeable-suspended`` (W1 suspend): the same on a service whose inactivity
  timeout is ``BENCH_SUSPEND_MS`` (10 ms), settled once the invocation reported
  it suspended on the awakeable: like troth's suspend variant, the settle has to
  wake a workflow no process holds (Restate invokes the service again and it
  replays its journal).

The async client drives the awakeable flows and W2's workflow flow (the
Workflow-API W1 flow waits on the threads' notification events, so it has the
threads client only).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import _aio_load
from _aio_load import AioHttp
from _servers import ServerError
from _systems import (
    APPROVED,
    PEERS_DIR,
    START_TIMEOUT_S,
    TIMEOUT_S,
    Phase,
    Recovery,
    System,
    free_port,
    run_threads,
    stop_process,
    tail,
    wait_port,
)

if TYPE_CHECKING:
    from _awakeables import Awakeables
    from _workflow_load import Notifications

FLOWS = {
    "w1-suspend": ("workflow", "awakeable", "awakeable-suspended"),
    "w1-eager": ("workflow", "awakeable"),
    "w2": ("workflow",),
}
CLIENTS = ("threads", "async")
AWAKEABLE_SERVICES = {"awakeable": ("HitlAwakeable", "notified"),
                      "awakeable-suspended": ("HitlAwakeableSuspend", "suspended")}  # fmt: skip


class _Http(threading.local):
    """One keep-alive HTTP/1.1 connection to Restate's ingress per thread."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
        self.pending = ""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(2):
            try:
                self._request(method, path, body)
                return self.receive()
            except (http.client.HTTPException, OSError):
                self.conn.close()  # a dropped keep-alive connection: reconnect once
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def send(self, method: str, path: str, body: Any = None) -> None:
        """Send a request and leave its response to `receive` (the awakeable flow's
        open call, which is not retried: so a connection the server closed while idle
        is replaced first)."""
        sock = self.conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self.conn.close()  # readable while idle: the server closed it
        self._request(method, path, body)

    def _request(self, method: str, path: str, body: Any) -> None:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        self.pending = f"{method} {path}"
        self.conn.request(method, path, body=data, headers=headers)

    def receive(self) -> Any:
        response = self.conn.getresponse()
        payload = response.read()
        if response.status >= 300:
            raise ServerError(f"{self.pending}: HTTP {response.status}: {payload[:300]!r}")
        return json.loads(payload) if payload else None

    def reset(self) -> None:
        self.conn.close()


class Restate(System):
    """restate-server (its default durable storage, in a fresh base directory) and the
    Python service `_restate_service.py` under hypercorn, registered as a deployment."""

    INGRESS = 8080
    ADMIN = 9070

    def __init__(
        self,
        server_bin: Path,
        python: Path,
        workdir: Path,
        notes: Notifications,
        awakeables: Awakeables,
        flows: tuple[str, ...] = ("workflow", *AWAKEABLE_SERVICES),
        clients: tuple[str, ...] = CLIENTS,
    ) -> None:
        self.name = "restate"
        self.python = python
        self.notes = notes
        self.awakeables = awakeables
        self.flows, self.clients = flows, clients
        self.workdir = workdir / "restate"
        self.workdir.mkdir()
        self.service: subprocess.Popen[bytes] | None = None
        self.service_port = free_port()
        self._logs: list[IO[bytes]] = []
        log_path = self.workdir / "server.log"
        out = log_path.open("wb")
        self._logs.append(out)
        env = dict(os.environ, RESTATE_LOG_FILTER="warn")
        self.server = subprocess.Popen(
            [str(server_bin), "--bind-ip", "127.0.0.1", "--listen-mode", "tcp",
             "--base-dir", str(self.workdir / "data")],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            self._wait_healthy(log_path)
            self.start_service(block=False)
            self._register()
        except BaseException:
            self.stop()
            raise
        self.http = _Http(self.INGRESS)
        self.held = _Http(self.INGRESS)

    def _wait_healthy(self, log_path: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise ServerError(
                    f"restate-server exited {self.server.returncode}: {tail(log_path)}"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ADMIN}/health", timeout=1):
                    pass
                with socket.create_connection(("127.0.0.1", self.INGRESS), 0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise ServerError(f"restate-server not healthy within {START_TIMEOUT_S:.0f} s")

    def start_service(self, *, block: bool) -> None:
        log_path = self.workdir / f"service-{len(self._logs)}.log"
        out = log_path.open("wb")
        self._logs.append(out)
        env = dict(
            os.environ,
            BENCH_NOTIFY=str(self.notes.path),
            BENCH_AWAKEABLES=str(self.awakeables.path),
            BENCH_BLOCK="1" if block else "0",
        )
        self.service = subprocess.Popen(
            [str(self.python), str(PEERS_DIR / "_restate_service.py"),
             "--port", str(self.service_port)],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        wait_port(self.service_port, self.service, log_path)

    def _register(self) -> None:
        body = json.dumps({"uri": f"http://127.0.0.1:{self.service_port}", "force": True}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ADMIN}/deployments",
            data=body,
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=START_TIMEOUT_S) as response:
            response.read()
        # The ingress learns of the deployment a moment later: call until it answers.
        deadline = time.monotonic() + START_TIMEOUT_S
        probe = _Http(self.INGRESS)
        while True:
            try:
                probe.call("POST", f"/TenSteps/probe-{uuid.uuid4().hex[:6]}/run")
                return
            except ServerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def pids(self) -> list[int]:
        return [self.server.pid] + ([self.service.pid] if self.service else [])

    def drivers(self, workload: str) -> tuple[str, ...]:
        """Its chosen flows for `workload` (W2 has one, always run) by its chosen clients."""
        return tuple(
            f"{flow}/{client}"
            for flow in FLOWS[workload]
            if flow in self.flows or len(FLOWS[workload]) == 1
            for client in self.clients
            if not (client == "async" and flow == "workflow" and workload != "w2")
        )

    def phase(
        self, workload: str, concurrency: int, duration: float, driver: str | None = None
    ) -> Phase:
        flow, _, client = (driver or self.drivers(workload)[0]).partition("/")
        if flow not in FLOWS[workload] or client not in CLIENTS:
            raise ValueError(f"restate has no driver {driver!r} for {workload}")
        if client == "async":
            return Phase(**_aio_load.run_async(
                lambda: self._async_cycle(workload, flow), concurrency, duration
            ))  # fmt: skip
        return run_threads(self._thread_cycle(workload, flow), concurrency, duration)

    # ------------------------------------------------------------------ threads

    def _thread_cycle(self, workload: str, flow: str) -> Callable[[str, int], int]:
        http, held, notes, awakeables = self.http, self.held, self.notes, self.awakeables

        def w1_workflow(workflow_id: str, _slot: int) -> int:
            # Settled once the notification step ran: the invocation is live on its
            # stream while it waits (it suspends only after its inactivity timeout).
            reached = notes.expect(workflow_id, "notified")
            try:
                http.call("POST", f"/Hitl/{workflow_id}/run/send")
                if not reached.wait(TIMEOUT_S):
                    raise TimeoutError(f"{workflow_id} never reached its wait")
            finally:
                notes.forget(workflow_id, "notified")
            settle = time.perf_counter_ns()
            http.call("POST", f"/Hitl/{workflow_id}/approve", APPROVED)
            if http.call("GET", f"/restate/workflow/Hitl/{workflow_id}/attach") != APPROVED:
                raise AssertionError(f"{workflow_id}: unexpected result")
            return time.perf_counter_ns() - settle

        def w1_awakeable(workflow_id: str, _slot: int) -> int:
            service, event = AWAKEABLE_SERVICES[flow]
            waiter = awakeables.expect(workflow_id, event)
            try:
                held.send("POST", f"/{service}/run", workflow_id)
                awakeable_id = waiter.wait(TIMEOUT_S)
                if awakeable_id is None:
                    raise TimeoutError(f"{workflow_id}: no {event} report")
                settle = time.perf_counter_ns()
                http.call("POST", f"/restate/awakeables/{awakeable_id}/resolve", APPROVED)
                result = held.receive()
            except BaseException:
                held.reset()  # its response is still due: start the next on a new one
                raise
            finally:
                awakeables.forget(workflow_id, event)
            if result != APPROVED:
                raise AssertionError(f"{workflow_id}: unexpected result {result!r}")
            return time.perf_counter_ns() - settle

        def w2(workflow_id: str, _slot: int) -> int:
            start = time.perf_counter_ns()
            if http.call("POST", f"/TenSteps/{workflow_id}/run") != "done":
                raise AssertionError(f"{workflow_id}: unexpected result")
            return time.perf_counter_ns() - start

        if workload == "w2":
            return w2
        return w1_workflow if flow == "workflow" else w1_awakeable

    # ------------------------------------------------------------------ async

    def _async_cycle(self, workload: str, flow: str) -> tuple[_aio_load.Cycle, Callable[[], None]]:
        awakeables, port = self.awakeables, self.INGRESS
        connections: dict[int, tuple[AioHttp, AioHttp]] = {}

        def of(slot: int) -> tuple[AioHttp, AioHttp]:
            pair = connections.get(slot)
            if pair is None:
                pair = connections[slot] = (AioHttp(port), AioHttp(port))
            return pair

        async def w1_awakeable(workflow_id: str, slot: int) -> int:
            http, held = of(slot)
            service, event = AWAKEABLE_SERVICES[flow]
            reached = awakeables.expect_async(workflow_id, event)
            try:
                await held.send("POST", f"/{service}/run", workflow_id)
                async with asyncio.timeout(TIMEOUT_S):
                    awakeable_id = await reached
                settle = time.perf_counter_ns()
                await http.call("POST", f"/restate/awakeables/{awakeable_id}/resolve", APPROVED)
                result = await held.receive()
            except BaseException:
                held.close()  # its response is still due: start the next on a new one
                raise
            finally:
                awakeables.forget(workflow_id, event)
            if result != APPROVED:
                raise AssertionError(f"{workflow_id}: unexpected result {result!r}")
            return time.perf_counter_ns() - settle

        async def w2(workflow_id: str, slot: int) -> int:
            http, _ = of(slot)
            start = time.perf_counter_ns()
            if await http.call("POST", f"/TenSteps/{workflow_id}/run") != "done":
                raise AssertionError(f"{workflow_id}: unexpected result")
            return time.perf_counter_ns() - start

        def close() -> None:
            for pair in connections.values():
                for connection in pair:
                    connection.close()

        if workload == "w2":
            return w2, close
        if flow == "workflow":
            raise ValueError("the Workflow-API W1 flow has the threads client only")
        return w1_awakeable, close

    # ------------------------------------------------------------------ W3

    def recovery(self, count: int) -> Recovery:
        note = "after a restart of the service process (one deployment URI); Restate retries"
        stop_process(self.service)
        self.start_service(block=True)
        assert self.service is not None
        first = self.service.pid
        prefix = f"w3-{uuid.uuid4().hex[:6]}"
        ids = {f"{prefix}-{i}" for i in range(count)}
        for workflow_id in sorted(ids):
            self.http.call("POST", f"/Held/{workflow_id}/run/send")
        if len(self.notes.wait_entered(first, ids, TIMEOUT_S)) < count:
            return Recovery(None, 0, note, f"not all {count} entered their step")
        t0 = time.monotonic()
        self.service.send_signal(signal.SIGKILL)
        self.service.wait()
        self.start_service(block=False)
        completed, error = 0, None
        for workflow_id in sorted(ids):
            try:
                if self.http.call("GET", f"/restate/workflow/Held/{workflow_id}/attach") == "ok":
                    completed += 1
            except Exception as exc:
                error = error or f"{workflow_id}: {type(exc).__name__}: {exc}"
        seconds = time.monotonic() - t0
        return Recovery(seconds if completed == count else None, completed, note, error)

    def stop(self) -> None:
        stop_process(self.service)
        stop_process(self.server)
        for out in self._logs:
            out.close()
