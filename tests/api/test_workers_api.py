"""The connected workers (issue 12 item 7): `SearchWorkers`, `Client.list_workers`,
`troth workers list`, and `Client.search_tasks`, against a real server.

A worker run by the SDK in this process and a worker played by hand (two Poll
streams of one worker id, holding a task) are listed with their versions,
capacity, held tasks and heartbeat; pages, the group filter and bad input are
answered as the API says; a worker whose streams end is gone from the list."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import PollStream, ServerProcess, error_info, eventually

from troth import Client, Context, TaskKind, TaskState, Worker, WorkerInfo, _leases
from troth._cli import main
from troth.errors import Reason
from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc

if TYPE_CHECKING:
    from collections.abc import Iterator

    from _pytest.capture import CaptureFixture


def wait_forever(ctx: Context) -> Any:
    approval = yield ctx.promise()
    return (yield approval)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


@pytest.fixture(scope="module")
def tasks(channel: grpc.Channel) -> tasks_pb2_grpc.TaskServiceStub:
    return tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture(scope="module")
def workers(
    client: Client, channel: grpc.Channel, tasks: tasks_pb2_grpc.TaskServiceStub
) -> Iterator[dict[str, Any]]:
    """`sdk-worker` (group wl-a, by the SDK) and `raw-1` (group wl-b, two streams, one task)."""
    sdk = Worker(client, group="wl-a", worker_id="sdk-worker", lease=timedelta(seconds=5))
    sdk.workflow(wait_forever)
    sdk.start()
    versions = [tasks_pb2.WorkflowVersion(name="raw", version="v2"),
                tasks_pb2.WorkflowVersion(name="raw", version="v1")]  # fmt: skip
    request = tasks_pb2.PollRequest(group="wl-b", worker_id="raw-1", capacity=2, workflows=versions)
    first = PollStream(tasks, request, wait=20)
    second = PollStream(tasks, tasks_pb2.PollRequest(group="wl-b", worker_id="raw-1"), wait=20)
    promises_pb2_grpc.PromiseServiceStub(channel).CreatePromise(
        pb.CreatePromiseRequest(id="wl-root", tags={"troth:invoke": "wl-b", "troth:func": "raw"})
    )
    held = _next_of(first, second)  # either stream may take it
    yield {"sdk": sdk, "streams": (first, second), "task": held}
    first.cancel()
    second.cancel()
    sdk.stop()


def _next_of(*streams: PollStream) -> tasks_pb2.Task:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for stream in streams:
            if not stream.empty():
                return stream.next_response().task
        time.sleep(0.02)
    raise AssertionError("no stream received the task")


def by_id(found: list[WorkerInfo]) -> dict[str, WorkerInfo]:
    return {w.worker_id: w for w in found}


def test_the_connected_workers_are_listed(client: Client, workers: dict[str, Any]) -> None:
    eventually(lambda: {"sdk-worker", "raw-1"} <= set(by_id(client.list_workers())),
               what="both workers to be connected")  # fmt: skip
    found = client.list_workers()
    assert [(w.group, w.worker_id) for w in found] == [("wl-a", "sdk-worker"), ("wl-b", "raw-1")]
    raw, sdk = by_id(found)["raw-1"], by_id(found)["sdk-worker"]
    assert raw.streams == 2 and raw.capacity == 3  # 2 + the default 1
    assert raw.workflows == (("raw", "v1"), ("raw", "v2"))
    assert raw.task_ids == (workers["task"].id,)
    assert raw.principal is None  # authentication is off
    assert not raw.stalled
    assert sdk.workflows and sdk.workflows[0][0] == "wait_forever"
    now = datetime.now(UTC)
    assert raw.connect_time is not None and now - raw.connect_time < timedelta(minutes=1)
    assert raw.last_heartbeat_time is not None and raw.last_heartbeat_time >= raw.connect_time
    assert [w.worker_id for w in client.list_workers("wl-b")] == ["raw-1"]
    assert client.list_workers("nobody") == []


def test_a_heartbeat_moves_the_last_heartbeat(
    client: Client, workers: dict[str, Any], tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    before = by_id(client.list_workers("wl-b"))["raw-1"].last_heartbeat_time
    assert before is not None

    def beat_seen() -> bool:
        tasks.Heartbeat(tasks_pb2.HeartbeatRequest(worker_id="raw-1"), timeout=10)
        after = by_id(client.list_workers("wl-b"))["raw-1"].last_heartbeat_time
        return after is not None and after > before

    eventually(beat_seen, what="the heartbeat in the listing")


def test_an_idle_worker_keeps_its_last_heartbeat_fresh(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28: an idle worker held nothing, so it made no heartbeat, and its "last
    # heartbeat" grew to minutes as if it were stalled. Now it heartbeats holding
    # nothing too, every `IDLE_BEAT_S` (10 s; 1 s here): its own calls, as liveness is.
    monkeypatch.setattr(_leases, "IDLE_BEAT_S", 1.0)
    idle = Worker(client, group="wl-idle", worker_id="idle-worker", lease=timedelta(seconds=1.5))
    idle.workflow(wait_forever)
    with idle:
        eventually(lambda: "idle-worker" in by_id(client.list_workers("wl-idle")),
                   what="the idle worker to connect")  # fmt: skip
        connected = by_id(client.list_workers("wl-idle"))["idle-worker"].connect_time
        assert connected is not None
        time.sleep(5.0)  # holding nothing all along
        seen = by_id(client.list_workers("wl-idle"))["idle-worker"]
        assert seen.task_ids == ()
        assert seen.last_heartbeat_time is not None
        assert seen.last_heartbeat_time - connected >= timedelta(seconds=3), (connected, seen)
        assert datetime.now(UTC) - seen.last_heartbeat_time < timedelta(seconds=3), seen


def test_pages_follow_the_order_and_the_token_keeps_its_group(
    workers: dict[str, Any], tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    first = tasks.SearchWorkers(tasks_pb2.SearchWorkersRequest(page_size=1), timeout=10)
    assert [w.worker_id for w in first.workers] == ["sdk-worker"] and first.next_page_token
    second = tasks.SearchWorkers(
        tasks_pb2.SearchWorkersRequest(page_size=1, page_token=first.next_page_token), timeout=10
    )
    assert [w.worker_id for w in second.workers] == ["raw-1"]
    assert second.workers[0].connect_time.seconds > 0
    with pytest.raises(grpc.RpcError) as other_group:
        tasks.SearchWorkers(
            tasks_pb2.SearchWorkersRequest(group="wl-b", page_token=first.next_page_token),
            timeout=10,
        )
    assert other_group.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(other_group.value).reason == Reason.INVALID_PAGE_TOKEN.value


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [({"group": "no spaces"}, "group"), ({"page_size": -1}, "page_size"),
     ({"page_size": 100_000}, "page_size"), ({"page_token": "forged"}, "page_token")],
)  # fmt: skip
def test_bad_input_is_invalid_argument_naming_the_field(
    tasks: tasks_pb2_grpc.TaskServiceStub, request_fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        tasks.SearchWorkers(tasks_pb2.SearchWorkersRequest(**request_fields), timeout=10)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(refused.value).metadata["field"] == field


def test_the_cli_lists_them(
    server: ServerProcess, workers: dict[str, Any], capsys: CaptureFixture[str]
) -> None:
    assert main(["--server", server.address, "workers", "list", "--group", "wl-b"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["GROUP", "WORKER", "WORKFLOWS", "HELD"]
    assert row.split()[:4] == ["wl-b", "raw-1", "raw@v1,raw@v2", "1/3"]
    assert workers["task"].id in row and "ago" in row
    assert main(["--server", server.address, "--json", "workers", "list"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [w["worker_id"] for w in listed] == ["sdk-worker", "raw-1"]
    assert listed[1]["task_ids"] == [workers["task"].id] and listed[1]["streams"] == 2
    assert main(["--server", server.address, "workers", "list", "--group", "nobody"]) == 0
    assert "no worker of group 'nobody'" in capsys.readouterr().err


def test_search_tasks_is_typed(client: Client, workers: dict[str, Any]) -> None:
    (task,) = client.search_tasks("wl-b")
    assert task.id == workers["task"].id and task.root_id == "wl-root"
    assert task.kind is TaskKind.INVOKE and task.state is TaskState.CLAIMED
    assert task.worker_id == "raw-1" and task.lease_expire_time is not None
    with pytest.raises(ValueError, match="limit"):
        client.search_tasks("wl-b", limit=0)


def test_a_worker_whose_streams_end_is_gone(client: Client, workers: dict[str, Any]) -> None:
    for stream in workers["streams"]:
        stream.cancel()
    eventually(lambda: "raw-1" not in by_id(client.list_workers()), what="raw-1 to go")
