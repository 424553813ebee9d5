"""`troth serve --processes 2`: two server processes on one port and one store, on both
stores (one SQLite file; one PostgreSQL schema), all real processes.

- every process serves: connections of their own spread over both (the log lines of
  the calls name the process that served them);
- a task created through one process reaches a worker streaming from the other at
  once (a wake-up across processes, with the periodic scan 10 s away);
- racing settles through both processes: exactly one wins;
- a SIGKILLed child is restarted by the supervisor, and the workers streaming from it
  reconnect: every workflow finishes, no recorded step runs again;
- SIGTERM to the supervisor stops every child cleanly; a configuration the children
  would fail on stops the supervisor before it starts any.

This file, run as a script, is the worker (`python test_processes.py ADDRESS`).
"""

from __future__ import annotations

import collections
import fcntl
import json
import logging
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from troth import Client, Context, Worker
from troth._grpc_args import ARG_USE_LOCAL_SUBCHANNEL_POOL
from troth_server.supervisor import GIVE_UP_AFTER

sys.path.insert(0, str(Path(__file__).parent.parent))

from _auth import Grant, write_token_file
from _pg import fresh_schema
from _support import PollStream, ServerProcess, error_info, start_server, start_workflow
from _workers import WorkerFleet, effect

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

GROUP = "procs"
WAKE_WITHIN_S = 1.5
"""A task's delivery to a stream of the other process: well under the 10 s scan."""


# -- the worker process (run as a script) ------------------------------------------------


def two_steps(ctx: Context) -> Generator[Any, Any, str]:
    yield ctx.run(effect, f"{ctx.id} one")
    yield ctx.sleep(timedelta(milliseconds=200))
    yield ctx.run(effect, f"{ctx.id} two")
    return "done"


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=GROUP, lease=timedelta(seconds=3))
        worker.workflow(two_steps)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


# -- helpers -----------------------------------------------------------------------------


def start_processes(workdir: Path, backend: str, stack: ExitStack, *args: str) -> ServerProcess:
    db_url = stack.enter_context(fresh_schema()) if backend == "postgres" else None
    return start_server(workdir, "--processes", "2", *args, db_url=db_url)


def log_lines(server: ServerProcess) -> list[dict[str, Any]]:
    found = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                pass
    return found


def child_pids(server: ServerProcess) -> list[int]:
    """The pids of the children serving now (the latest started in each slot)."""
    started: dict[int, int] = {}
    for line in log_lines(server):
        if line.get("event") == "server.started" and isinstance(line.get("process"), int):
            started[line["process"]] = line["pid"]
    return [started[i] for i in sorted(started)]


def served_by(server: ServerProcess, prefix: str) -> collections.Counter[int]:
    """How many calls about promises `prefix*` each process logged."""
    return collections.Counter(
        line["pid"]
        for line in log_lines(server)
        if line.get("event") == "rpc" and str(line.get("promise_id", "")).startswith(prefix)
    )


def own_channels(server: ServerProcess, count: int) -> list[grpc.Channel]:
    """Channels with a connection each (no subchannel shared between them): the kernel
    hands each new connection to one of the processes."""
    options = [(ARG_USE_LOCAL_SUBCHANNEL_POOL, 1)]
    return [grpc.insecure_channel(server.address, options=options) for _ in range(count)]


def refused_start(workdir: Path, *args: str) -> str:
    """The log of a `troth serve` that must exit 1 at start (one that serves instead is
    killed, and the test fails)."""
    try:
        started = start_server(workdir, *args)
    except RuntimeError as exc:
        assert "exited with 1" in str(exc), exc
        return str(exc)
    started.kill()
    raise AssertionError(f"troth serve {' '.join(args)} served; it should have been refused")


