"""A step's record carried by the call that suspends or completes its task
(`troth._carry`): one call fewer per step before a wait or a return, and the same
guarantees as the step's own call (DESIGN §4 rule 6: first writer wins, a finished
step never runs again for an outage), with a real server on both stores."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import logged_rpcs, start_server

from troth import Client, Context, Worker
from troth._convert import payload_to_proto
from troth.codec import JsonCodec, Payload
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from _support import ServerProcess

LEASE = timedelta(seconds=3)


@pytest.fixture
def group() -> str:
    return f"carry-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as client:
        yield client


def _running(client: Client, group: str, *workflows: Any) -> Worker:
    worker = Worker(client, group=group, lease=LEASE)
    for workflow in workflows:
        worker.workflow(workflow)
    worker.start()
    return worker


def test_a_step_before_a_wait_and_one_before_the_return_ride_on_those_calls(
    server: ServerProcess, client: Client, group: str
) -> None:
    ran: list[str] = []

    def notify(what: str) -> str:
        ran.append(what)
        return f"asked {what}"

    def approve(ctx: Context, what: str) -> Generator[Any, Any, Any]:
        approval = yield ctx.promise()
        asked = yield ctx.run(notify, what)
        decision = yield approval
        done = yield ctx.run(notify, f"{what} done")
        return {"asked": asked, "decision": decision, "done": done}

    worker = _running(client, group, approve)
    try:
        run = f"carried-{uuid.uuid4().hex[:8]}"
        handle = client.start("approve", "invoice", id=run, group=group)
        deadline = time.monotonic() + 10
        while not _exists(client, f"{run}.1"):  # recorded with the suspension
            assert time.monotonic() < deadline, "the notify step was never recorded"
            time.sleep(0.05)
        client.resolve(f"{run}.0", "yes")
        assert handle.result(timeout=10) == {
            "asked": "asked invoice",
            "decision": "yes",
            "done": "asked invoice done",
        }
    finally:
        worker.stop()
    assert ran == ["invoice", "invoice done"]  # each step ran once
    for n, value in ((1, "asked invoice"), (2, "asked invoice done")):
        step = client.get(f"{run}.{n}")
        assert step.state.value == "RESOLVED" and client.decode(step.value) == value
        assert step.parent_id == run
    # The start and the latent promise by CreatePromise; the two steps went with the
    # suspension and the completion: no CreatePromise of their own.
    assert logged_rpcs(server, "CreatePromise", lambda id: id.startswith(run)) == 2


def _exists(client: Client, id: str) -> bool:
    try:
        client.get(id)
    except Exception:
        return False
    return True


def test_a_step_recorded_first_by_an_earlier_holder_wins_and_the_run_replays_from_it(
    server: ServerProcess, client: Client, group: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The task's earlier holder recorded the step late, with another result, while
    this worker ran it: the server keeps the first record and refuses the carried one
    (STEP_RECORDED); the worker gives the task back and the workflow goes on, by
    replay, with the first record's result. Its function ran here once."""
    caplog.set_level(logging.INFO, logger="troth")
    entered, go_on = threading.Event(), threading.Event()
    ran: list[str] = []

    def pick(_: str) -> str:
        ran.append("here")
        entered.set()
        assert go_on.wait(20)
        return "second"

    def chooses(ctx: Context) -> Generator[Any, Any, Any]:
        picked = yield ctx.run(pick, "x")
        return f"picked {picked}"

    run = f"raced-{uuid.uuid4().hex[:8]}"
    with server.channel() as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        promises = promises_pb2_grpc.PromiseServiceStub(channel)
        # The earlier holder: a raw worker that takes the task and lets it go.
        poll = tasks.Poll(tasks_pb2.PollRequest(group=group, worker_id="earlier", capacity=1))
        client.start("chooses", id=run, group=group)
        first = next(poll).task
        tasks.ReleaseTask(
            tasks_pb2.ReleaseTaskRequest(
                task_id=first.id, counter=first.counter, worker_id="earlier"
            )
        )
        poll.cancel()
        worker = _running(client, group, chooses)
        try:
            assert entered.wait(20), "the step never ran on the worker"
            # The earlier holder's late record (a finished result counts at any counter
            # the task had): first.
            promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(
                    id=f"{run}.0",
                    tags={"troth:kind": "run", "troth:func": "pick"},
                    fence=types_pb2.TaskFence(
                        task_id=first.id, counter=first.counter, worker_id="earlier"
                    ),
                    resolved_with=payload_to_proto(client.encode("first")),
                )
            )
            go_on.set()
            assert client.handle(run).result(timeout=20) == "picked first"
        finally:
            go_on.set()
            worker.stop()
    assert ran == ["here"]
    assert client.decode(client.get(f"{run}.0").value) == "first"
    # The road taken: the completion carrying "second" was refused, the task given back.
    assert "recorded first by an earlier holder" in caplog.text


