"""A worker frozen in the middle of a step function, alone in its group, with
authentication on: its lease runs out, and once it thaws the server leases the
task to it again while the older run of the same task still holds the step.

The new delivery waits for the older run to stop. Its history was read before
the older run recorded the step's result, so it must learn that result, and
it must do so as a worker (a worker's token may not `SearchPromises`): from
what the older run wrote in this process. Before, the worker searched the
server, was refused `PERMISSION_DENIED`, logged "failed running task" and gave
the task back, for a third delivery to replay.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_relet.py ADDRESS WORKER_ID`, its token in `TROTH_TOKEN`).
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from troth import Client, TaskState, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _auth import Grant, write_token_file
from _support import ServerProcess, start_server
from _workers import RELEASE_ENV, WorkerFleet, mail_flow

GROUP = "relet"
LEASE = timedelta(seconds=2)


# -- the worker process (run as a script) ------------------------------------------------


def main(address: str, worker_id: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address, timeout=5) as client:  # its token: TROTH_TOKEN
        worker = Worker(client, group=GROUP, worker_id=worker_id, lease=LEASE)
        worker.workflow(mail_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


# -- the test ------------------------------------------------------------------------------


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    tokens = write_token_file(
        tmp_path / "tokens.toml",
        [Grant("mailer", ("worker",), (GROUP,)), Grant("ops", ("gateway", "operator"))],
    )
    server = start_server(
        tmp_path / "server", "--auth-tokens", str(tmp_path / "tokens.toml"),
        "--sweep-interval", "200ms",
    )  # fmt: skip
    yield server, tokens
    server.stop()


def _holder(ops: Client, root: str) -> tuple[str, int] | None:
    """(worker, counter) of the root's claimed task, if one is claimed."""
    for task in ops.search_tasks(GROUP):
        if task.root_id == root and task.state is TaskState.CLAIMED:
            return task.worker_id or "", task.counter
    return None


def test_a_task_leased_again_to_a_worker_still_running_it_goes_on_without_a_search(
    tmp_path: Path, secured: tuple[ServerProcess, dict[str, str]]
) -> None:
    server, tokens = secured
    fleet = WorkerFleet(tmp_path, __file__, server.address)
    release = tmp_path / "release"
    root = f"relet-{uuid.uuid4().hex[:8]}"
    email = f"{root} email "
    try:
        worker = fleet.start(
            "w-a", env={RELEASE_ENV: str(release), "TROTH_TOKEN": tokens["mailer"]}
        )
        with Client(server.address, timeout=10, token=tokens["ops"]) as ops:
            handle = ops.start("mail_flow", id=root, group=GROUP)
            fleet.eventually(
                lambda: any(line.startswith(email) for line in fleet.lines()),
                30,
                "the step to start",
            )
            first = _holder(ops, root)
            assert first is not None and first[0] == "w-a", first
            worker.send_signal(signal.SIGSTOP)
            try:
                fleet.eventually(lambda: _holder(ops, root) is None, 30, "the lease to run out")
            finally:
                worker.send_signal(signal.SIGCONT)
            # Thawed, it heartbeats and gets the task again, its step function still running.
            fleet.eventually(
                lambda: (_holder(ops, root) or ("", 0))[1] > first[1],
                30,
                "the task to be leased to the thawed worker again",
            )
            release.touch()
            assert handle.result(timeout=60) == "sent"
        logs = fleet.logs()
        emails = [line for line in fleet.lines() if line.startswith(email)]
        assert len(emails) == 1, f"the step ran {len(emails)} times\n{logs[-4000:]}"
        assert fleet.counts()[f"{root} after"] == 1
        assert "failed running task" not in logs, logs[-4000:]
        assert "PERMISSION_DENIED" not in logs, logs[-4000:]
    finally:
        fleet.stop_all()
