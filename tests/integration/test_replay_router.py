"""The router of issue 9: a branch switched between suspend and resume fails, never mixes.

`router` picks its branch from a routing file it reads outside any step (its
input: here a rule file a deploy changes), runs `do_branch(branch)`, then
waits on an approval and applies it to the branch. It suspends on the
approval with the `human_review` branch recorded; the worker is replaced and
the routing file now says `auto_reply`; the approval comes in. Before replay
checked arguments, the resumed run reused the step recorded for
`human_review` and applied the approval given for it to `auto_reply` (the
root resolved). Now the task fails with NonDeterminismError naming step 0 and both commands, and no
step of the other branch runs. A task failure, not the workflow's (issue 12 item 5): the root
stays PENDING while the task is retried with backoff, the error recorded on it, and once the
input is put right the next attempt resumes the workflow on its recorded branch.

`asker` is issue 27's router (item 4): both branches park on the same-shaped
approval, which differs only in what the human reads: its title, its tags or
its approvers. The promise's digest covered only its id, timeout and schema,
so the resumed run finished as `auto_reply` with the approval given to the
`human_review` question. Now each fails its task with NonDeterminismError
naming step 0 and both questions, and resumes on its recorded branch once the
input is put right.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_replay_router.py ADDRESS`).
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from troth import Approvers, Client, Context, PromiseState, Worker
from troth._tasks import TaskCalls
from troth.client import connection

sys.path.insert(0, str(Path(__file__).parent.parent))

from _workers import WorkerFleet, effect, suspended

if TYPE_CHECKING:
    from _support import ServerProcess

    from troth.v1 import tasks_pb2

GROUP = "router"
ROUTE_ENV = "TROTH_TEST_ROUTE_FILE"


def do_branch(workflow_id: str, branch: str) -> str:
    return effect(f"{workflow_id} {branch}")


def router(ctx: Context, ticket: str) -> Generator[Any, Any, Any]:
    branch = Path(os.environ[ROUTE_ENV]).read_text().strip()  # input outside the history
    yield ctx.run(do_branch, ctx.id, branch)
    approval = yield ctx.promise(title=f"{branch} for {ticket}?")
    decision = yield approval
    yield ctx.run(do_branch, ctx.id, f"{branch} applied {decision}")
    return branch


def asker(ctx: Context, ticket: str, asked: str) -> Generator[Any, Any, Any]:
    branch = Path(os.environ[ROUTE_ENV]).read_text().strip()  # input outside the history
    # The same shape on both branches: only what `asked` names says which branch asks.
    approval = yield ctx.promise(
        title=f"Approve the {branch} branch?" if asked == "title" else f"Approve {ticket}?",
        tags={"branch": branch} if asked == "tags" else None,
        approvers=Approvers(principals=[f"{branch}-lead"]) if asked == "approvers" else None,
    )
    decision = yield approval
    yield ctx.run(do_branch, ctx.id, f"{branch} applied {decision}")
    return {"branch": branch, "decision": decision}


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=GROUP, lease=timedelta(seconds=5))
        worker.workflow(router)
        worker.workflow(asker)
        worker.run()


def test_a_router_whose_branch_changed_on_resume_fails_its_task_instead_of_switching(
    own_server: ServerProcess, fleet: WorkerFleet, tmp_path: Path
) -> None:
    route = tmp_path / "route"
    route.write_text("human_review\n")
    env = {ROUTE_ENV: str(route)}
    wid = f"router-{uuid.uuid4().hex[:6]}"
    with Client(own_server.address) as client:
        first = fleet.start(env=env)
        client.start(router, "ticket-1", id=wid, group=GROUP)
        fleet.eventually(
            lambda: suspended(own_server.db_url, wid) == 1, 30, "the router to wait for approval"
        )
        fleet.kill(first)  # the old worker goes (a deploy); the wait lives on the server
        assert fleet.lines() == [f"{wid} human_review"]
        recorded = client.get(f"{wid}.0").tags["troth:args"]

        route.write_text("auto_reply\n")  # the input changed while it waited
        second = fleet.start(env=env)
        fleet.eventually(
            lambda: "polling group" in fleet.log(second), 30, "the second worker to start"
        )
        client.resolve(f"{wid}.1", "approved")

        def failed_task() -> tasks_pb2.Task | None:
            found = TaskCalls(connection(client)).search(GROUP, 1, wid)
            return found[0] if found and found[0].failed_attempts else None

        fleet.eventually(lambda: failed_task() is not None, 30, "the router's task to fail")
        assert client.get(wid).state is PromiseState.PENDING  # paused, not lost
        task = failed_task()
        assert task is not None
        message = task.last_error
        assert message.startswith("troth.errors.NonDeterminismError: ")
        assert f"step 0 ('{wid}.0')" in message
        assert f"run(do_branch) with arguments digest {recorded}" in message
        assert f"run(do_branch) with arguments ('{wid}', 'auto_reply')" in message
        # Neither the recorded human_review step nor the approval was used for auto_reply.
        assert fleet.lines() == [f"{wid} human_review"]

        route.write_text("human_review\n")  # the input put right: the next attempt resumes
        assert client.wait(wid, timeout=60).state is PromiseState.RESOLVED
        assert client.decode(client.get(wid).value) == "human_review"
        assert fleet.terminate(second) == 0
    assert fleet.lines() == [f"{wid} human_review", f"{wid} human_review applied approved"]
    assert "Traceback" not in fleet.logs()


def test_a_router_whose_question_changed_while_parked_fails_its_task_naming_both_questions(
    own_server: ServerProcess, fleet: WorkerFleet, tmp_path: Path
) -> None:
    route = tmp_path / "route"
    route.write_text("human_review\n")
    env = {ROUTE_ENV: str(route)}
    run = uuid.uuid4().hex[:6]
    wids = {asked: f"asker-{run}-{asked}" for asked in ("title", "tags", "approvers")}
    with (
        Client(own_server.address) as client,
        Client(own_server.address, principal="human_review-lead") as lead,
    ):
        first = fleet.start(env=env)
        for asked, wid in wids.items():
            client.start(asker, "ticket-1", asked, id=wid, group=GROUP)
        fleet.eventually(
            lambda: suspended(own_server.db_url, f"asker-{run}-") == 3, 30, "the askers to wait"
        )
        fleet.kill(first)  # a deploy: the waits live on the server
        asked_of = {asked: client.get(f"{wid}.0") for asked, wid in wids.items()}
        assert asked_of["title"].title == "Approve the human_review branch?"
        assert asked_of["tags"].tags["branch"] == "human_review"
        assert asked_of["approvers"].approvers == Approvers(principals=["human_review-lead"])

        route.write_text("auto_reply\n")  # the selector's input changed while they waited
        second = fleet.start(env=env)
        fleet.eventually(
            lambda: "polling group" in fleet.log(second), 30, "the second worker to start"
        )
        for asked, wid in wids.items():  # each human answers the question they were asked
            (lead if asked == "approvers" else client).resolve(f"{wid}.0", "approved")

        def failed_task(wid: str) -> tasks_pb2.Task | None:
            found = TaskCalls(connection(client)).search(GROUP, 1, wid)
            return found[0] if found and found[0].failed_attempts else None

        for wid in wids.values():
            fleet.eventually(lambda wid=wid: failed_task(wid) is not None, 30, f"{wid} to fail")
        recorded = {asked: p.tags["troth:args"] for asked, p in asked_of.items()}
        messages = {}
        for asked, wid in wids.items():
            assert client.get(wid).state is PromiseState.PENDING  # paused, not switched
            task = failed_task(wid)
            assert task is not None
            messages[asked] = task.last_error
            assert task.last_error.startswith("troth.errors.NonDeterminismError: ")
            assert f"step 0 ('{wid}.0')" in task.last_error
            assert f"digest {recorded[asked]}" in task.last_error
        assert "title='Approve the human_review branch?'" in messages["title"]
        assert "title='Approve the auto_reply branch?'" in messages["title"]
        assert "tags={'branch': 'human_review'}" in messages["tags"]
        assert "tags={'branch': 'auto_reply'}" in messages["tags"]
        assert "principals=('human_review-lead',)" in messages["approvers"]
        assert "principals=('auto_reply-lead',)" in messages["approvers"]
        assert fleet.lines() == []  # no approval was applied to the other branch

        route.write_text("human_review\n")  # put right: the next attempts resume them
        for wid in wids.values():
            assert client.wait(wid, timeout=60).state is PromiseState.RESOLVED
            assert client.decode(client.get(wid).value) == {
                "branch": "human_review",
                "decision": "approved",
            }
        assert fleet.terminate(second) == 0
    assert sorted(fleet.lines()) == sorted(
        f"{wid} human_review applied approved" for wid in wids.values()
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
