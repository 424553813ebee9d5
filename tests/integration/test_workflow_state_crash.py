"""SIGKILL the worker of a run that reads its state slot; the worker that replays it
elsewhere gets the reads the run recorded, not the slot as it is now (issue 31).
This file, run as a script, is the worker (`python test_workflow_state_crash.py
ADDRESS`)."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

from troth import Client, Context, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, eventually
from _workers import RELEASE_ENV, WorkerFleet, send_email


def noted(ctx: Context) -> Generator[Any, Any, dict[str, Any]]:
    first = yield ctx.state("notes", default=[])
    yield ctx.set_state("notes", [*first, "by the run"])
    approval = yield ctx.promise(id=f"{ctx.id}.approval")
    yield approval
    after = yield ctx.state("notes", default=[])
    yield ctx.run(send_email, ctx.id)  # held until the test releases it
    return {"first": first, "after": after, "pid": os.getpid()}


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group="noted", lease=timedelta(seconds=2))
        worker.workflow(noted)
        worker.run()


def test_a_run_replayed_after_its_worker_was_killed_gets_its_recorded_reads(
    own_server: ServerProcess, fleet: WorkerFleet, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    env = {RELEASE_ENV: str(release)}
    first = fleet.start(env=env)
    wid = f"noted-{uuid.uuid4().hex[:6]}"
    with Client(own_server.address) as client:
        client.start("noted", id=wid, group="noted")

        def parked_at(version: int) -> bool:
            state = client.get_state(wid, "notes")
            return bool(state.parked) and state.version == version

        fleet.eventually(lambda: parked_at(1), 30, "the run parked on its approval")
        assert client.replace_state(wid, "notes", lambda notes: [*notes, "operator"]).won
        client.resolve(f"{wid}.approval", True)
        # It resumed on the first worker, read the rewrite, and holds its task in a step.
        fleet.eventually(lambda: f"{wid} email {first.pid}" in fleet.lines(), 30, "the step")
        fleet.kill(first)
        # Its stream broke: the run is parked again, and the slot is rewritten again.
        eventually(lambda: parked_at(2), what="the killed worker's task given back")
        assert client.replace_state(wid, "notes", lambda notes: ["again"]).won
        release.touch()
        second = fleet.start(env=env)
        result = client.handle(wid).result(timeout=30)
    assert result == {
        "first": [],
        "after": ["by the run", "operator"],  # as the first worker read it, not ["again"]
        "pid": second.pid,
    }


if __name__ == "__main__":
    main(sys.argv[1])
