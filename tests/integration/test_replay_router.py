"""The router of issue 9: a branch switched between suspend and resume fails, never mixes.

`router` picks its branch from a routing file it reads outside any step (its
input: here a rule file a deploy changes), runs `do_branch(branch)`, then
waits on an approval and applies it to the branch. It suspends on the
approval with the `human_review` branch recorded; the worker is replaced and
the routing file now says `auto_reply`; the approval comes in. Before replay
checked arguments, the resumed run reused the step recorded for
`human_review` and applied the approval given for it to `auto_reply` (the
root resolved). Now the task fails with NonDeterminismError naming step 0 and both commands, and no
step of the other branch runs.

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

from troth import Client, Context, PromiseState, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _workers import WorkerFleet, effect, suspended

if TYPE_CHECKING:
    from _support import ServerProcess

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


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group=GROUP, lease=timedelta(seconds=5))
        worker.workflow(router)
        worker.run()


def test_a_router_whose_branch_changed_on_resume_fails_instead_of_switching(
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
        fleet.eventually(lambda: client.get(wid).is_settled, 30, "the router's task to end")

        root = client.get(wid)
        assert root.state is PromiseState.REJECTED, root
        error = client.decode(root.value)
        assert error["type"] == "troth.errors.NonDeterminismError", error
        message = error["message"]
        assert f"step 0 ('{wid}.0')" in message
        assert f"run(do_branch) with arguments digest {recorded}" in message
        assert f"run(do_branch) with arguments ('{wid}', 'auto_reply')" in message
        assert fleet.terminate(second) == 0
    # Neither the recorded human_review step nor the approval was used for auto_reply.
    assert fleet.lines() == [f"{wid} human_review"]
    assert "Traceback" not in fleet.logs()


if __name__ == "__main__":
    main(*sys.argv[1:])
