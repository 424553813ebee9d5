"""One worker id for several groups: a process running a `Worker` per group under one
`worker_id` (a pod's name, say) keeps every task each of them holds.

Each worker's heartbeat extends and lists only its own group's tasks. Before,
a heartbeat answered with every task leased to the worker id, so the worker of
one group found the other group's tasks in it, took them for tasks a replica
leased it and never delivered, and gave them back while they ran.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from troth import Client, Context, Worker

if TYPE_CHECKING:
    from _support import ServerProcess

LEASE = timedelta(seconds=3)  # a heartbeat a second: a busy machine keeps the lease
STEP_SECONDS = 4.5  # several heartbeats of each worker while the step runs

_runs: collections.Counter[str] = collections.Counter()
_runs_lock = threading.Lock()


def slow_step(workflow_id: str) -> str:
    with _runs_lock:
        _runs[workflow_id] += 1
    time.sleep(STEP_SECONDS)
    return workflow_id


def slow_flow(ctx: Context) -> Generator[Any, Any, str]:
    done: str = yield ctx.run(slow_step, ctx.id)
    return done


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address, timeout=10) as c:
        yield c


def test_workers_of_two_groups_under_one_id_keep_each_others_tasks(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    worker_id = f"pod-{uuid.uuid4().hex[:8]}"
    groups = [f"g-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    workers = [Worker(client, group, worker_id=worker_id, lease=LEASE) for group in groups]
    for worker in workers:
        worker.workflow(slow_flow)
    caplog.set_level(logging.INFO, logger="troth.worker")
    for worker in workers:
        worker.start()
    try:
        roots = [f"shared-{uuid.uuid4().hex[:8]}" for _ in groups]
        handles = [
            client.start("slow_flow", id=root, group=group)
            for root, group in zip(roots, groups, strict=True)
        ]
        assert [h.result(timeout=60) for h in handles] == roots
    finally:
        for worker in workers:
            worker.stop()
    assert [_runs[root] for root in roots] == [1, 1]
    troubles = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING or "lost its lease" in r.getMessage()
    ]
    assert troubles == []
