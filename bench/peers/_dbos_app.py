"""The peers benchmark's workflows on DBOS Transact (run in bench/.cache/peers/dbos-venv).

DBOS is a library: the workflows run in the process that starts them, so this
one process is DBOS's whole system (with PostgreSQL's processes on that store),
its load client included. The same workflows as troth's
`bench/_workflow_worker.py`:

- ``hitl``: a notification step, then ``DBOS.recv("approval")``, which
  ``DBOS.send(id, ..., "approval")`` answers (settle by id); returns it;
- ``ten_steps``: ten sequential steps;
- ``held``: one step that reports ``enter`` to the benchmark's datagram socket
  and, with ``--block``, blocks (the benchmark SIGKILLs this process there and
  starts another on the same database, which recovers the workflows at launch).

Modes:

- ``serve``: read one JSON command per line on stdin (``{"workload":
  "w1-suspend" | "w1-eager" | "w2", "concurrency": N, "duration": S}``), run
  that phase and answer one JSON line on stdout; ``{"workload": "held", "count":
  N}`` starts N ``held`` workflows and answers at once;
- ``recover``: launch (recovering what the killed process left pending), wait
  for every ``held-*`` workflow's result, print one JSON line and exit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from _load import run_threads
from dbos import DBOS, SetWorkflowID

_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
_notify_path = ""
_block = False
_waiting: dict[str, threading.Event] = {}
_waiting_lock = threading.Lock()
TIMEOUT_S = 30.0


def notify(event: str, workflow_id: str) -> None:
    if _notify_path:
        line = f"{event} {workflow_id} {time.monotonic():.6f} {os.getpid()}"
        _sock.sendto(line.encode(), _notify_path)


@DBOS.step()
def send_notification(workflow_id: str) -> str:
    with _waiting_lock:
        event = _waiting.pop(workflow_id, None)
    if event is not None:
        event.set()  # the client learns that the workflow reached its wait
    return workflow_id


@DBOS.workflow()
def hitl() -> Any:
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    send_notification(workflow_id)
    return DBOS.recv("approval", timeout_seconds=TIMEOUT_S)


@DBOS.step()
def cheap_step(n: int) -> int:
    return n


@DBOS.workflow()
def ten_steps() -> str:
    for n in range(10):
        cheap_step(n)
    return "done"


@DBOS.step()
def blocking_step(workflow_id: str) -> str:
    notify("enter", workflow_id)
    if _block:
        threading.Event().wait(3600)
    return "ok"


@DBOS.workflow()
def held() -> str:
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    return blocking_step(workflow_id)


APPROVED = {"approved": True}


def w1_cycle(workflow_id: str) -> int:
    """One human-in-the-loop cycle; returns settle-to-completion in ns."""
    # Both variants settle once the notification step ran (the workflow then waits in
    # DBOS.recv, live in its thread): for DBOS the two are one flow.
    reached = threading.Event()
    with _waiting_lock:
        _waiting[workflow_id] = reached
    with SetWorkflowID(workflow_id):
        handle = DBOS.start_workflow(hitl)
    if not reached.wait(TIMEOUT_S):
        raise TimeoutError(f"{workflow_id} never reached its wait")
    settle = time.perf_counter_ns()
    DBOS.send(workflow_id, APPROVED, "approval")
    if handle.get_result() != APPROVED:
        raise AssertionError(f"{workflow_id}: unexpected result")
    return time.perf_counter_ns() - settle


def w2_cycle(workflow_id: str) -> int:
    start = time.perf_counter_ns()
    with SetWorkflowID(workflow_id):
        handle = DBOS.start_workflow(ten_steps)
    if handle.get_result() != "done":
        raise AssertionError(f"{workflow_id}: unexpected result")
    return time.perf_counter_ns() - start


def run_phase(workload: str, concurrency: int, duration: float) -> dict[str, Any]:
    cycles = {"w1-suspend": w1_cycle, "w1-eager": w1_cycle, "w2": w2_cycle}
    cycle = cycles[workload]
    return run_threads(lambda workflow_id, _slot: cycle(workflow_id), concurrency, duration)


def start_held(count: int) -> dict[str, Any]:
    for i in range(count):
        with SetWorkflowID(f"held-{i}"):
            DBOS.start_workflow(held)
    return {"started": count}


def serve() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command["workload"] == "held":
            answer = start_held(int(command["count"]))
        else:
            answer = run_phase(
                command["workload"], int(command["concurrency"]), float(command["duration"])
            )
        print(json.dumps(answer), flush=True)


def recover(count: int) -> None:
    """Wait for every held workflow the killed process left (DBOS recovers them at launch)."""
    deadline = time.monotonic() + 120
    done = 0
    for i in range(count):
        workflow_id = f"held-{i}"
        while True:
            try:
                handle = DBOS.retrieve_workflow(workflow_id)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        if handle.get_result() == "ok":
            done += 1
    print(json.dumps({"completed": done, "at": time.monotonic()}), flush=True)


def main() -> None:
    global _notify_path, _block
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True, help="DBOS system database URL")
    parser.add_argument("--mode", choices=("serve", "recover"), default="serve")
    parser.add_argument("--notify", default="")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()
    _notify_path, _block = args.notify, args.block
    DBOS(config={"name": "troth-bench-peers", "system_database_url": args.db})
    DBOS.launch()
    try:
        if args.mode == "serve":
            serve()
        else:
            recover(args.count)
    finally:
        DBOS.destroy(destroy_registry=False, workflow_completion_timeout_sec=0)


if __name__ == "__main__":
    main()