def eventually(check: Any, timeout: float, what: str, server: ServerProcess) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{server.log()[-4000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def procs(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    """Two processes whose periodic scan is 10 s away: what arrives sooner was woken."""
    with ExitStack() as stack:
        server = start_processes(
            tmp_path_factory.mktemp("procs"), request.param, stack, "--sweep-interval", "10s"
        )
        yield server
        assert server.stop() == 0, f"unclean shutdown:\n{server.log()[-3000:]}"


# -- the tests ---------------------------------------------------------------------------


def test_every_process_serves(procs: ServerProcess) -> None:
    prefix = f"spread-{uuid.uuid4().hex[:6]}-"
    channels = own_channels(procs, 16)
    try:
        for i, channel in enumerate(channels):
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            stub.CreatePromise(pb.CreatePromiseRequest(id=f"{prefix}{i}"))
    finally:
        for channel in channels:
            channel.close()
    pids = set(child_pids(procs))
    assert len(pids) == 2
    eventually(lambda: sum(served_by(procs, prefix).values()) == 16, 10, "the log", procs)
    # 16 connections all on one of two processes: 1 in 32768.
    assert set(served_by(procs, prefix)) == pids


def test_a_task_reaches_a_worker_on_the_other_process_at_once(procs: ServerProcess) -> None:
    group = f"wake-{uuid.uuid4().hex[:6]}"
    with grpc.insecure_channel(procs.address) as worker_channel:
        request = tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=100)
        stream = PollStream(tasks_pb2_grpc.TaskServiceStub(worker_channel), request, 20)
        channels = own_channels(procs, 16)
        try:
            time.sleep(0.3)  # the stream is open (its first wait is the same either way)
            for i, channel in enumerate(channels):
                root = f"{group}-{i}"
                started = time.monotonic()
                start_workflow(promises_pb2_grpc.PromiseServiceStub(channel), group, root)
                delivered = stream.next_response()
                took = time.monotonic() - started
                assert delivered.task.root_promise_id == root
                assert took < WAKE_WITHIN_S, f"{root} delivered after {took:.2f} s"
        finally:
            stream.cancel()
            for channel in channels:
                channel.close()
    # The starts went through both processes: some reached the stream across them.
    eventually(lambda: len(served_by(procs, group)) == 2, 10, "starts on both", procs)


def test_a_wait_hears_a_settle_made_through_the_other_process_at_once(
    procs: ServerProcess,
) -> None:
    prefix = f"heard-{uuid.uuid4().hex[:6]}-"
    channels = own_channels(procs, 16)
    try:
        with Client(procs.address) as waiter:
            for i, channel in enumerate(channels):
                promise_id = f"{prefix}{i}"
                waiter.create(promise_id)
                waited: list[float] = []
                thread = threading.Thread(
                    target=lambda p=promise_id, w=waited: (waiter.wait(p, timeout=20), w.append(1))
                )
                thread.start()
                time.sleep(0.2)  # the wait is in (its first call answered PENDING)
                started = time.monotonic()
                stub = promises_pb2_grpc.PromiseServiceStub(channel)
                stub.ResolvePromise(pb.ResolvePromiseRequest(id=promise_id))
                thread.join(20)
                took = time.monotonic() - started
                assert waited, f"{promise_id}: the wait did not end"
                assert took < WAKE_WITHIN_S, f"{promise_id}: heard after {took:.2f} s"
    finally:
        for channel in channels:
            channel.close()
    eventually(lambda: len(served_by(procs, prefix)) == 2, 10, "calls on both", procs)


def test_streams_on_both_processes_claim_each_task_once(procs: ServerProcess) -> None:
    """Tasks started through both processes, eight streams of one group spread over them:
    every task delivered, and to one stream only (DESIGN §4 rule 9)."""
    group = f"claim-{uuid.uuid4().hex[:6]}"
    channels = own_channels(procs, 8)
    starters = own_channels(procs, 16)
    streams = [
        PollStream(
            tasks_pb2_grpc.TaskServiceStub(channel),
            tasks_pb2.PollRequest(group=group, worker_id=f"w{i}", capacity=100),
            20,
        )
        for i, channel in enumerate(channels)
    ]
    roots = [f"{group}-{i}" for i in range(40)]
    delivered: list[str] = []
    try:
        time.sleep(0.3)
        for i, root in enumerate(roots):
            stub = promises_pb2_grpc.PromiseServiceStub(starters[i % len(starters)])
            start_workflow(stub, group, root)
        deadline = time.monotonic() + 30
        while len(delivered) < len(roots) and time.monotonic() < deadline:
            for stream in streams:
                while not stream.empty():
                    response = stream.next_response()
                    for one in (response, *response.more):
                        delivered.append(one.task.root_promise_id)
            time.sleep(0.05)
        time.sleep(0.5)  # a second delivery of any of them would arrive by now
        for stream in streams:
            while not stream.empty():
                delivered.append(stream.next_response().task.root_promise_id)
    finally:
        for stream in streams:
            stream.cancel()
        for channel in (*channels, *starters):
            channel.close()
    assert sorted(delivered) == sorted(roots)
    eventually(lambda: len(served_by(procs, group)) == 2, 10, "starts on both", procs)


def test_racing_settles_through_both_processes_one_wins(procs: ServerProcess) -> None:
    clients, count = 16, 10  # 16 connections all on one of two processes: 1 in 32768
    channels = own_channels(procs, clients)
    stubs = [promises_pb2_grpc.PromiseServiceStub(ch) for ch in channels]
    ids = [f"race-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
    for promise_id in ids:
        stubs[0].CreatePromise(pb.CreatePromiseRequest(id=promise_id))
    results: dict[str, list[tuple[int, bool | str]]] = {i: [] for i in ids}
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def settle(client: int) -> None:
        barrier.wait()
        for promise_id in ids:
            value = types.Payload(data=str(client).encode())
            request = pb.ResolvePromiseRequest(id=promise_id, value=value)
            try:
                outcome: bool | str = stubs[client].ResolvePromise(request).applied
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
                outcome = error_info(error).reason
            with lock:
                results[promise_id].append((client, outcome))

    threads = [threading.Thread(target=settle, args=(c,)) for c in range(clients)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for promise_id, outcomes in results.items():
            winners = [c for c, o in outcomes if o is True]
            assert len(winners) == 1, (promise_id, outcomes)
            assert [o for _, o in outcomes if o is not True] == ["ALREADY_SETTLED"] * (clients - 1)
            final = stubs[0].GetPromise(pb.GetPromiseRequest(id=promise_id)).promise
            assert final.value.data == str(winners[0]).encode()
    finally:
        for channel in channels:
            channel.close()
    eventually(lambda: len(served_by(procs, "race-")) == 2, 10, "settles on both", procs)


def test_a_killed_child_is_restarted_and_every_workflow_finishes(
    tmp_path: Path, backend: str
) -> None:
    with ExitStack() as stack:
        server = start_processes(tmp_path / "server", backend, stack, "--sweep-interval", "200ms")
        fleet = WorkerFleet(tmp_path, __file__, server.address)
        stack.callback(server.stop)
        stack.callback(fleet.stop_all)
        for _ in range(2):
            fleet.start()
        roots = [f"kill-{uuid.uuid4().hex[:6]}-{i}" for i in range(30)]
        with Client(server.address) as client:
            for root in roots[:15]:
                client.start("two_steps", id=root, group=GROUP)
            fleet.eventually(lambda: len(fleet.lines()) >= 5, 60, "steps running")
            # Either child: process 0 (which bound the port first, and serves the
            # console) on SQLite, process 1 on PostgreSQL.
            victim = child_pids(server)[0 if backend == "sqlite" else 1]
            os.kill(victim, signal.SIGKILL)
            for root in roots[15:]:  # acknowledged while a child is down or restarting
                client.start("two_steps", id=root, group=GROUP)
            eventually(
                lambda: victim not in child_pids(server) and len(child_pids(server)) == 2,
                60,
                "the restart",
                server,
            )
            handles = [client.start("two_steps", id=root, group=GROUP) for root in roots]
            assert [h.result(timeout=60) for h in handles] == ["done"] * len(roots)
        counts = fleet.counts()
        for root in roots:
            # At least once each; again only for a step whose result was not recorded
            # when its worker lost it (a step recorded is never run again): here no
            # worker dies, so at most one step of a workflow caught by the kill.
            assert counts[f"{root} one"] >= 1 and counts[f"{root} two"] >= 1, root
        again = [line for line, n in counts.items() if n > 1]
        assert len(again) <= 2, again
        died = [line for line in log_lines(server) if line.get("event") == "supervisor.child_died"]
        assert [(d["child_pid"], d["signal"]) for d in died] == [(victim, "SIGKILL")]
        assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_sigterm_stops_every_child_cleanly(tmp_path: Path, backend: str) -> None:
    with ExitStack() as stack:
        server = start_processes(tmp_path / "server", backend, stack)
        pids = child_pids(server)
        assert server.stop() == 0
        lines = log_lines(server)
        stopped = {line["pid"] for line in lines if line.get("event") == "server.stopped"}
        assert stopped == set(pids)
        assert any(line.get("event") == "supervisor.stopped" and line["clean"] for line in lines)
        for pid in pids:
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_a_bad_configuration_stops_the_supervisor_before_any_child(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="exited with 1") as failed:
        start_server(tmp_path, "--processes", "2", "--auth-tokens", str(tmp_path / "missing"))
    assert "supervisor.child_started" not in str(failed.value)


def test_a_child_that_cannot_start_stops_the_supervisor(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="exited with 1") as failed:
            start_server(tmp_path, "--processes", "2", "--console-listen", f"127.0.0.1:{port}")
        assert "supervisor.cannot_start" in str(failed.value)
        # The supervisor's own address taken: it stops before any child.
        with pytest.raises(RuntimeError, match="exited with 1") as failed:
            start_server(tmp_path, "--processes", "2", "--metrics-listen", f"127.0.0.1:{port}")
        assert "cannot serve metrics" in str(failed.value)
        assert "supervisor.child_started" not in str(failed.value)


@pytest.mark.parametrize("first_processes", ["2", "1"])
def test_a_server_on_a_port_another_serves_is_refused(tmp_path: Path, first_processes: str) -> None:
    """Processes of one server share their port (SO_REUSEPORT); a second server started
    on it must not join them (the kernel would spread connections over two servers,
    each perhaps on a store of its own): it stops before any child, saying why."""
    first = start_server(tmp_path / "first", "--processes", first_processes)
    try:
        for processes in ("2", "1"):
            refused = refused_start(
                tmp_path / f"second-{processes}",
                *("--processes", processes, "--listen", first.address),
            )
            assert "is in use" in refused, refused
            assert "supervisor.child_started" not in refused
        # Every new connection still reaches the first server's store.
        channels = own_channels(first, 8)
        stubs = [promises_pb2_grpc.PromiseServiceStub(channel) for channel in channels]
        stubs[0].CreatePromise(pb.CreatePromiseRequest(id="first-only"), timeout=10)
        for stub in stubs:
            assert stub.GetPromise(pb.GetPromiseRequest(id="first-only"), timeout=10).promise.id
        for channel in channels:
            channel.close()
    finally:
        assert first.stop() == 0, f"unclean shutdown:\n{first.log()[-3000:]}"


def test_two_servers_starting_on_one_port_at_once_one_is_refused(tmp_path: Path) -> None:
    """Before its first child listens, a supervisor holds the port's lock: a second
    starting meanwhile (here: the test holds the lock) is refused, not let in."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    lock_path = Path(tempfile.gettempdir()) / f"troth-port-{port}-uid{os.getuid()}.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        refused = refused_start(tmp_path, "--processes", "2", "--listen", f"127.0.0.1:{port}")
    assert "another troth server" in refused, refused
    assert "supervisor.child_started" not in refused
    # The lock given up, the same start serves.
    server = start_server(tmp_path, "--processes", "2", "--listen", f"127.0.0.1:{port}")
    assert server.port == port
    assert server.stop() == 0, f"unclean shutdown:\n{server.log()[-3000:]}"


def test_a_child_that_keeps_dying_before_it_serves_ends_the_supervisor(tmp_path: Path) -> None:
    """A restart that does not mend the fault (here: the console's port, taken while
    child 0 was down) is not repeated forever: after `GIVE_UP_AFTER` deaths in a row
    before serving, the supervisor stops the other children and exits 1, saying why."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        console_port = free.getsockname()[1]
    server = start_server(
        tmp_path / "server", "--processes", "2", "--console-listen", f"127.0.0.1:{console_port}"
    )
    first, other = child_pids(server)
    try:
        with socket.socket() as taken:
            os.kill(first, signal.SIGKILL)
            # Child 0 had served: its restart comes 0.5 s after its death (`BACKOFF_S`).
            deadline = time.monotonic() + 10
            while True:
                try:
                    taken.bind(("127.0.0.1", console_port))
                    break
                except OSError:  # the killed child's socket is not closed yet
                    assert time.monotonic() < deadline, "the console's port was never freed"
                    time.sleep(0.01)
            taken.listen()
            # Restarted 5 times, each dying before it serves: 0.5 + 1 + 2 + 4 + 8 s.
            assert server.proc.wait(timeout=90) == 1, server.log()[-4000:]
    finally:
        if server.proc.poll() is None:  # the test failed: nothing is left running
            server.kill()
    lines = log_lines(server)
    (given_up,) = [line for line in lines if line.get("event") == "supervisor.giving_up"]
    assert given_up["child"] == 0
    assert given_up["deaths"] == GIVE_UP_AFTER
    assert f"died {GIVE_UP_AFTER} times in a row before it served" in given_up["error"]
    restarts = [line for line in lines if line.get("event") == "supervisor.child_started"]
    assert len(restarts) == 2 + GIVE_UP_AFTER, restarts  # two at start, then the restarts
    # The other child was stopped gracefully, not left serving.
    stopped = {line["pid"] for line in lines if line.get("event") == "server.stopped"}
    assert other in stopped
    assert not Path(f"/proc/{other}").exists() or _zombie(other)


def test_sighup_reloads_every_child_and_the_metrics_gather_every_child(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.toml"
    tokens = write_token_file(tokens_file, [Grant("ops", ("admin",))])
    server = start_server(
        tmp_path / "server",
        "--processes",
        "2",
        "--auth-tokens",
        str(tokens_file),
        "--metrics-listen",
        "127.0.0.1:0",
        "--console-listen",
        "127.0.0.1:0",
    )
    try:
        started = [line for line in log_lines(server) if line.get("event") == "server.started"]
        assert [line["process"] for line in started] == [0, 1]
        # The console once, by process 0; the metrics once, by the supervisor: each
        # process's, labelled.
        assert started[0]["console"].startswith("http://127.0.0.1:")
        assert started[1]["console"].startswith("off")
        (serving,) = [line for line in log_lines(server) if line["event"] == "supervisor.serving"]
        url = f"http://127.0.0.1:{serving['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        for process in ("0", "1"):
            assert f'troth_process_up{{process="{process}"}} 1.0' in text
            assert re.search(rf'\ntroth_server_info\{{[^}}]*process="{process}"', text), text
            assert f'troth_store_commits_total{{process="{process}"}}' in text
        write_token_file(tokens_file, [Grant("ops", ("admin",)), Grant("new", ("admin",))])
        server.proc.send_signal(signal.SIGHUP)
        eventually(
            lambda: (
                {line["pid"] for line in log_lines(server) if line.get("event") == "auth.reloaded"}
                == set(child_pids(server))
            ),
            30,
            "every child reloaded",
            server,
        )
        assert tokens["ops"]
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_the_children_end_with_a_killed_supervisor(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", "--processes", "2")
    pids = child_pids(server)
    server.kill()  # SIGKILL: no forwarding; the kernel's parent-death signal instead
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and not _zombie(pid) for pid in pids):
        assert time.monotonic() < deadline, f"children left running:\n{server.log()[-3000:]}"
        time.sleep(0.05)
    stopped = {line["pid"] for line in log_lines(server) if line.get("event") == "server.stopped"}
    assert stopped == set(pids)  # each stopped gracefully (SIGTERM)
