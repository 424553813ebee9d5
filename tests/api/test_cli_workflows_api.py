"""`troth workflows start|cancel|fail|list|retry-now` against a real server, on SQLite
and PostgreSQL: the operator's workflow commands, each as a user types it."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pytest
from _support import PollStream, ServerProcess
from _support import run_cli as troth

from troth import Client, PromiseState
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2

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
    # Over: listed as cancelled, waiting on nothing (its task ends when a worker hears).
    code, out, _ = troth(server, capsys, "workflows", "list", run)
    assert code == 0
    assert out.splitlines()[1].split()[1] == "REJECTED_CANCELED"
    assert out.splitlines()[1].endswith("  -")

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


# --- list: a group of six runs, each filter --------------------------------------

V1 = [tasks_pb2.WorkflowVersion(name="publish", version="v1"),
      tasks_pb2.WorkflowVersion(name="review", version="v1")]  # fmt: skip


@dataclass(frozen=True)
class Runs:
    group: str
    ids: dict[str, str]
    """Name (w1 ... w5) to workflow id."""
    approval: str
    middle: datetime
    """Between w3's start and w4's."""


@pytest.fixture(scope="module")
def runs(client: Client, tasks: tasks_pb2_grpc.TaskServiceStub, channel: grpc.Channel) -> Runs:
    """w1 waits for a human (at a step with an id of its own), w2 on a run step, w3 is
    paused by a bug, w4 finished, w5 was taken by a worker that does not run it (no
    version recorded), which then left."""
    promises = promises_pb2_grpc.PromiseServiceStub(channel)
    group = f"g-{uuid.uuid4().hex[:8]}"
    run = {name: f"{group}-{name}" for name in ("w1", "w2", "w3", "w4", "w5")}
    approval = f"approval-{group}"
    request = tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=50, workflows=V1)
    poller = PollStream(tasks, request, WAIT)
    try:

        def held(task: tasks_pb2.Task) -> dict[str, object]:
            return {"task_id": task.id, "counter": task.counter, "worker_id": "w1"}

        def step(task: tasks_pb2.Task, step_id: str, kind: str) -> None:
            fence = types_pb2.TaskFence(**held(task))  # type: ignore[arg-type]
            promises.CreatePromise(
                promises_pb2.CreatePromiseRequest(
                    id=step_id, fence=fence, tags={"troth:kind": kind}
                ),
                timeout=10,
            )
            tasks.CompleteTask(
                tasks_pb2.CompleteTaskRequest(**held(task), suspend_on=[step_id]),  # type: ignore[arg-type]
                timeout=10,
            )

        client.start("publish", id=run["w1"], group=group)
        step(poller.next_response().task, approval, "promise")
        client.start("publish", id=run["w2"], group=group)
        step(poller.next_response().task, f"{run['w2']}.0", "run")
        client.start("review", id=run["w3"], group=group)
        task = poller.next_response().task
        tasks.FailTask(
            tasks_pb2.FailTaskRequest(**held(task), error="NameError: name 'x' is not defined"),  # type: ignore[arg-type]
            timeout=10,
        )
        time.sleep(0.05)
        middle = datetime.now(UTC)
        time.sleep(0.05)
        client.start("review", id=run["w4"], group=group)
        task = poller.next_response().task
        done = types_pb2.Payload(data=b"1")
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(**held(task), resolve_root=done),  # type: ignore[arg-type]
            timeout=10,
        )
        client.start("other", id=run["w5"], group=group)
        poller.next_response()  # held by w1, which registers no "other": no version
    finally:
        poller.cancel()
    return Runs(group, run, approval, middle)


def listed(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], runs: Runs, *argv: str
) -> list[str]:
    """The names (w1 ...) `troth --json workflows list --group G ARGV` lists, in order."""
    code, out, _ = troth(
        server, capsys, "--json", "workflows", "list", "--group", runs.group, *argv
    )
    assert code == 0
    names = {wid: name for name, wid in runs.ids.items()}
    return [names[json.loads(line)["id"]] for line in out.splitlines()]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], ["w5", "w4", "w3", "w2", "w1"]),
        (["--oldest-first"], ["w1", "w2", "w3", "w4", "w5"]),
        (["--state", "pending"], ["w5", "w3", "w2", "w1"]),
        (["--state", "RESOLVED", "--state", "REJECTED"], ["w4"]),
        (["--workflow", "review"], ["w4", "w3"]),
        (["--version", "v1"], ["w4", "w3", "w2", "w1"]),
        (["--paused"], ["w3"]),
        (["--waiting-for-human"], ["w1"]),
        (["--started-after", "1h"], ["w5", "w4", "w3", "w2", "w1"]),
        (["--started-before", "1h"], []),
        (["--limit", "2"], ["w5", "w4"]),
        (["--all"], ["w5", "w4", "w3", "w2", "w1"]),
        (["--workflow", "publish", "--state", "PENDING", "--oldest-first"], ["w1", "w2"]),
    ],
)
def test_list_filters(
    server: ServerProcess,
    capsys: pytest.CaptureFixture[str],
    runs: Runs,
    argv: list[str],
    expected: list[str],
) -> None:
    assert listed(server, capsys, runs, *argv) == expected


def test_list_by_id_and_by_start_time(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], runs: Runs
) -> None:
    assert listed(server, capsys, runs, runs.ids["w2"]) == ["w2"]
    assert listed(server, capsys, runs, "*-w1") == ["w1"]
    middle = runs.middle.isoformat().replace("+00:00", "Z")
    assert listed(server, capsys, runs, "--started-before", middle) == ["w3", "w2", "w1"]
    assert listed(server, capsys, runs, "--started-after", middle) == ["w5", "w4"]
    naive = runs.middle.replace(tzinfo=None).isoformat()  # no zone: UTC
    assert listed(server, capsys, runs, "--started-after", naive) == ["w5", "w4"]


def test_list_as_a_table(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], runs: Runs
) -> None:
    code, out, err = troth(server, capsys, "workflows", "list", "--group", runs.group)
    assert (code, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split() == ["ID", "STATE", "GROUP", "WORKFLOW", "STARTED", "WAITING", "ON"]
    row = {line.split()[0]: line for line in lines}
    assert list(row) == [runs.ids[name] for name in ("w5", "w4", "w3", "w2", "w1")]
    starts = [header.index(title) for title in ("STATE", "GROUP", "WORKFLOW", "STARTED")]
    starts.append(header.index("WAITING ON"))

    def cells(name: str) -> list[str]:
        line = row[runs.ids[name]]
        edges = [0, *starts, len(line)]
        return [line[a:b].strip() for a, b in itertools.pairwise(edges)]

    assert cells("w1")[1:4] == ["PENDING", runs.group, "publish@v1"]
    assert cells("w1")[5] == runs.approval  # the human decision it waits on
    assert cells("w2")[5] == "its steps"
    assert cells("w3")[1:4] == ["PAUSED (1 failed attempt)", runs.group, "review@v1"]
    assert cells("w3")[5].startswith("retry at 20")
    assert cells("w3")[5].endswith(": NameError: name 'x' is not defined")  # cut at 80
    assert (cells("w4")[1], cells("w4")[5]) == ("RESOLVED", "-")
    assert cells("w5")[1:4] == ["PENDING", runs.group, "other"]
    # Its worker left: what its task waits for, in the server's words.
    assert cells("w5")[5].startswith(f"waiting for a worker of group '{runs.group}'")
    for line in lines:
        assert line[header.index("STARTED") :].startswith(datetime.now(UTC).strftime("%Y-"))


def test_list_says_when_more_match_and_when_none_do(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], runs: Runs
) -> None:
    code, out, err = troth(
        server, capsys, "workflows", "list", "--group", runs.group, "--limit", "4"
    )
    assert code == 0 and len(out.splitlines()) == 5
    assert err == "showing the first 4; pass --limit N or --all\n"
    code, out, err = troth(
        server, capsys, "workflows", "list", "--group", runs.group, "--limit", "5"
    )
    assert (code, err) == (0, "")
    code, out, err = troth(server, capsys, "workflows", "list", "--group", f"{runs.group}-none")
    assert (code, out, err) == (0, "", "no workflows match\n")


def test_list_as_json_carries_the_task_and_the_decision(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], runs: Runs
) -> None:
    code, out, _ = troth(server, capsys, "--json", "workflows", "list", "--group", runs.group)
    assert code == 0
    by_id = {item["id"]: item for item in map(json.loads, out.splitlines())}
    w1, w3 = by_id[runs.ids["w1"]], by_id[runs.ids["w3"]]
    assert (w1["state"], w1["paused"], w1["workflow"], w1["version"]) == (
        "PENDING", False, "publish", "v1",
    )  # fmt: skip
    assert [step["id"] for step in w1["waiting_on"]] == [runs.approval]
    assert w1["task"] is None and w1["root"]["id"] == runs.ids["w1"]
    assert w3["paused"] is True
    assert w3["task"]["failed_attempts"] == 1
    assert w3["task"]["last_error"] == "NameError: name 'x' is not defined"
    assert w3["task"]["next_attempt_time"].endswith("Z")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--started-after", "yesterday"], "argument --started-after: invalid time 'yesterday'"),
        (["--limit", "0"], "argument --limit: invalid limit '0': use 1 or more, or --all"),
        (["--limit", "3", "--all"], "argument --all: not allowed with argument --limit"),
        (["--state", "DONE"], "argument --state: invalid state 'DONE'"),
    ],
)
def test_list_refuses_a_bad_filter(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = troth(server, capsys, "workflows", "list", *argv)
    assert code == 2 and out == ""
    assert message in err


# --- retry-now ----------------------------------------------------------------------


def test_retry_now_hurries_a_paused_workflow(
    server: ServerProcess,
    client: Client,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = wid()
    failed = pause(client, tasks, group, run)
    code, out, err = troth(server, capsys, "workflows", "retry-now", run)
    assert (code, err) == (0, "")
    assert out == (
        f"workflow {run} is retried now: its task goes to a worker of group {group} at once "
        "(its code failed once, last: NameError: name 'x' is not defined); "
        f"`troth workflows show {run}` follows it\n"
    )
    # Delivered at once: the next poll has it, its failures still on it.
    poller = PollStream(tasks, tasks_pb2.PollRequest(group=group, worker_id="w2", capacity=1), WAIT)
    try:
        again = poller.next_response().task
    finally:
        poller.cancel()
    assert (again.id, again.failed_attempts) == (failed.id, 1)


def test_retry_now_as_json_and_refusals(
    server: ServerProcess,
    client: Client,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = wid()
    pause(client, tasks, group, run)
    code, out, _ = troth(server, capsys, "--json", "workflows", "retry-now", run)
    assert code == 0
    task = json.loads(out)
    assert (task["root_promise_id"], task["state"], task["failed_attempts"]) == (run, "PENDING", 1)
    asked = datetime.now(UTC)
    retry = datetime.fromisoformat(task["next_attempt_time"].replace("Z", "+00:00"))
    assert abs((retry - asked).total_seconds()) < 5

    waiting = wid()
    client.start("publish", id=waiting, group=group)  # never failed
    code, out, err = troth(server, capsys, "workflows", "retry-now", waiting)
    assert code == 1 and out == ""
    assert err.startswith("troth: error: ") and "WORKFLOW_NOT_PAUSED" in err
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    client.create(plain)
    code, _, err = troth(server, capsys, "workflows", "retry-now", plain)
    assert code == 1 and "NOT_A_WORKFLOW" in err


# --- show: the timeline by the parent link -------------------------------------------


def test_show_keeps_a_named_decision_after_the_run_ends(
    server: ServerProcess,
    client: Client,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    channel: grpc.Channel,
    group: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    promises = promises_pb2_grpc.PromiseServiceStub(channel)
    run = wid()
    decision = f"approval-{run}"  # an id of its own: not under the workflow's
    client.start("review", id=run, group=group)
    poller = PollStream(tasks, tasks_pb2.PollRequest(group=group, worker_id="w1", capacity=1), WAIT)
    try:
        task = poller.next_response().task
        fence = types_pb2.TaskFence(task_id=task.id, counter=task.counter, worker_id="w1")
        promises.CreatePromise(
            promises_pb2.CreatePromiseRequest(
                id=decision, fence=fence, tags={"troth:kind": "promise"}
            ),
            timeout=10,
        )
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                task_id=task.id, counter=task.counter, worker_id="w1", suspend_on=[decision]
            ),
            timeout=10,
        )
        with Client(server.address, principal="alice") as alice:
            alice.resolve(decision, {"approved": True})
        task = poller.next_response().task  # resumed: it finishes
        tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(
                task_id=task.id,
                counter=task.counter,
                worker_id="w1",
                resolve_root=types_pb2.Payload(data=b'"published"'),
            ),
            timeout=10,
        )
    finally:
        poller.cancel()
    assert client.get(run).state is PromiseState.RESOLVED

    code, out, err = troth(server, capsys, "workflows", "show", run)
    assert (code, err) == (0, "")
    [line] = [line for line in out.splitlines() if line.startswith(decision)]
    assert line.split()[:3] == [decision, "promise", "RESOLVED"]
    assert line.endswith('alice       {"approved":true}')
    settled = client.get(decision).settle_time
    assert settled is not None and settled.strftime("%Y-%m-%d %H:%M:%SZ") in line
    code, out, _ = troth(server, capsys, "--json", "workflows", "show", run)
    [step] = json.loads(out)["steps"]
    assert (step["id"], step["settled_by"], step["value"]) == (
        decision,
        "alice",
        {"approved": True},
    )
