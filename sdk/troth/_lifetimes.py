"""A step's timeout against its workflow's lifetime (pure).

The server never lets a step outlive its workflow: a step created with a
timeout (`ctx.promise(timeout=...)`, `ctx.sleep(...)`, a child's
`ctx.start(..., ttl=...)`) that reaches past its workflow's expire_time gets
the workflow's expire_time instead, and says so only in the `expire_time` it
returns. `cut_short` turns that into the warning the worker logs, naming the
step, the timeout asked, the workflow and its expire_time.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from troth._commands import Sleep, StartWorkflow
from troth._durations import format_duration
from troth._promise import PromiseState

if TYPE_CHECKING:
    from datetime import datetime

    from troth._engine import CreateStep
    from troth._promise import Promise

__all__ = ["cut_short"]

_ROUNDING = timedelta(milliseconds=1)
"""The server keeps times in whole milliseconds."""


def cut_short(step: CreateStep, promise: Promise) -> str | None:
    """The warning for step `step` as the server created it (`promise`), if its
    workflow's expiry cut the timeout it asked for; None if it did not."""
    if step.ttl is None or promise.expire_time is None:
        return None
    if promise.state is not PromiseState.PENDING:
        return None  # settled already (an early answer adopted): its expiry means nothing
    asked = promise.create_time + step.ttl
    if promise.expire_time >= asked - _ROUNDING:
        return None
    what = {Sleep: "a sleep of", StartWorkflow: "a ttl of"}.get(type(step.command), "a timeout of")
    workflow = promise.parent_id or "its workflow"
    left = promise.expire_time - promise.create_time
    return (
        f"step {step.step_id!r} asked for {what} {format_duration(step.ttl)}, but workflow "
        f"{workflow!r} expires at {_iso(promise.expire_time)} (in {format_duration(left)}), "
        f"so the step expires then; start the workflow with a longer ttl "
        f"(client.start(..., ttl=...); ctx.start(..., ttl=...) for a child) or ask for less"
    )


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
