"""The worker process of ``bench/workflows.py``: the benchmark's workflows, served for one group.

Run by the benchmark as a subprocess (one per worker process it measures)::

    python bench/_workflow_worker.py --address 127.0.0.1:PORT --group g --notify /tmp/x/sock

It reports to the benchmark over a Unix datagram socket (``--notify``), one
line per event, ``<event> <workflow id> <time.monotonic()> <pid>`` (the
monotonic clock is system-wide on Linux, so the benchmark compares it with its
own). The reports cost no troth RPC:

- ``suspended``: a task that suspended its workflow was completed (the
  workflow waits on a pending promise and its callbacks are registered). The
  benchmark settles the awaited promise only after this, so every measured
  cycle includes a full suspend and a RESUME task.
- ``enter``: a `blocking_step` started running (recovery measurement). With
  ``--block`` the step then blocks for an hour: the benchmark kills or
  freezes the process while every one of its tasks is inside this step.

The ``suspended`` report hooks ``Worker._suspend`` (a private method of the
SDK) of this process only; it adds one ``sendto`` per suspension and nothing
else to a task. The worker stops gracefully on SIGTERM/SIGINT (``Worker.run``).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

from troth import Client, Context, Worker

_notify_socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
_notify_path = ""
_block = False


def notify(event: str, workflow_id: str) -> None:
    """One datagram to the benchmark (no-op without ``--notify``)."""
    if _notify_path:
        line = f"{event} {workflow_id} {time.monotonic():.6f} {os.getpid()}"
        _notify_socket.sendto(line.encode(), _notify_path)


# --------------------------------------------------------------------------- steps


def send_notification(approval_id: str) -> str:
    """The human-in-the-loop notification step: reports ``notified <workflow id>`` (the
    peers benchmark settles on it while the workflow is live, its "eager" cycle; the
    ``suspended`` report comes once the task suspended the workflow)."""
    notify("notified", approval_id.rsplit(".", 1)[0])
    return approval_id


def cheap_step(n: int) -> int:
    """A step that does nothing but be recorded."""
    return n


def blocking_step(workflow_id: str) -> str:
    """Report entering the step; with ``--block``, then block (the process gets killed here)."""
    notify("enter", workflow_id)
    if _block:
        threading.Event().wait(3600)
    return "ok"


# --------------------------------------------------------------------------- workflows


def hitl(ctx: Context) -> Generator[Any, Any, Any]:
    """Human in the loop (DESIGN §3): latent promise, notification step, wait for the decision."""
    approval = yield ctx.promise()
    yield ctx.run(send_notification, approval.id)
    decision = yield approval
    return decision


def ten_steps(ctx: Context) -> Generator[Any, Any, str]:
    """Ten sequential checkpointed steps, nothing to wait for."""
    for n in range(10):
        yield ctx.run(cheap_step, n)
    return "done"


def long_history(ctx: Context, steps: int, approvals: int) -> Generator[Any, Any, list[Any]]:
    """A gate (step 0), `steps` cheap steps (1..steps), then `approvals` waits in a row.

    The benchmark writes the gate and steps 1..steps itself, settled, with the
    ids and tags this workflow's steps have, holding the root's task (its
    fence) before any worker runs it; the first delivery then replays them all.
    """
    gate = yield ctx.promise()
    yield gate
    for n in range(steps):
        yield ctx.run(cheap_step, n)
    decisions = []
    for _ in range(approvals):
        approval = yield ctx.promise()
        decisions.append((yield approval))
    return decisions


def held(ctx: Context) -> Generator[Any, Any, str]:
    """One step that blocks on the first worker (``--block``) and returns at once on the next."""
    result = yield ctx.run(blocking_step, ctx.id)
    return str(result)


WORKFLOWS = (hitl, ten_steps, long_history, held)


def install_suspend_report(worker: Worker) -> None:
    """Report ``suspended <root>`` once a task that suspended its workflow is completed."""
    tasks = worker._tasks
    original = tasks.suspend

    def suspend(task_id: str, counter: int, awaiting: Any, **carried: Any) -> Any:
        root = next((h.root_id for h in worker._leases.held() if h.task_id == task_id), "")
        answer = original(task_id, counter, awaiting, **carried)
        if not answer.settled:
            notify("suspended", root)
        return answer

    tasks.suspend = suspend  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    global _notify_path, _block
    parser = argparse.ArgumentParser(description="worker process of bench/workflows.py")
    parser.add_argument("--address", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--lease", type=float, default=10.0, help="seconds")
    parser.add_argument("--cache-size", type=int, default=256)
    parser.add_argument("--notify", default="", help="Unix datagram socket of the benchmark")
    parser.add_argument("--block", action="store_true", help="blocking_step blocks")
    args = parser.parse_args(argv)
    _notify_path = args.notify
    _block = args.block
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    with Client(args.address) as client:
        worker = Worker(
            client,
            group=args.group,
            worker_id=args.worker_id,
            concurrency=args.concurrency,
            lease=timedelta(seconds=args.lease),
            cache_size=args.cache_size,
        )
        for workflow in WORKFLOWS:
            worker.workflow(workflow)
        install_suspend_report(worker)
        worker.run()


if __name__ == "__main__":
    main()
