"""An outage longer than the lease never re-runs a step function that returned.

The server is SIGKILLed while a step function runs; the function returns
during the outage, so its record fails; the server comes back (same port,
same SQLite file) after the lease ran out. The worker keeps the result and
records it once the server answers: the function ran exactly once, and the
workflow completes.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_worker_outage.py ADDRESS`).
"""

from __future__ import annotations

import logging
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from troth import Client, Worker

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, start_server
from _workers import RELEASE_ENV, WorkerFleet, mail_flow

GROUP = "outage"
LEASE = timedelta(seconds=2)


# -- the worker process (run as a script) ------------------------------------------------


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address, timeout=2) as client:
        worker = Worker(client, group=GROUP, lease=LEASE)
        worker.workflow(mail_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


# -- the test ------------------------------------------------------------------------------


def test_an_outage_longer_than_the_lease_does_not_run_a_finished_step_again(
    tmp_path: Path, fleet: WorkerFleet, own_server: ServerProcess
) -> None:
    release = tmp_path / "release"
    fleet.start(env={RELEASE_ENV: str(release)})
    root = f"outage-{uuid.uuid4().hex[:8]}"
    email = f"{root} email "
    with Client(own_server.address, timeout=10) as client:
        client.start("mail_flow", id=root, group=GROUP)
    fleet.eventually(
        lambda: any(line.startswith(email) for line in fleet.lines()), 30, "the step to start"
    )
    own_server.kill()
    restarted: ServerProcess | None = None
    try:
        release.touch()  # the function returns while the server is away
        time.sleep(3 * LEASE.total_seconds())  # longer than the lease
        restarted = start_server(
            tmp_path / "server", "--sweep-interval", "200ms", "--listen", own_server.address,
            db_url=own_server.db_url,
        )  # fmt: skip
        with Client(restarted.address, timeout=10) as client:
            assert client.handle(root).result(timeout=60) == "sent"
        time.sleep(2 * LEASE.total_seconds())  # a second run would come within this
    finally:
        if restarted is not None:
            restarted.stop()
    emails = [line for line in fleet.lines() if line.startswith(email)]
    assert len(emails) == 1, f"the step ran {len(emails)} times\n{fleet.logs()[-4000:]}"
    assert fleet.counts()[f"{root} after"] == 1
