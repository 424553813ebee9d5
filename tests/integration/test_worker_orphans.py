"""A task leased to a worker that never received it is given back, not kept leased.

A replica claims a task for a worker's stream and dies before delivering it;
the worker, streaming from another replica by then, heartbeats every task the
database says is its own. Were it to extend that one too, the task would wait
for as long as the worker holds anything else. Here the undelivered task is
made with a second Poll stream under the worker's id, cut off once the task
was delivered to it (the server keeps the lease: the worker still has its own
stream open there).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from troth import Client, Context, Worker
from troth.v1 import tasks_pb2, tasks_pb2_grpc

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess  # noqa: TC002 (a fixture type, imported at run time by pytest)

if TYPE_CHECKING:
    import pytest

    from troth._leases import Held

LEASE = timedelta(seconds=1)


def test_an_undelivered_task_is_released_and_runs(own_server: ServerProcess) -> None:
    group = f"orphans-{uuid.uuid4().hex[:6]}"
    gate, inside = threading.Event(), threading.Event()

    def hold(_: str) -> str:
        inside.set()
        gate.wait(30)
        return "held"

    def make_worker(client: Client, worker_id: str) -> Worker:
        worker = Worker(client, group=group, worker_id=worker_id, lease=LEASE, concurrency=1)

        @worker.workflow(name="busy")
        def busy(ctx: Context) -> Generator[Any, Any, str]:
            return (yield ctx.run(hold, ctx.id))

        @worker.workflow(name="quick")
        def quick(ctx: Context) -> Generator[Any, Any, str]:
            return "ran"
            yield  # a generator

        return worker

    with Client(own_server.address) as client:
        busy = make_worker(client, "w-busy")
        busy.start()
        other: Worker | None = None
        try:
            client.start("busy", id="busy-1", group=group)
            assert inside.wait(10), "the busy workflow never started"

            # w-busy is full. A second stream under its id takes the next task,
            # then vanishes; the server keeps the lease (w-busy's own stream is
            # still open), as a replica that died before delivering would have.
            with grpc.insecure_channel(own_server.address) as channel:
                ghost = tasks_pb2_grpc.TaskServiceStub(channel).Poll(
                    tasks_pb2.PollRequest(group=group, worker_id="w-busy", capacity=1)
                )
                handle = client.start("quick", id="quick-1", group=group)
                delivered = next(ghost)
                assert delivered.task.root_promise_id == "quick-1"
                ghost.cancel()

            # Only another worker can run it, and only once w-busy gave it back:
            # its heartbeats (every lease / 3) name the task, which it never got.
            other = make_worker(client, "w-other")
            other.start()
            started = time.monotonic()
            assert handle.result(timeout=8 * LEASE.total_seconds()) == "ran"
            assert time.monotonic() - started < 8 * LEASE.total_seconds()
            assert not gate.is_set()  # w-busy was busy all along
        finally:
            gate.set()
            busy.stop()
            if other is not None:
                other.stop()


def test_a_delivery_read_after_the_worker_gave_it_back_does_not_run(
    own_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery sits unread (a frozen process, a stalled socket; here the poller
    is held on it) while heartbeats name its task: the worker gives the task back
    and the server moves it on, to another worker. When the delivery is read at
    last, it carries a lease that has not run out by its own time, but it is not
    this worker's any more: it must not run the step beside the other worker."""
    group = f"late-{uuid.uuid4().hex[:6]}"
    lease = timedelta(seconds=3)
    gate = threading.Event()
    inside = threading.Event()
    runs: list[str] = []

    def hold(_: str) -> str:
        inside.set()
        gate.wait(60)
        return "held"

    def once(workflow_id: str) -> str:
        runs.append(workflow_id)
        time.sleep(2.0)  # long enough for a second run to overlap the first
        return "sent"

    def make_worker(client: Client, worker_id: str, concurrency: int) -> Worker:
        worker = Worker(
            client, group=group, worker_id=worker_id, lease=lease, concurrency=concurrency
        )

        @worker.workflow(name="busy")
        def busy(ctx: Context) -> Generator[Any, Any, str]:
            return (yield ctx.run(hold, ctx.id))

        @worker.workflow(name="mail")
        def mail(ctx: Context) -> Generator[Any, Any, str]:
            return (yield ctx.run(once, ctx.id))

        return worker

    with Client(own_server.address) as client:
        # Busy with a task of its own, so that it heartbeats every lease / 3.
        slow = make_worker(client, "w-slow", concurrency=2)
        read, given_back = threading.Event(), threading.Event()
        late: list[str] = []
        accept, release = slow._accept, slow._leases.release

        def held_accept(response: tasks_pb2.PollResponse) -> None:
            if response.task.root_promise_id == "mail-1" and not late:
                late.append(response.task.id)
                read.set()
                slow._leases.wake()  # a heartbeat names it at once
                given_back.wait(10 * lease.total_seconds())
            accept(response)

        def seen_release(held: Held) -> None:
            release(held)
            if late and held.task_id == late[0]:
                given_back.set()

        monkeypatch.setattr(slow, "_accept", held_accept)
        monkeypatch.setattr(slow._leases, "release", seen_release)
        slow.start()
        other: Worker | None = None
        try:
            client.start("busy", id="busy-1", group=group)
            assert inside.wait(10), "the busy workflow never started"
            handle = client.start("mail", id="mail-1", group=group)
            assert read.wait(10), "the task never reached w-slow"
            # It has room for more than w-slow: the task goes to it once given back.
            other = make_worker(client, "w-other", concurrency=4)
            other.start()
            assert given_back.wait(10 * lease.total_seconds()), "w-slow never gave it back"
            assert handle.result(timeout=30) == "sent"
            time.sleep(0.5)  # a late run by w-slow would have started by now
            assert runs == ["mail-1"]
        finally:
            gate.set()
            slow.stop()
            if other is not None:
                other.stop()