class _NoncedCodec(JsonCodec):
    """JSON with a fresh nonce header on every encode: the bytes of one value differ
    each time (as a codec that encrypts writes them)."""

    def encode(self, value: Any) -> Payload:
        payload = super().encode(value)
        return Payload({**payload.headers, "x-nonce": uuid.uuid4().hex}, payload.data)


@pytest.mark.parametrize("codec", [JsonCodec(), _NoncedCodec()], ids=["json", "nonced"])
def test_a_carrying_call_that_fails_records_the_step_by_its_own_call(
    server: ServerProcess,
    group: str,
    codec: JsonCodec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The call carrying the step's record fails (UNAVAILABLE, as in an outage): the step
    is recorded by its own call, the very record it would have carried (with a codec
    whose bytes differ at each encode, too), never run again, and the workflow
    finishes with it without a replay."""
    caplog.set_level(logging.INFO, logger="troth")
    ran: list[int] = []

    def count() -> int:
        ran.append(1)
        return len(ran)

    def counts(ctx: Context) -> Generator[Any, Any, Any]:
        n = yield ctx.run(count)
        return n

    client = Client(server.address, timeout=10, codec=codec)
    worker = _running(client, group, counts)
    original = worker._tasks.complete
    refused: list[bool] = []

    def refusing(task_id: str, counter: int, **outcome: Any) -> Any:
        if outcome.get("record_step") is not None and not refused:
            refused.append(True)
            raise _unavailable()
        return original(task_id, counter, **outcome)

    worker._tasks.complete = refusing  # type: ignore[method-assign]
    try:
        run = f"fallback-{uuid.uuid4().hex[:8]}"
        assert client.start("counts", id=run, group=group).result(timeout=20) == 1
        assert client.decode(client.get(f"{run}.0").value) == 1
    finally:
        worker.stop()
        client.close()
    assert refused == [True] and ran == [1]
    assert "recorded first by an earlier holder" not in caplog.text  # no replay


def _unavailable() -> Exception:
    from troth.errors import UnavailableError

    return UnavailableError(grpc.StatusCode.UNAVAILABLE, "", "the server went away")


def test_a_result_the_server_refuses_pauses_the_run_and_is_not_run_again_at_once(
    tmp_path: Path,
) -> None:
    """A step's result over the server's payload limit, carried with the suspension:
    refused, then refused by its own call too; a bug, so the run pauses (the task fails
    with the reason, retried after a backoff), as when the step's own call is refused.
    Not given back and run again at once, over and over."""
    server = start_server(tmp_path, "--max-payload-bytes", "1024")
    ran: list[int] = []

    def big() -> str:
        ran.append(1)
        return "x" * 4096

    def waits(ctx: Context) -> Generator[Any, Any, Any]:
        approval = yield ctx.promise()
        yield ctx.run(big)
        return (yield approval)

    try:
        with Client(server.address, timeout=10) as client:
            group = f"big-{uuid.uuid4().hex[:8]}"
            worker = _running(client, group, waits)
            try:
                run = f"big-{uuid.uuid4().hex[:8]}"
                client.start("waits", id=run, group=group)
                deadline = time.monotonic() + 15
                failed: list[tasks_pb2.Task] = []
                with server.channel() as channel:
                    stub = tasks_pb2_grpc.TaskServiceStub(channel)
                    search = tasks_pb2.SearchTasksRequest(group=group)
                    while not failed:
                        assert time.monotonic() < deadline, "the run never paused"
                        failed = [t for t in stub.SearchTasks(search).tasks if t.failed_attempts]
                        time.sleep(0.1)
                    time.sleep(1.0)  # a run given back instead would have run again, and again
                    (task,) = stub.SearchTasks(search).tasks
            finally:
                worker.stop()
        assert "the limit is 1 KiB" in task.last_error, task.last_error
        # Each run of the step is one failed attempt (one more may be under way): paused
        # with a backoff between attempts, not given back and run again at once.
        assert len(ran) <= task.failed_attempts + 1 <= 3, (len(ran), task.failed_attempts)
    finally:
        server.stop()
