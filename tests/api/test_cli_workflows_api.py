"""`troth workflows start|cancel|fail|list|retry-now` against a real server, on SQLite
and PostgreSQL: the operator's workflow commands, each as a user types it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from _support import PollStream, ServerProcess

from troth import Client, PromiseState
from troth._cli import main
from troth.v1 import tasks_pb2, tasks_pb2_grpc

if TYPE_CHECKING:
    import grpc

WAIT = 15.0


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def tasks(channel: grpc.Channel) -> tasks_pb2_grpc.TaskServiceStub:
    return tasks_pb2_grpc.TaskServiceStub(channel)


def wid() -> str:
    return f"wf-{uuid.uuid4().hex[:8]}"


def troth(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    """Run the CLI in-process; its exit status, stdout and stderr."""
    capsys.readouterr()
    code = main(["--server", server.address, *argv])
    out, err = capsys.readouterr()
    return code, out, err


# --- start --------------------------------------------------------------------


def test_start_starts_a_workflow_as_client_start_does(
    server: ServerProcess, client: Client, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = wid()
    code, out, err = troth(
        server, capsys, "workflows", "start", "publish", "7", '{"draft": true}', "hello",
        "[1, 2]", "null", '"quoted"', "--id", run, "--group", group, "--ttl", "2h",
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.startswith(
        f"started {run}: workflow publish on group {group}; "
        f"`troth workflows show {run}` follows it\n\nid:         {run}\n"
    )
    root = client.get(run)
    assert root.state is PromiseState.PENDING
    assert root.tags["troth:func"] == "publish" and root.tags["troth:invoke"] == group
    # JSON values as JSON, a bare word that is not JSON as a string.
    assert client.decode(root.param) == [7, {"draft": True}, "hello", [1, 2], None, "quoted"]
    assert root.expire_time is not None
    expected = datetime.now(UTC) + timedelta(hours=2)
    assert abs((root.expire_time - expected).total_seconds()) < 60

    # The same start again is a repeat: nothing changes, and it says so.
    code, out, _ = troth(
        server, capsys, "--json", "workflows", "start", "publish", "7", '{"draft": true}',
        "hello", "[1, 2]", "null", '"quoted"', "--id", run, "--group", group, "--ttl", "2h",
    )  # fmt: skip
    assert code == 0
    answer = json.loads(out)
    assert answer["created"] is False
    assert answer["workflow"]["id"] == run and answer["workflow"]["state"] == "PENDING"


def test_start_without_arguments_and_a_different_repeat_is_refused(
    server: ServerProcess, client: Client, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = wid()
    code, out, _ = troth(
        server, capsys, "--json", "workflows", "start", "nightly", "--id", run, "--group", group
    )
    assert code == 0
    answer = json.loads(out)
    assert answer["created"] is True and answer["workflow"]["param"] == []
    code, out, err = troth(
        server, capsys, "workflows", "start", "nightly", "1", "--id", run, "--group", group
    )
    assert code == 1 and out == ""
    assert err.startswith("troth: error: ") and "WORKFLOW_ALREADY_EXISTS" in err


ID_AND_GROUP = ("--id", "x", "--group", "g")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["publish", "{bad", *ID_AND_GROUP], "argument ARGS: invalid JSON '{bad'"),
        (["publish", "[1,", *ID_AND_GROUP], "argument ARGS: invalid JSON '[1,'"),
        (["publish", '"open', *ID_AND_GROUP], """argument ARGS: invalid JSON '"open'"""),
        (["publish", "--group", "g"], "the following arguments are required: --id"),
        (["publish", "--id", "x"], "the following arguments are required: --group"),
        (["publish", *ID_AND_GROUP, "--ttl", "soon"], "argument --ttl: invalid duration"),
    ],
)
def test_start_refuses_a_bad_command_line_saying_what_to_type(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = troth(server, capsys, "workflows", "start", *argv)
    assert code == 2 and out == ""
    assert message in err
    if "JSON" in message:
        assert "a bare word that is not JSON is a string" in err


# --- cancel -------------------------------------------------------------------


def test_cancel_cancels_the_root_of_a_workflow(
    server: ServerProcess, client: Client, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = wid()
    client.start("publish", id=run, group=group)
    code, out, err = troth(server, capsys, "workflows", "cancel", run, "--reason", "not needed")
    assert (code, err) == (0, "")
    assert out.startswith(f"workflow {run} cancelled: its root is now REJECTED_CANCELED\n")
    root = client.get(run)
    assert root.state is PromiseState.REJECTED_CANCELED
    assert client.decode(root.value) == {"reason": "not needed"}

    # Once over, a second cancel says so (the server's words) and exits 1.
    code, out, err = troth(server, capsys, "workflows", "cancel", run)
    assert code == 1 and out == ""
    assert "ALREADY_SETTLED" in err


def test_cancel_without_a_reason_and_as_json(
    server: ServerProcess, client: Client, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = wid()
    client.start("publish", id=run, group=group)
    code, out, _ = troth(server, capsys, "--json", "workflows", "cancel", run)
    assert code == 0
    root = json.loads(out)
    assert (root["id"], root["state"], root["value"]) == (run, "REJECTED_CANCELED", None)


def test_cancel_refuses_what_is_not_a_workflow(
    server: ServerProcess, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    client.create(plain)
    code, out, err = troth(server, capsys, "workflows", "cancel", plain)
    assert code == 1 and out == ""
    assert err == (
        f"troth: error: promise {plain!r} is not a workflow (it has no troth:invoke tag); "
        f"`troth promises cancel {plain}` cancels a promise\n"
    )
    assert client.get(plain).state is PromiseState.PENDING  # untouched
    code, _, err = troth(server, capsys, "workflows", "cancel", "nobody-has-this-id")
    assert code == 1 and "NOT_FOUND" in err


# --- a paused workflow: fail ---------------------------------------------------


def pause(
    client: Client, tasks: tasks_pb2_grpc.TaskServiceStub, group: str, run: str, **start: object
) -> tasks_pb2.Task:
    """Start `run` and play a worker whose code raises: the task fails once and waits
    out its backoff, the root stays PENDING (a paused run)."""
    client.start("publish", id=run, group=group, **start)  # type: ignore[arg-type]
    poller = PollStream(tasks, tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=1), WAIT)
    try:
        task = poller.next_response().task
        failed = tasks.FailTask(
            tasks_pb2.FailTaskRequest(
                task_id=task.id,
                counter=task.counter,
                worker_id="w1",
                error="NameError: name 'x' is not defined",
                traceback='Traceback (most recent call last):\n  File "wf.py", line 3\n',
            ),
            timeout=10,
        ).task
    finally:
        poller.cancel()
    return failed


def test_fail_rejects_a_paused_workflow_for_good(
    server: ServerProcess,
    client: Client,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = wid()
    pause(client, tasks, group, run)
    code, out, err = troth(server, capsys, "workflows", "fail", run, "--reason", "cannot fix")
    assert (code, err) == (0, "")
    assert out.startswith(f"workflow {run} failed: its root is now REJECTED\n")
    assert client.get(run).state is PromiseState.REJECTED
    code, out, err = troth(server, capsys, "workflows", "fail", run, "--reason", "again")
    assert code == 1 and "ALREADY_SETTLED" in err
