"""A cancel that arrives while the step before a wait runs leaves no live link.

Workers are real subprocesses (this file, run as a script, is the worker). The
workflow runs a step, then creates its gate (a latent promise), mails the
gate's link and waits. The root is cancelled while the first step runs: the
worker's later create of the gate is refused (WORKFLOW_SETTLED), so no gate is
left PENDING, the mail is never sent, and a resolve of the gate's id is refused.
On SQLite and on PostgreSQL.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from troth import Client, Context, Worker
from troth.errors import NotFoundError, PermissionDeniedError

sys.path.insert(0, str(Path(__file__).parent.parent))

from _pg import fresh_schema
from _support import ServerProcess, start_server
from _workers import WorkerFleet, effect

GO_ENV = "TROTH_TEST_GO_FILE"


def prepare(workflow_id: str) -> str:
    effect(f"{workflow_id} prepare")
    go = Path(os.environ[GO_ENV])
    deadline = time.monotonic() + 60
    while not go.exists() and time.monotonic() < deadline:  # the test cancels meanwhile
        time.sleep(0.02)
    return "prepared"


def mail(link: str) -> str:
    return effect(f"mailed {link}")


def gated(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.run(prepare, ctx.id)
    gate = yield ctx.promise(title="approve")
    yield ctx.run(mail, gate.id)
    return (yield gate)


def main(address: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Client(address) as client:
        worker = Worker(client, group="gated", lease=timedelta(seconds=5))
        worker.workflow(gated)
        worker.run()


if __name__ == "__main__":
    main(sys.argv[1])


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServerProcess]:
    if request.param == "sqlite":
        proc = start_server(tmp_path / "server", "--sweep-interval", "200ms")
        yield proc
        proc.stop()
        return
    with fresh_schema() as url:
        proc = start_server(tmp_path / "server", "--sweep-interval", "200ms", db_url=url)
        yield proc
        proc.stop()


@pytest.mark.slow
def test_a_cancel_during_the_step_before_a_wait_leaves_no_live_gate(
    tmp_path: Path, server: ServerProcess
) -> None:
    fleet = WorkerFleet(tmp_path, __file__, server.address)
    go = tmp_path / "go"
    wid = f"gated-{uuid.uuid4().hex[:8]}"
    try:
        fleet.start(env={GO_ENV: str(go)})
        with Client(server.address) as client:
            client.start(gated, id=wid, group="gated", ttl=timedelta(hours=1))
            fleet.eventually(lambda: f"{wid} prepare" in fleet.lines(), 30, "the first step")
            client.cancel(wid, {"reason": "customer withdrew"})
            go.touch()  # the step returns; the worker goes on to create the gate

            def finished() -> bool:
                # The gate's create is refused (WORKFLOW_SETTLED) and the workflow
                # gets Cancelled at that yield, before any later step runs.
                return f"workflow {wid!r} raised Cancelled" in fleet.logs()

            fleet.eventually(finished, 30, "the workflow to get Cancelled at the gate's yield")
            # A window for a wrongly continuing workflow to show itself (a later step
            # run, a promise left pending): a sleep on purpose, nothing to wait for.
            time.sleep(2)
            assert client.get(wid).state == "REJECTED_CANCELED"
            assert client.get(f"{wid}.0").state == "RESOLVED"  # the step's result, recorded
            pending = client.search_all(f"{wid}*", states=["PENDING"])
            assert [p.id for p in pending] == []
            assert not [line for line in fleet.lines() if line.startswith("mailed")]
            with pytest.raises((NotFoundError, PermissionDeniedError)):
                client.resolve(f"{wid}.1", {"approved": True})
            with pytest.raises(PermissionDeniedError):
                client.resolve(f"{wid}.1", {"approved": True}, create_if_missing=True)
    finally:
        fleet.stop_all()
