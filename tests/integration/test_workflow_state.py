"""Workflow state slots against a real server, on SQLite and PostgreSQL (issue 31): a
workflow reads and writes its slot as recorded steps; an operator's rewrite
(`Client.replace_state`) is a compare-and-swap made only while the run is parked, and
racing a resume (its awaited promise settled, a worker claims the task), a sweep (the
awaited promise times out, the resume follows) or a second rewrite, exactly one wins
and the loser is told `won=False` and what it lost to; a replay elsewhere returns the
reads the run recorded, and a read after a rewrite sees the rewrite.

The races are made deterministic by the rewrite itself: `replace_state` calls the
rewrite between its read and its write, and the rewrite here makes the other party
win first (settles the promise and waits until a worker holds the task; lets the
promise time out and waits for the same; makes a second rewrite)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from _support import ServerProcess, error_info, eventually, exists, run_cli
from google.protobuf.duration_pb2 import Duration

from troth import Client, Context, StateLostTo, Worker
from troth.errors import FailedPreconditionError, PromiseTimedOutError, Reason
from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

_holds: dict[str, threading.Event] = {}
"""Per workflow: set to let its `hold` step return (until then a worker holds its task)."""


def hold(workflow_id: str) -> str:
    gate = _holds.setdefault(workflow_id, threading.Event())
    assert gate.wait(30), f"{workflow_id}: never released"
    return "released"


def chat(ctx: Context, timeout_s: float) -> Generator[Any, Any, dict[str, Any]]:
    """Reads and writes its thread, parks on an approval, reads the thread again."""
    first = yield ctx.state("thread", default=[])
    version = yield ctx.set_state("thread", [*first, "asked"])
    approval = yield ctx.promise(id=f"{ctx.id}.approval", timeout=timedelta(seconds=timeout_s))
    try:
        decision = yield approval
    except PromiseTimedOutError:
        decision = "timed out"
    after = yield ctx.state("thread", default=[])
    yield ctx.run(hold, ctx.id)
    return {"first": first, "version": version, "decision": decision, "after": after}


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as c:
        yield c


@pytest.fixture
def group() -> str:
    return f"st-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def worker(client: Client, group: str) -> Iterator[Worker]:
    w = Worker(client, group=group, lease=timedelta(seconds=10))
    w.workflow(chat)
    w.start()
    yield w
    for gate in _holds.values():
        gate.set()
    w.stop()


def parked(client: Client, wid: str, version: int) -> bool:
    state = client.get_state(wid, "thread")
    return bool(state.parked) and state.version == version


def start_parked(client: Client, group: str, timeout_s: float = 60.0) -> str:
    wid = f"{group}-{uuid.uuid4().hex[:6]}"
    client.start("chat", timeout_s, id=wid, group=group)
    eventually(lambda: parked(client, wid, 1), what=f"{wid} parked at version 1")
    return wid


def held(client: Client, wid: str) -> bool:
    return client.get_state(wid, "thread").parked is False


def test_a_rewrite_while_parked_wins_and_the_resumed_run_reads_it(
    client: Client, group: str, worker: Worker
) -> None:
    wid = start_parked(client, group)
    state = client.get_state(wid, "thread")
    assert (state.version, state.value, state.updated_by) == (1, ["asked"], "workflow")
    replaced = client.replace_state(wid, "thread", lambda thread: [*thread, "operator note"])
    assert replaced.won and replaced.lost_to is StateLostTo.NONE
    assert (replaced.based_on, replaced.state.version) == (1, 2)
    assert replaced.state.value == ["asked", "operator note"]
    handle = client.handle(wid)
    client.resolve(f"{wid}.approval", "yes")
    eventually(lambda: held(client, wid), what="the resume claimed")
    _holds.setdefault(wid, threading.Event()).set()
    assert handle.result(timeout=30) == {
        "first": [],
        "version": 1,
        "decision": "yes",
        "after": ["asked", "operator note"],  # a read after the rewrite sees it
    }


def test_a_resume_that_claims_first_wins_and_the_rewrite_is_told(
    client: Client, group: str, worker: Worker
) -> None:
    wid = start_parked(client, group)

    def rewrite(thread: list[str]) -> list[str]:
        client.resolve(f"{wid}.approval", "yes")  # the resume
        eventually(lambda: held(client, wid), what="a worker holding the resumed task")
        return [*thread, "too late"]

    replaced = client.replace_state(wid, "thread", rewrite)
    assert not replaced.won
    assert replaced.lost_to is StateLostTo.TASK_CLAIMED
    assert "claimed the task" in replaced.message
    assert (replaced.state.version, replaced.state.value) == (1, ["asked"])
    # While a worker holds the task, a rewrite is refused before it is even computed.
    with pytest.raises(FailedPreconditionError) as refused:
        client.replace_state(wid, "thread", lambda t: pytest.fail("rewrite must not run"))
    assert refused.value.reason == Reason.WORKFLOW_NOT_PARKED
    assert "holds its task" in refused.value.message
    _holds.setdefault(wid, threading.Event()).set()
    assert client.handle(wid).result(timeout=30)["after"] == ["asked"]


def test_a_sweep_that_resumes_first_wins_and_the_rewrite_is_told(
    client: Client, group: str, worker: Worker
) -> None:
    wid = start_parked(client, group, timeout_s=3.0)

    def rewrite(thread: list[str]) -> list[str]:
        # The approval times out (the sweeper, every 200 ms): the run resumes.
        eventually(lambda: held(client, wid), what="the timed-out wait resumed")
        return [*thread, "too late"]

    replaced = client.replace_state(wid, "thread", rewrite)
    assert (replaced.won, replaced.lost_to) == (False, StateLostTo.TASK_CLAIMED)
    assert replaced.state.version == 1
    _holds.setdefault(wid, threading.Event()).set()
    result = client.handle(wid).result(timeout=30)
    assert (result["decision"], result["after"]) == ("timed out", ["asked"])


def test_of_two_rewrites_the_first_to_write_wins_and_the_other_is_told(
    client: Client, group: str, worker: Worker
) -> None:
    wid = start_parked(client, group)
    inner: list[Any] = []

    def rewrite(thread: list[str]) -> list[str]:
        inner.append(client.replace_state(wid, "thread", lambda t: [*t, "second"]))
        return [*thread, "first"]

    replaced = client.replace_state(wid, "thread", rewrite)
    assert inner[0].won and inner[0].state.version == 2
    assert not replaced.won
    assert replaced.lost_to is StateLostTo.VERSION_CHANGED
    assert (replaced.state.version, replaced.state.value) == (2, ["asked", "second"])
    assert "version 2" in replaced.message and "not 1" in replaced.message
    client.resolve(f"{wid}.approval", "yes")
    _holds.setdefault(wid, threading.Event()).set()
    assert client.handle(wid).result(timeout=30)["after"] == ["asked", "second"]


def test_a_rewrite_that_the_runs_end_overtakes_is_told(
    client: Client, group: str, worker: Worker
) -> None:
    wid = start_parked(client, group)

    def rewrite(thread: list[str]) -> list[str]:
        client.cancel(wid)
        return [*thread, "too late"]

    replaced = client.replace_state(wid, "thread", rewrite)
    assert (replaced.won, replaced.lost_to) == (False, StateLostTo.RUN_ENDED)
    assert "ended" in replaced.message
    with pytest.raises(FailedPreconditionError) as refused:
        client.replace_state(wid, "thread", lambda t: t)
    assert refused.value.reason == Reason.WORKFLOW_NOT_PARKED
    assert "over" in refused.value.message


def test_a_validator_refusal_writes_nothing(client: Client, group: str, worker: Worker) -> None:
    wid = start_parked(client, group)

    def refuse(thread: list[str]) -> None:
        if not thread:
            raise ValueError("the thread must not be empty")

    with pytest.raises(ValueError, match="must not be empty"):
        client.replace_state(wid, "thread", lambda t: [], validate=refuse)
    assert client.get_state(wid, "thread").version == 1
    client.cancel(wid)


def test_a_replay_elsewhere_returns_the_reads_the_run_recorded(
    client: Client, group: str, worker: Worker
) -> None:
    """The first worker parks the run and stops; the slot is rewritten; a second worker
    (no cache: a replay from the history) gets the first read as recorded (empty),
    though the slot now holds more, and the read after the wait sees the rewrite."""
    wid = start_parked(client, group)
    worker.stop()
    assert client.replace_state(wid, "thread", lambda t: ["rewritten"]).won
    client.resolve(f"{wid}.approval", "ok")
    other = Worker(client, group=group, lease=timedelta(seconds=10))
    other.workflow(chat)
    other.start()
    try:
        _holds.setdefault(wid, threading.Event()).set()
        assert client.handle(wid).result(timeout=30) == {
            "first": [],
            "version": 1,
            "decision": "ok",
            "after": ["rewritten"],
        }
    finally:
        other.stop()


def test_a_slot_is_pruned_with_its_workflow(
    client: Client, group: str, worker: Worker, server: ServerProcess
) -> None:
    wid = start_parked(client, group)
    client.resolve(f"{wid}.approval", "yes")
    _holds.setdefault(wid, threading.Event()).set()
    client.handle(wid).result(timeout=30)
    with server.channel() as channel:
        prune = promises_pb2_grpc.PromiseServiceStub(channel).PrunePromises
        eventually(
            lambda: (
                prune(promises_pb2.PrunePromisesRequest(older_than=Duration())).workflows
                and not exists(client, wid)
            ),
            what=f"{wid} pruned",
        )
    # A new run of the same id starts with no slot: the old one went with its root.
    _holds.pop(wid, None)
    start = client.start("chat", 60.0, id=wid, group=group)
    eventually(lambda: parked(client, wid, 1), what="the new run parked")
    assert client.get_state(wid, "thread").value == ["asked"]
    client.cancel(start.id)


def test_the_cli_reads_and_replaces_a_slot(
    client: Client, group: str, worker: Worker, server: ServerProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    wid = start_parked(client, group)
    code, out, _ = run_cli(server, capsys, "workflows", "state", "get", wid, "thread")
    assert code == 0
    assert "version 1" in out and "the run is parked" in out and '["asked"]' in out
    code, out, _ = run_cli(
        server, capsys, "workflows", "state", "replace", wid, "thread", "--value", '["short"]'
    )
    assert (code, out) == (0, f"workflow {wid} state 'thread': version 1 -> 2\n")
    code, out, _ = run_cli(server, capsys, "--json", "workflows", "state", "get", wid, "thread")
    assert code == 0 and '"version": 2' in out and '"value": ["short"]' in out
    client.cancel(wid)
    code, out, err = run_cli(
        server, capsys, "workflows", "state", "replace", wid, "thread", "--value", "[]"
    )
    assert code != 0 and "WORKFLOW_NOT_PARKED" in err + out


def test_bad_requests_name_their_field(client: Client, server: ServerProcess) -> None:
    with server.channel() as channel:
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        cases = [
            (tasks_pb2.GetWorkflowStateRequest(workflow_id="w", name=""), "name"),
            (tasks_pb2.GetWorkflowStateRequest(workflow_id="w", name="a b"), "name"),
            (tasks_pb2.GetWorkflowStateRequest(workflow_id="w", name="x" * 129), "name"),
            (tasks_pb2.GetWorkflowStateRequest(workflow_id="", name="n"), "workflow_id"),
        ]
        for request, field in cases:
            with pytest.raises(grpc.RpcError) as caught:
                tasks.GetWorkflowState(request, timeout=10)
            assert_invalid(caught.value, field)
        replaces = [
            (tasks_pb2.ReplaceWorkflowStateRequest(workflow_id="w", name="n"), "value"),
            (
                tasks_pb2.ReplaceWorkflowStateRequest(
                    workflow_id="w",
                    name="n",
                    value=types.Payload(headers={"content-type": "application/json"}, data=b"{"),
                ),
                "value",
            ),
            (
                tasks_pb2.ReplaceWorkflowStateRequest(
                    workflow_id="w", name="n", value=types.Payload(data=b"x" * 2_000_000)
                ),
                "value",
            ),
            (
                tasks_pb2.ReplaceWorkflowStateRequest(
                    workflow_id="w", name="n", value=types.Payload(), expected_version=-1
                ),
                "expected_version",
            ),
        ]
        for replace_request, field in replaces:
            with pytest.raises(grpc.RpcError) as caught:
                tasks.ReplaceWorkflowState(replace_request, timeout=10)
            assert_invalid(caught.value, field)
    with pytest.raises(ValueError, match="name must be"):
        client.get_state("w", "")


def assert_invalid(error: BaseException, field: str) -> None:
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error_info(error).metadata["field"] == field, (field, error.details())
