"""The README's 3-day approval under a default start, with two days really passing
(issue 12 item 3).

`client.start` without a ttl used to give the root the promise default (one day),
which capped the approval: two days later the workflow had timed out. Now a
workflow lives 30 days by default (`--default-workflow-ttl`). Time passes through
the injected test clock (`TROTH_TEST_CLOCK_FILE`, a float offset in seconds): the
SQLite server's clock anchors to the wall clock when it starts, so the server is
restarted two days on (PostgreSQL's clock is the database's own, which a test
cannot move). The worker that started the workflow is gone by then; a new one,
on the restarted server, resumes it from its recorded steps.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

from _support import append, eventually, exists, lines, start_server

from troth import Client, Context, PromiseState, Worker

DAY = timedelta(days=1)
SLACK = timedelta(seconds=30)


def publish(ctx: Context, path: str, post: str) -> Generator[Any, Any, dict[str, Any]]:
    approval = yield ctx.promise(timeout=timedelta(days=3))  # as the README has it
    yield ctx.run(append, path, f"mail {post} {approval.id}")
    decision = yield approval
    return {"post": post, "decision": decision}


def _served(workdir: Path, clock: Path, days: float) -> Any:
    clock.write_text(repr(days * 86_400.0))
    return start_server(
        workdir, "--sweep-interval", "200ms", env={"TROTH_TEST_CLOCK_FILE": str(clock)}
    )


def _worker(client: Client) -> Worker:
    worker = Worker(client, concurrency=2, lease=timedelta(seconds=5))
    worker.workflow(publish)
    worker.start()
    return worker


def test_a_three_day_approval_under_a_default_start_is_still_open_two_days_on(
    tmp_path: Path,
) -> None:
    workdir, clock = tmp_path / "server", tmp_path / "clock-offset"
    effects = tmp_path / "effects.txt"
    wid = f"publish-{uuid.uuid4().hex[:8]}"
    approval_id = f"{wid}.0"

    server = _served(workdir, clock, 0)
    try:
        with Client(server.address, timeout=10) as client:
            worker = _worker(client)
            try:
                handle = client.start(publish, str(effects), "post-7", id=wid)  # no ttl
                assert handle.created
                eventually(lambda: len(lines(effects)) == 1, 20, "the mail step")
                root, approval = client.get(wid), client.get(approval_id)
            finally:
                worker.stop()
    finally:
        server.stop()
    assert root.expire_time is not None and approval.expire_time is not None
    assert abs(root.expire_time - root.create_time - 30 * DAY) < SLACK
    assert abs(approval.expire_time - approval.create_time - 3 * DAY) < SLACK

    server = _served(workdir, clock, 2)  # two days on
    try:
        with Client(server.address, timeout=10) as client:
            assert client.get(wid).state is PromiseState.PENDING, "the workflow timed out"
            assert client.get(approval_id).state is PromiseState.PENDING
            settled = client.resolve(approval_id, {"approved": True})
            assert settled.applied and settled.promise.settle_time is not None
            # The server's clock really is two days on.
            assert settled.promise.settle_time - approval.create_time > 2 * DAY - SLACK
            worker = _worker(client)
            try:
                result = client.handle(wid).result(timeout=30)
            finally:
                worker.stop()
            assert exists(client, wid)
    finally:
        server.stop()
    assert result == {"post": "post-7", "decision": {"approved": True}}
    assert lines(effects) == [f"mail post-7 {approval_id}"]  # resumed, not re-run
