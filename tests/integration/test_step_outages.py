"""An outage of any length never re-runs a finished step (DESIGN §4 rule 6).

Three worker processes (`Client(timeout=10.0)`, a 3 s lease) run a workflow
whose first step the test holds. The server is SIGKILLed while that step's
function runs; the function returns during the outage, so its worker cannot
record it; the server comes back on the same port and SQLite file. Its worker
keeps the result until the step's promise exists: the function ran once,
although the outage outlasted every per-call timeout and many leases, and
another worker may have taken the task after the restart.

- 30 s of outage, on the wall clock;
- 5 minutes, injected: 12 s on the wall clock while the workers' monotonic
  clocks (deadlines, leases: `Transport._clock`, `Leases._clock`) and the
  restarted server's wall clock jump 5 minutes ahead.

Workers are real subprocesses: this file, run as a script, is the worker
(`python test_step_outages.py ADDRESS CLOCK_FILE`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from troth import Client, Worker
from troth.client import connection

sys.path.insert(0, str(Path(__file__).parent.parent))

from _support import ServerProcess, start_server
from _workers import RELEASE_ENV, WorkerFleet, mail_flow

GROUP = "step-outages"
LEASE = timedelta(seconds=3)
CLIENT_TIMEOUT = 10.0
WORKERS = 3


# -- the worker process (run as a script) ------------------------------------------------


class FileClock:
    """`time.monotonic()` plus an offset in seconds that the test writes to a file (re-read
    at most every 50 ms): the test moves this process's clock forward."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._offset = 0.0
        self._read_at = -1.0

    def __call__(self) -> float:
        now = time.monotonic()
        with self._lock:
            if now - self._read_at >= 0.05:
                self._read_at = now
                try:
                    self._offset = float(self._path.read_text() or 0.0)
                except (OSError, ValueError):
                    pass  # not written yet, or being replaced: the last offset stands
            return now + self._offset


def main(address: str, clock_file: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    clock = FileClock(Path(clock_file))
    with Client(address, timeout=CLIENT_TIMEOUT) as client:
        # Every deadline and lease this worker measures is on the injected clock (the
        # worker's transport is a copy of the client's, made when the worker is).
        connection(client).transport._clock = clock
        worker = Worker(client, group=GROUP, lease=LEASE)
        worker._leases._clock = clock
        worker.workflow(mail_flow)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])


# -- the tests -----------------------------------------------------------------------------


def _jump(path: Path, seconds: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(repr(seconds))
    tmp.replace(path)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("wall_s", "jump_s"),
    [pytest.param(30.0, 0.0, id="30s"), pytest.param(12.0, 288.0, id="5min-injected")],
)
def test_an_outage_past_every_call_timeout_and_lease_runs_a_finished_step_once(
    tmp_path: Path, fleet: WorkerFleet, own_server: ServerProcess, wall_s: float, jump_s: float
) -> None:
    assert wall_s > CLIENT_TIMEOUT and wall_s + jump_s > 3 * LEASE.total_seconds()
    release = tmp_path / "release"
    worker_clock = tmp_path / "worker-clock"
    server_clock = tmp_path / "server-clock"
    _jump(worker_clock, 0.0)
    for _ in range(WORKERS):
        fleet.start(str(worker_clock), env={RELEASE_ENV: str(release)})
    root = f"step-outage-{uuid.uuid4().hex[:8]}"
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
        time.sleep(wall_s / 2)
        _jump(worker_clock, jump_s)  # the workers' deadlines and leases see it all pass
        time.sleep(wall_s / 2)
        _jump(server_clock, jump_s)
        restarted = start_server(
            tmp_path / "server", "--sweep-interval", "200ms", "--listen", own_server.address,
            db_url=own_server.db_url, env={"TROTH_TEST_CLOCK_FILE": str(server_clock)},
        )  # fmt: skip
        with Client(restarted.address, timeout=10) as client:
            assert client.handle(root).result(timeout=90) == "sent"
        time.sleep(2 * LEASE.total_seconds())  # a second run would come within this
    finally:
        if restarted is not None:
            restarted.stop()
    emails = [line for line in fleet.lines() if line.startswith(email)]
    assert len(emails) == 1, f"the step ran {len(emails)} times\n{fleet.logs()[-6000:]}"
    assert fleet.counts()[f"{root} after"] == 1
