"""A resumed workflow does not log again what it logged before it suspended.

A workflow logs (`ctx.log`), asks for an approval and suspends; its worker stops;
the approval comes; a fresh worker process resumes it by replay. Each line the
workflow logs appears once in all the workers' logs (issue 27: the lines between
its last recorded step and the wait where it suspended were logged again by the
worker that resumed it).

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_replay_logging.py ADDRESS`).
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any

from troth import Client, Context, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, exists
from _workers import WorkerFleet, effect

GROUP = "replay-log"
LINES = ("started", "asked", "waiting for the approval", "decided yes", "finished")


def asks(ctx: Context) -> Generator[Any, Any, str]:
    ctx.log.info("%s: started", ctx.id)
    approval = yield ctx.promise(title="Go ahead?")
    ctx.log.info("%s: asked", ctx.id)
    yield ctx.run(effect, f"{ctx.id} notified")
    ctx.log.info("%s: waiting for the approval", ctx.id)
    decision: str = yield approval
    ctx.log.info("%s: decided %s", ctx.id, decision)
    yield ctx.run(effect, f"{ctx.id} done")
    ctx.log.info("%s: finished", ctx.id)
    return decision


# -- the worker process (run as a script) ------------------------------------------------


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address, timeout=10) as client:
        worker = Worker(client, group=GROUP)
        worker.workflow(asks)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


# -- the test ------------------------------------------------------------------------------


def test_a_resume_on_a_fresh_worker_logs_each_line_once(
    fleet: WorkerFleet, own_server: ServerProcess
) -> None:
    root = f"logged-{uuid.uuid4().hex[:8]}"
    first = fleet.start()
    with Client(own_server.address, timeout=10) as client:
        handle = client.start("asks", id=root, group=GROUP)
        fleet.eventually(
            lambda: f"workflow {root!r} waits on" in fleet.log(first), 30, "the suspension"
        )
        fleet.terminate(first)
        fleet.start()  # a fresh process: it resumes the workflow by replay
        assert exists(client, f"{root}.0")
        client.resolve(f"{root}.0", "yes")
        assert handle.result(timeout=30) == "yes"
    logs = fleet.logs()
    counts = {line: logs.count(f"{root}: {line}") for line in LINES}
    assert counts == dict.fromkeys(LINES, 1), f"{counts}\n{logs[-4000:]}"
    assert fleet.counts()[f"{root} notified"] == 1
