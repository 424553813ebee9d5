"""A bug pauses, it does not lose (issue 12 item 5), with real servers and worker processes.

`publish` records a draft, waits for an approval, and then, in its first
version, uses a misspelt name: a `NameError` after the approval. The root
stays PENDING while the task is retried with backoff, its attempts growing,
the traceback shown by `troth tasks list` and `troth workflows show`. A worker
with the fixed function (declaring the old version compatible) resumes it from
its checkpoints: the draft is not redone and the approval is not lost.

Every bug pauses (issue 27 item 5), not only one in workflow code: a
`NameError` in a `ctx.run` step's function past the approval (the default
retry policy has no maximum: a few attempts in the task, then the task fails,
the step unrecorded), a value the codec cannot encode (a step's result, the
workflow's result) and an exception the workflow raises while replaying,
before it reached its recorded steps: each pauses with the real exception and
traceback, and resumes on the worker with the fix, the approval kept.

Failing on purpose rejects the root: `raise troth.WorkflowFailed(...)`, an
exception the workflow declares (`fail_on`), an uncaught rejection, and an
operator's `troth workflows fail ID --reason`. On SQLite and PostgreSQL.

This file, run as a script, is the worker (`python test_bug_pauses.py ADDRESS MODE [VERSION]`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from troth import Client, Context, PromiseState, Worker, WorkflowFailed
from troth._cli import main as troth_cli
from troth._tasks import TaskCalls
from troth.client import connection

sys.path.insert(0, str(Path(__file__).parent.parent))

from _pg import fresh_schema
from _support import ServerProcess, start_server
from _workers import WorkerFleet, effect

if TYPE_CHECKING:
    from troth.v1 import tasks_pb2

GROUP = "pausing"


def draft(workflow_id: str) -> str:
    return effect(f"{workflow_id} drafted")


def send(workflow_id: str, decision: Any) -> str:
    return effect(f"{workflow_id} sent {json.dumps(decision)}")


def publish_buggy(ctx: Context, post: str) -> Generator[Any, Any, Any]:
    yield ctx.run(draft, ctx.id)
    approval = yield ctx.promise(title=f"publish {post}?")
    decision = yield approval
    yield ctx.run(send, ctx.id, decison)  # type: ignore[name-defined]  # noqa: F821  # the bug
    return {"post": post, "decision": decision}


def publish_fixed(ctx: Context, post: str) -> Generator[Any, Any, Any]:
    yield ctx.run(draft, ctx.id)
    approval = yield ctx.promise(title=f"publish {post}?")
    decision = yield approval
    yield ctx.run(send, ctx.id, decision)
    return {"post": post, "decision": decision}


def strict(ctx: Context, amount: int) -> Generator[Any, Any, Any]:
    yield ctx.now()
    if amount < 0:
        raise ValueError(f"amount {amount} is negative")
    return amount


def gives_up(ctx: Context) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(title="go on?")
    decision = yield approval
    if not decision:
        raise WorkflowFailed("nobody wants it", {"decision": decision})
    return decision


def asks(ctx: Context) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(title="allowed?")
    return (yield approval)  # a rejection raises here, uncaught: the workflow fails


def crashes(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.now()
    return {}["missing"]  # a KeyError: a bug, nothing declared


FIXED_ENV = "TROTH_TEST_FIXED"
"""Set for the worker with the fix deployed (the workflows' source, so their version,
is the same; the step functions and the codec's input behave as fixed)."""
SETTING_ENV = "TROTH_TEST_SETTING"
"""A setting `replays` reads at its top: a deploy that lacks it raises KeyError."""


def notify(workflow_id: str, decision: Any) -> str:
    if FIXED_ENV not in os.environ:
        return effect(f"{workflow_id} notified {decison}")  # type: ignore[name-defined]  # noqa: F821
    return effect(f"{workflow_id} notified {json.dumps(decision)}")


def notifies(ctx: Context, post: str) -> Generator[Any, Any, Any]:
    yield ctx.run(draft, ctx.id)
    approval = yield ctx.promise(title=f"publish {post}?")
    decision = yield approval
    yield ctx.run(notify, ctx.id, decision)  # the bug is in the step's function
    return {"post": post, "decision": decision}


def labels(workflow_id: str) -> Any:
    effect(f"{workflow_id} labelled")
    found = ["a", "b"]
    return found if FIXED_ENV in os.environ else set(found)  # a set: JSON cannot encode it


def labels_step(ctx: Context) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(title="label it?")
    decision = yield approval
    found = yield ctx.run(labels, ctx.id)  # the step's result cannot be encoded
    return {"labels": found, "decision": decision}


def labels_result(ctx: Context) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(title="label it?")
    decision = yield approval
    found = yield ctx.run(draft, ctx.id)
    # The workflow's result cannot be encoded (a set), until the fix.
    return [found, decision] if FIXED_ENV in os.environ else {found, decision}


def replays(ctx: Context, post: str) -> Generator[Any, Any, Any]:
    prefix = os.environ[SETTING_ENV]  # a KeyError where the deploy lacks the setting
    approval = yield ctx.promise(title=f"{prefix}: publish {post}?")
    decision = yield approval
    yield ctx.run(send, ctx.id, decision)
    return {"post": post, "decision": decision}


def main(address: str, mode: str, *versions: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=GROUP, lease=timedelta(seconds=5))
        if mode == "buggy":
            worker.workflow(name="publish")(publish_buggy)
        else:  # the deploy of the fix: the paused workflows' version is declared compatible
            worker.workflow(name="publish", compatible=tuple(versions))(publish_fixed)
        worker.workflow(fail_on=(ValueError,))(strict)
        worker.workflow(gives_up)
        worker.workflow(asks)
        worker.workflow(crashes)
        for workflow in (notifies, labels_step, labels_result, replays):
            worker.workflow(workflow)
        worker.run()


# --- the tests --------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def paused_server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        proc = start_server(tmp_path / "server", "--sweep-interval", "200ms", db_url=db_url)
        yield proc
        assert proc.stop() == 0, f"unclean shutdown:\n{proc.log()[-3000:]}"


@pytest.fixture
def fleet(tmp_path: Path, paused_server: ServerProcess) -> Iterator[WorkerFleet]:
    workers = WorkerFleet(tmp_path, __file__, paused_server.address)
    yield workers
    workers.stop_all()


def cli(server: ServerProcess, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = troth_cli(["--server", server.address, *args])
    return status, out.getvalue(), err.getvalue()


def task_of(client: Client, root_id: str) -> tasks_pb2.Task | None:
    found = TaskCalls(connection(client)).search(GROUP, 1, root_id)
    return found[0] if found else None


def attempts(client: Client, root_id: str) -> Callable[[], int]:
    def count() -> int:
        task = task_of(client, root_id)
        return 0 if task is None else task.failed_attempts

    return count


def test_a_name_error_after_an_approval_pauses_the_workflow_until_fixed_code_resumes_it(
    paused_server: ServerProcess, fleet: WorkerFleet
) -> None:
    wid = f"publish-{uuid.uuid4().hex[:6]}"
    with Client(paused_server.address) as client:
        buggy = fleet.start("buggy")
        client.start("publish", "post-1", id=wid, group=GROUP)
        fleet.eventually(lambda: bool(list(client.search_all(f"{wid}.1"))), 30, "the approval step")
        client.resolve(f"{wid}.1", {"approved": True})

        # The bug fails the task, again and again after a backoff; the root waits.
        failed = attempts(client, wid)
        fleet.eventually(lambda: failed() >= 2, 30, "the task to fail twice")
        assert client.get(wid).state is PromiseState.PENDING
        task = task_of(client, wid)
        assert task is not None
        assert task.last_error == "NameError: name 'decison' is not defined"
        assert "Traceback (most recent call last):" in task.last_traceback
        assert "yield ctx.run(send, ctx.id, decison)" in task.last_traceback
        version = client.get(wid).workflow_version
        assert version
        (typed,) = [t for t in client.search_tasks(GROUP) if t.root_id == wid]
        assert typed.failed_attempts >= 2 and typed.last_error == task.last_error

        # What an operator sees.
        status, out, _ = cli(paused_server, "tasks", "list", "--group", GROUP)
        assert status == 0
        assert "ATTEMPTS" in out and "NameError: name 'decison' is not defined" in out
        assert "retry at" in out or " CLAIMED " in out
        status, out, _ = cli(paused_server, "workflows", "show", wid)
        assert status == 0, out
        assert "state:" in out and "PENDING" in out
        assert f"{wid}.1" in out and '{"approved":true}' in out  # the approval, recorded
        assert "failed" in out and "error:     NameError" in out
        assert "Traceback (most recent call last):" in out
        status, out, _ = cli(paused_server, "--json", "workflows", "show", wid)
        shown = json.loads(out)
        assert shown["workflow"]["state"] == "PENDING"
        assert shown["task"]["failed_attempts"] >= 2
        assert shown["task"]["last_error"].startswith("NameError")

        # The worker logged each attempt once, at ERROR, with its traceback.
        log = fleet.log(buggy)
        assert log.count(f"(task {task.id}, attempt 1) raised NameError") == 1
        assert log.count(f"(task {task.id}, attempt 2) raised NameError") == 1
        assert "ERROR troth.worker" in log and "Traceback (most recent call last):" in log
        assert f"compatible=({version!r},)" in log

        # Deploy the fix: the old worker goes, one with the fixed code comes.
        assert fleet.terminate(buggy) == 0
        fleet.start("fixed", version)
        assert client.wait(wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(wid).value) == {
            "post": "post-1",
            "decision": {"approved": True},
        }
        assert task_of(client, wid) is None
    # Resumed from its checkpoints: drafted once, the approval given once was used.
    assert fleet.counts() == {f"{wid} drafted": 1, f'{wid} sent {{"approved": true}}': 1}


def test_a_workflow_fails_only_on_purpose(paused_server: ServerProcess, fleet: WorkerFleet) -> None:
    run = uuid.uuid4().hex[:6]
    with Client(paused_server.address) as client:
        fleet.start("buggy")
        declared = client.start("strict", -5, id=f"strict-{run}", group=GROUP)
        given_up = client.start(gives_up, id=f"gives-up-{run}", group=GROUP)
        refused = client.start(asks, id=f"asks-{run}", group=GROUP)
        paused = client.start(crashes, id=f"crashes-{run}", group=GROUP)
        fleet.eventually(
            lambda: bool(list(client.search_all(f"gives-up-{run}.0"))), 30, "the approval step"
        )
        client.resolve(f"gives-up-{run}.0", False)
        fleet.eventually(lambda: bool(list(client.search_all(f"asks-{run}.0"))), 30, "the approval")
        client.reject(f"asks-{run}.0", {"reason": "not allowed"})

        outcomes = {h.id: client.wait(h.id, timeout=30) for h in (declared, given_up, refused)}
        for root in outcomes.values():
            assert root.state is PromiseState.REJECTED, root
        assert client.decode(outcomes[declared.id].value) == {
            "type": "ValueError",
            "message": "amount -5 is negative",
        }
        assert client.decode(outcomes[given_up.id].value) == {
            "type": "troth.errors.WorkflowFailed",
            "message": "nobody wants it",
        }
        assert client.decode(outcomes[refused.id].value)["type"] == (
            "troth.errors.PromiseRejectedError"
        )

        # A KeyError nobody declared pauses; the operator fails it on purpose.
        fleet.eventually(lambda: attempts(client, paused.id)() >= 1, 30, "crashes to fail")
        assert client.get(paused.id).state is PromiseState.PENDING
        status, out, err = cli(
            paused_server, "workflows", "fail", paused.id, "--reason", "bad input, given up"
        )
        assert status == 0, err
        assert "REJECTED" in out
        root = client.get(paused.id)
        assert root.state is PromiseState.REJECTED
        value = client.decode(root.value)
        assert value["type"] == "troth.errors.WorkflowFailed"
        assert value["message"] == "bad input, given up"
        # Its task, waiting out a backoff or running, ends: it is gone from the list.
        fleet.eventually(lambda: task_of(client, paused.id) is None, 30, "the task to end")
        # A second fail is refused: the workflow is settled already.
        status, _, err = cli(paused_server, "workflows", "fail", paused.id, "--reason", "again")
        assert status == 1 and "already" in err


def test_a_name_error_in_a_step_past_the_approval_pauses_until_the_fix_resumes_it(
    paused_server: ServerProcess, fleet: WorkerFleet
) -> None:
    wid = f"notifies-{uuid.uuid4().hex[:6]}"
    with Client(paused_server.address) as client:
        buggy = fleet.start("buggy")
        client.start(notifies, "post-1", id=wid, group=GROUP)
        fleet.eventually(lambda: bool(list(client.search_all(f"{wid}.1"))), 30, "the approval step")
        client.resolve(f"{wid}.1", {"approved": True})

        # The default retry policy has no maximum: 3 attempts in the task, then the task
        # fails (the server retries it after a backoff) and nothing is recorded for the step.
        fleet.eventually(lambda: attempts(client, wid)() >= 1, 30, "the task to fail")
        assert client.get(wid).state is PromiseState.PENDING  # not rejected: the approval kept
        assert not list(client.search_all(f"{wid}.2"))  # the step is not recorded as rejected
        task = task_of(client, wid)
        assert task is not None
        assert task.last_error == "NameError: name 'decison' is not defined"
        assert task.last_traceback.startswith(f"step '{wid}.2' (notify) failed 3 times")
        assert "Traceback (most recent call last):" in task.last_traceback
        assert 'notified {decison}")' in task.last_traceback
        status, out, _ = cli(paused_server, "tasks", "list", "--group", GROUP)
        assert status == 0 and "NameError: name 'decison' is not defined" in out
        log = fleet.log(buggy)
        assert f"(task {task.id}, attempt 1) raised NameError" in log
        assert f"(step '{wid}.2' (notify) failed 3 times in this task" in log
        assert log.count("failed on attempt 2 of 3 in this task (no maximum)") >= 1

        # The fix deployed: the old worker goes, one with the fixed step function comes
        # (the workflow's source, so its version, is the same).
        assert fleet.terminate(buggy) == 0
        fleet.start("fixed", env={FIXED_ENV: "1"})
        assert client.wait(wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(wid).value) == {
            "post": "post-1",
            "decision": {"approved": True},
        }
    # Drafted once; the approval given before the bug is the one used.
    assert fleet.counts() == {f"{wid} drafted": 1, f'{wid} notified {{"approved": true}}': 1}


def test_a_value_the_codec_cannot_encode_pauses_until_the_fix_resumes_it(
    paused_server: ServerProcess, fleet: WorkerFleet
) -> None:
    run = uuid.uuid4().hex[:6]
    step_wid, result_wid = f"labels-step-{run}", f"labels-result-{run}"
    with Client(paused_server.address) as client:
        buggy = fleet.start("buggy")
        client.start(labels_step, id=step_wid, group=GROUP)
        client.start(labels_result, id=result_wid, group=GROUP)
        for wid in (step_wid, result_wid):
            fleet.eventually(
                lambda wid=wid: bool(list(client.search_all(f"{wid}.0"))), 30, "the approvals"
            )
            client.resolve(f"{wid}.0", "yes")
        for wid in (step_wid, result_wid):
            fleet.eventually(lambda wid=wid: attempts(client, wid)() >= 1, 30, f"{wid} to fail")
            assert client.get(wid).state is PromiseState.PENDING  # paused, not rejected

        step_task, result_task = task_of(client, step_wid), task_of(client, result_wid)
        assert step_task is not None and result_task is not None
        for task in (step_task, result_task):
            assert task.last_error.startswith("TypeError: JsonCodec cannot encode 'set' values")
            assert "Traceback (most recent call last):" in task.last_traceback
        assert step_task.last_traceback.startswith(
            f"encoding the result of step '{step_wid}.1' (labels) (a set) with the codec"
        )
        assert not list(client.search_all(f"{step_wid}.1"))  # nothing recorded for the step
        assert result_task.last_traceback.startswith(
            "encoding the workflow's result (a set) with the codec"
        )
        assert "raised TypeError" in fleet.log(buggy)

        assert fleet.terminate(buggy) == 0
        fleet.start("fixed", env={FIXED_ENV: "1"})
        assert client.wait(step_wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(step_wid).value) == {
            "labels": ["a", "b"],
            "decision": "yes",
        }
        assert client.wait(result_wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(result_wid).value) == [f"{result_wid} drafted", "yes"]
    # The result step ran once and was recorded: the fix re-ran only the encode.
    assert fleet.counts()[f"{result_wid} drafted"] == 1


def test_an_exception_raised_while_replaying_pauses_with_the_real_error(
    paused_server: ServerProcess, fleet: WorkerFleet
) -> None:
    wid = f"replays-{uuid.uuid4().hex[:6]}"
    with Client(paused_server.address) as client:
        first = fleet.start("fixed", env={SETTING_ENV: "blog"})
        client.start(replays, "post-1", id=wid, group=GROUP)
        fleet.eventually(lambda: bool(list(client.search_all(f"{wid}.0"))), 30, "the approval")
        assert client.get(f"{wid}.0").title == "blog: publish post-1?"
        fleet.kill(first)  # the old deploy goes; the wait lives on the server

        # A deploy without the setting: the replay raises before its first recorded step.
        broken = fleet.start("fixed")
        fleet.eventually(lambda: "polling group" in fleet.log(broken), 30, "the worker to poll")
        client.resolve(f"{wid}.0", {"approved": True})
        fleet.eventually(lambda: attempts(client, wid)() >= 1, 30, "the task to fail")
        assert client.get(wid).state is PromiseState.PENDING
        task = task_of(client, wid)
        assert task is not None
        assert task.last_error == f"KeyError: '{SETTING_ENV}'"  # the real error, not a replay's
        assert task.last_traceback.startswith(
            f"raised while replaying, before the code reached recorded step 0 ('{wid}.0'), promise"
        )
        assert "Traceback (most recent call last):" in task.last_traceback
        assert "prefix = os.environ[SETTING_ENV]" in task.last_traceback
        assert "(task" in fleet.log(broken) and "raised KeyError" in fleet.log(broken)

        assert fleet.terminate(broken) == 0
        fleet.start("fixed", env={SETTING_ENV: "blog"})
        assert client.wait(wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(wid).value) == {
            "post": "post-1",
            "decision": {"approved": True},
        }
    assert fleet.counts() == {f'{wid} sent {{"approved": true}}': 1}


if __name__ == "__main__":
    main(*sys.argv[1:])
