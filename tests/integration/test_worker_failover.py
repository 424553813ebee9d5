"""A worker given several server addresses fails over, and its leases outlive a dead server.

- The task stream moves to the next address promptly when the server it
  streams from dies (two servers on their own SQLite files).
- A step in flight keeps its task through a server's SIGKILL and restart:
  the lease is in the database, and the worker heartbeats it through the
  restarted server (one server, one SQLite file).
- With two replicas over one PostgreSQL database, a step in flight keeps its
  task through the SIGKILL of the replica the worker streams from, because
  the worker heartbeats through the other one; the step runs exactly once.

The last test runs worker processes: this file, run as a script, is the
worker (`python test_worker_failover.py ADDRESSES`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from troth import Client, Context, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _pg import fresh_schema
from _support import ServerProcess, start_server
from _workers import WorkerFleet, effect

RELEASE_ENV = "TROTH_TEST_RELEASE"
"""A file whose appearance lets the worker process's blocking step finish."""

LEASE = timedelta(seconds=3)


# -- the worker process (run as a script) ------------------------------------------------


def blocking_step(workflow_id: str) -> str:
    effect(f"{workflow_id} slow")
    release = Path(os.environ[RELEASE_ENV])
    deadline = time.monotonic() + 60
    while not release.exists():  # the test kills a replica meanwhile
        assert time.monotonic() < deadline, "the test never released the step"
        time.sleep(0.05)
    return "slow done"


def failover_flow(ctx: Context) -> Generator[Any, Any, str]:
    yield ctx.run(effect, f"{ctx.id} before")
    yield ctx.run(blocking_step, ctx.id)
    yield ctx.run(effect, f"{ctx.id} after")
    return "done"


def main(addresses: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(addresses) as client:  # "host:port,host:port"
        worker = Worker(client, group="failover", lease=LEASE)
        worker.workflow(failover_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


# -- helpers -----------------------------------------------------------------------------


def eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def no_worker_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "troth.worker" and r.levelno >= logging.ERROR
    ]


# -- the stream moves --------------------------------------------------------------------


def add(ctx: Context, n: int) -> Generator[Any, Any, int]:
    total: int = yield ctx.run(sum, [n, 1])
    return total


@pytest.mark.slow
def test_the_task_stream_moves_to_the_next_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="troth")
    first = start_server(tmp_path / "a", "--sweep-interval", "200ms")
    second = start_server(tmp_path / "b", "--sweep-interval", "200ms")
    try:
        with Client([first.address, second.address], timeout=5) as client:
            worker = Worker(client, group="moves", lease=LEASE)
            worker.workflow(add)
            with worker:
                with Client(first.address) as direct:
                    assert direct.start(add, 1, id="moves-1", group="moves").result(10) == 2
                first.kill()
                killed = time.monotonic()
                with Client(second.address) as direct:
                    assert direct.start(add, 2, id="moves-2", group="moves").result(10) == 3
                # The stream reconnects after a fraction of a second, not a backoff cycle.
                assert time.monotonic() - killed < 3, "the worker took too long to fail over"
    finally:
        first.kill()
        second.stop()
    assert no_worker_errors(caplog) == []


# -- a lease outlives its server's death (SQLite, one server restarted) --------------------


@pytest.mark.slow
def test_a_step_in_flight_keeps_its_task_through_a_server_restart(tmp_path: Path) -> None:
    lease = timedelta(seconds=6)  # longer than a restart takes
    workdir = tmp_path / "server"
    server = start_server(workdir, "--sweep-interval", "200ms")
    restarted: ServerProcess | None = None
    runs: list[str] = []
    inside, gate = threading.Event(), threading.Event()

    def slow(workflow_id: str) -> str:
        runs.append(workflow_id)
        inside.set()
        gate.wait(60)
        return "slow done"

    def restart_flow(ctx: Context) -> Generator[Any, Any, str]:
        yield ctx.run(slow, ctx.id)
        return "done"

    try:
        with Client(server.address, timeout=5) as client:
            worker = Worker(client, group="restart", lease=lease)
            worker.workflow(restart_flow)
            with worker:
                handle = client.start(restart_flow, id="in-flight-1", group="restart")
                assert inside.wait(10), "the step never started"
                server.kill()
                restarted = start_server(
                    workdir, "--sweep-interval", "200ms", "--listen", server.address,
                    db_url=server.db_url,
                )  # fmt: skip
                # Hold the step past two leases: only heartbeats through the
                # restarted server keep the task this worker's.
                time.sleep(2 * lease.total_seconds())
                gate.set()
                assert handle.result(timeout=15) == "done"
    finally:
        gate.set()
        server.kill()
        if restarted is not None:
            restarted.stop()
    assert runs == ["in-flight-1"]


# -- a lease outlives a replica's death (PostgreSQL, two replicas) ------------------------


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated schema in PostgreSQL, as a `--db` URL."""
    with fresh_schema() as url:
        yield url


@pytest.mark.slow
def test_a_lease_survives_the_death_of_the_replica_the_worker_streams_from(
    tmp_path: Path, pg_url: str
) -> None:
    first = start_server(tmp_path / "a", "--sweep-interval", "200ms", db_url=pg_url)
    second = start_server(tmp_path / "b", "--sweep-interval", "200ms", db_url=pg_url)
    release = tmp_path / "release"
    fleet = WorkerFleet(tmp_path, __file__, f"{first.address},{second.address}")
    workflow_id = f"failover-{uuid.uuid4().hex[:6]}"
    try:
        # Only the worker has both addresses; the test talks to each replica directly.
        worker = fleet.start(env={RELEASE_ENV: str(release)})
        with Client(first.address) as direct:
            direct.start("failover_flow", id=workflow_id, group="failover")
        fleet.eventually(
            lambda: fleet.counts()[f"{workflow_id} slow"] == 1, 15, "the step to start"
        )
        first.kill()  # the replica the worker streams from: the first that answers
        killed = time.monotonic()
        fleet.eventually(
            lambda: "lost its task stream" in fleet.log(worker), 10, "the stream to break"
        )
        # Hold the step past two leases: only heartbeats through the second
        # replica keep the task; a lapsed lease would hand it out again, and
        # the step would run twice.
        time.sleep(max(0.0, killed + 2 * LEASE.total_seconds() - time.monotonic()))
        release.touch()
        with Client(second.address) as client:
            assert client.handle(workflow_id).result(timeout=30) == "done"
        assert fleet.terminate(worker) == 0
    finally:
        fleet.stop_all()
        first.kill()
        second.kill()
    counts = fleet.counts()
    assert counts[f"{workflow_id} before"] == 1, counts
    assert counts[f"{workflow_id} slow"] == 1, counts
    assert counts[f"{workflow_id} after"] == 1, counts
    logs = fleet.logs()
    assert "Traceback" not in logs
    assert "lost its lease" not in logs
    assert "dropping" not in logs
