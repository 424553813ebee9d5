"""The chaos run's worker process: its workflows, and the step function that writes the ledger.

Run by the harness (several at once, SIGKILLed and SIGSTOPped at random)::

    python bench/_chaos/worker.py --address A[,B] --ledger DIR/effects.jsonl --lease 6

Every step is ``effect(wid, step, nonce, sleep_s)``: it appends ``begin`` to
the ledger, sleeps (so faults land mid-step), appends ``end`` and returns.
The ledger is what the checker compares with the server's records: which
process ran which step of which workflow, when, and with which start's
arguments (``nonce``).

The workflows (arguments after ``ctx`` are what the load generator passes):

- ``hitl(nonce, gate_id, gate_timeout_s, sleep_s)``: a step (``prepare``), a
  latent approval (``gate_id``, or the default ``<wid>.1``), a step that mails
  its link (``mail``), the wait, a step after it (``act``). Returns
  ``{"nonce", "decision"}``, ``{"nonce", "rejected"}`` or ``{"nonce",
  "timedout": true}``.
- ``multi(nonce, steps, sleep_s)``: ``steps`` checkpointed steps ``s0``... in a
  row; returns ``{"nonce", "steps"}``.
- ``race(nonce, gate_timeout_s, sleep_s)``: two approvals (``<wid>.0``,
  ``<wid>.1``), a ``mail`` step, ``ctx.any`` of both, an ``act`` step; returns
  ``{"nonce", "decision"}`` (the load generator resolves gate k with
  ``{"gate": k, ...}``, so the decision names its gate). The other approval is
  left waiting: DESIGN §4 rule 11 says the root's end must settle it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _chaos.journal import append
from troth import Client, Context, Rejected, TimedOut, Worker

LEDGER_ENV = "TROTH_CHAOS_LEDGER"


def effect(wid: str, step: str, nonce: str, sleep_s: float) -> str:
    """The side effect of one step run: ``begin`` and ``end`` lines in the ledger."""
    ledger = os.environ[LEDGER_ENV]
    base = {"pid": os.getpid(), "wid": wid, "step": step, "nonce": nonce}
    append(ledger, {**base, "phase": "begin", "t": time.time()})
    time.sleep(sleep_s)
    append(ledger, {**base, "phase": "end", "t": time.time()})
    return step


def hitl(
    ctx: Context, nonce: str, gate_id: str, gate_timeout_s: float, sleep_s: float
) -> Generator[Any, Any, dict[str, Any]]:
    yield ctx.run(effect, ctx.id, "prepare", nonce, sleep_s)
    gate = yield ctx.promise(id=gate_id or None, timeout=timedelta(seconds=gate_timeout_s))
    yield ctx.run(effect, ctx.id, "mail", nonce, sleep_s)
    outcome: dict[str, Any]
    try:
        outcome = {"decision": (yield gate)}
    except TimedOut:
        outcome = {"timedout": True}
    except Rejected as rejected:
        outcome = {"rejected": rejected.value}
    yield ctx.run(effect, ctx.id, "act", nonce, sleep_s)
    return {"nonce": nonce, **outcome}


def multi(ctx: Context, nonce: str, steps: int, sleep_s: float) -> Generator[Any, Any, Any]:
    for n in range(steps):
        yield ctx.run(effect, ctx.id, f"s{n}", nonce, sleep_s)
    return {"nonce": nonce, "steps": steps}


def race(
    ctx: Context, nonce: str, gate_timeout_s: float, sleep_s: float
) -> Generator[Any, Any, dict[str, Any]]:
    timeout = timedelta(seconds=gate_timeout_s)
    first = yield ctx.promise(timeout=timeout)
    second = yield ctx.promise(timeout=timeout)
    yield ctx.run(effect, ctx.id, "mail", nonce, sleep_s)
    decision = yield ctx.any([first, second])
    yield ctx.run(effect, ctx.id, "act", nonce, sleep_s)
    return {"nonce": nonce, "decision": decision}


WORKFLOWS = (hitl, multi, race)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="worker process of the chaos harness")
    parser.add_argument("--address", required=True, help="HOST:PORT[,HOST:PORT...]")
    parser.add_argument("--group", default="chaos")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--lease", type=float, default=6.0, help="seconds")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    os.environ[LEDGER_ENV] = args.ledger
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s",
    )
    with Client(args.address, timeout=10.0) as client:
        worker = Worker(
            client,
            group=args.group,
            concurrency=args.concurrency,
            lease=timedelta(seconds=args.lease),
        )
        for workflow in WORKFLOWS:
            worker.workflow(workflow)
        worker.run()


if __name__ == "__main__":
    main()
