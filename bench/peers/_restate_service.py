"""The peers benchmark's workflows as a Restate service (run in bench/.cache/peers/restate-venv).

The same three workflows as troth's `bench/_workflow_worker.py`, written as
Restate's Python SDK documents them:

- ``Hitl``: a notification step, then wait on the durable promise ``approval``,
  which the shared handler ``approve`` resolves (settle by id); returns it;
- ``TenSteps``: ten sequential ``ctx.run`` steps;
- ``Held``: one step that reports ``enter`` and, with ``BENCH_BLOCK=1``, blocks
  (the benchmark SIGKILLs this process there and starts it again without it).

The notification step reports ``notified <key>`` to the benchmark's datagram
socket (``BENCH_NOTIFY``), in the same format as troth's worker; the benchmark
settles on it (the invocation stays open on the HTTP/2 stream until the promise
arrives or its inactivity timeout suspends it).

Served by hypercorn over h2c on 127.0.0.1 (``--port``), with the settings
Restate's documentation recommends for production.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time
from datetime import timedelta
from typing import Any

import hypercorn.asyncio
import hypercorn.config
import restate
from restate.exceptions import SuspendedException

_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
_NOTIFY = os.environ.get("BENCH_NOTIFY", "")
_BLOCK = os.environ.get("BENCH_BLOCK") == "1"
_AWAKEABLES = os.environ.get("BENCH_AWAKEABLES", "")
SUSPEND_AFTER = timedelta(milliseconds=int(os.environ.get("BENCH_SUSPEND_MS", "10")))


def notify(event: str, key: str) -> None:
    if _NOTIFY:
        line = f"{event} {key} {time.monotonic():.6f} {os.getpid()}"
        _sock.sendto(line.encode(), _NOTIFY)


def publish(event: str, key: str, awakeable_id: str) -> None:
    """Tell the benchmark (the party that decides) an awakeable's id: `notified` from
    the notification step, `suspended` once the invocation suspended on it."""
    if _AWAKEABLES:
        _sock.sendto(f"{event} {key} {awakeable_id}".encode(), _AWAKEABLES)


hitl = restate.Workflow("Hitl")


@hitl.main(name="run")
async def hitl_run(ctx: restate.WorkflowContext) -> dict[str, Any]:
    key = ctx.key()

    async def send_notification() -> str:
        notify("notified", key)
        return key

    await ctx.run_typed("send_notification", send_notification)
    decision: dict[str, Any] = await ctx.promise("approval", type_hint=dict).value()
    return decision


@hitl.handler()
async def approve(ctx: restate.WorkflowSharedContext, decision: dict[str, Any]) -> None:
    await ctx.promise("approval", type_hint=dict).resolve(decision)


hitl_awakeable = restate.Service("HitlAwakeable")
hitl_awakeable_suspend = restate.Service("HitlAwakeableSuspend", inactivity_timeout=SUSPEND_AFTER)


async def awakeable_run(ctx: restate.Context, key: str, *, report_suspension: bool) -> Any:
    awakeable_id, decision = ctx.awakeable(type_hint=dict)

    async def send_notification() -> str:
        publish("notified", key, awakeable_id)  # the notification carries the id to settle
        return awakeable_id

    await ctx.run_typed("send_notification", send_notification)
    try:
        return await decision
    except SuspendedException:
        if report_suspension:
            publish("suspended", key, awakeable_id)
        raise


@hitl_awakeable.handler(name="run")
async def hitl_awakeable_run(ctx: restate.Context, key: str) -> dict[str, Any]:
    result: dict[str, Any] = await awakeable_run(ctx, key, report_suspension=False)
    return result


@hitl_awakeable_suspend.handler(name="run")
async def hitl_awakeable_suspend_run(ctx: restate.Context, key: str) -> dict[str, Any]:
    result: dict[str, Any] = await awakeable_run(ctx, key, report_suspension=True)
    return result


ten_steps = restate.Workflow("TenSteps")


async def cheap_step(n: int) -> int:
    return n


@ten_steps.main(name="run")
async def ten_steps_run(ctx: restate.WorkflowContext) -> str:
    for n in range(10):
        await ctx.run_typed("cheap_step", cheap_step, n=n)
    return "done"


held = restate.Workflow("Held")


@held.main(name="run")
async def held_run(ctx: restate.WorkflowContext) -> str:
    key = ctx.key()

    async def blocking_step() -> str:
        notify("enter", key)
        if _BLOCK:
            await asyncio.sleep(3600)
        return "ok"

    return await ctx.run_typed("blocking_step", blocking_step)


app = restate.app(services=[hitl, hitl_awakeable, hitl_awakeable_suspend, ten_steps, held])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{args.port}"]
    config.h2_max_concurrent_streams = 2147483647
    config.keep_alive_max_requests = 2147483647
    config.keep_alive_timeout = 2147483647
    asyncio.run(hypercorn.asyncio.serve(app, config))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
