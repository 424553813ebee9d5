"""A workflow's named state slots: what a slot is, who may write it when, and the
compare-and-swap of an operator's rewrite (pure: no I/O, no clock; `now` is a
parameter).

A slot belongs to a workflow's root. The run reads and writes it as recorded steps
(`ctx.state`, `ctx.set_state`), each under the fence of the task its worker holds
now, so that a replay gets what the run saw. From outside, an operator rewrites it
only while the run is parked: its root PENDING and no worker holding its task. The
rewrite names the version it was based on, and wins only if the slot is still at
that version and the run still parked, decided in the write's own transaction
(`replace`): every other outcome is a loss the loser is told about (`Lost`), never
a write.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain.errors import DomainError, InvalidArgument
from troth_server.domain.promise import EMPTY, Payload
from troth_server.domain.task import TaskState

if TYPE_CHECKING:
    from troth_server.domain.promise import Promise
    from troth_server.domain.task import Task

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
NAME_RULE = "1 to 128 characters of letters, digits, `_`, `-`, `.` and `:`"
STATE_TAG = "troth:state"
"""On a state step: the slot's name."""
VERSION_TAG = "troth:state-version"
"""On a state step: the slot's version the run read, or wrote."""
BY_WORKFLOW = "workflow"
"""`WorkflowState.updated_by` of a write the run made itself."""
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """One slot: its value and version (0: never written)."""

    workflow_id: str
    name: str
    version: int = 0
    value: Payload = EMPTY
    update_time: int | None = None
    updated_by: str | None = None


class LostTo(enum.StrEnum):
    """Why a rewrite lost (proto `StateLostTo`)."""

    TASK_CLAIMED = "TASK_CLAIMED"
    VERSION_CHANGED = "VERSION_CHANGED"
    RUN_ENDED = "RUN_ENDED"


@dataclass(frozen=True, slots=True)
class Lost:
    """A rewrite that was not written: what it lost to, and why in words."""

    to: LostTo
    message: str


class WorkflowNotParked(DomainError):
    """A read for a rewrite (`require_parked`) of a workflow that is not parked."""

    reason = Reason.WORKFLOW_NOT_PARKED

    def __init__(self, root_id: str, why: str) -> None:
        super().__init__(
            f"workflow {root_id!r} is not parked: {why}; its state may be rewritten only "
            "while it waits (root PENDING, no worker holding its task): try again once it "
            "parks (`troth workflows show` says what it does)",
            promise_id=root_id,
        )


def check_name(name: str, field: str = "name") -> str:
    """A slot's name, or `InvalidArgument` naming `field`."""
    if not name:
        raise InvalidArgument(field, f"is required: {NAME_RULE}")
    if not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(field, f"{name[:60]!r} must be {NAME_RULE}")
    return name


def check_value(value: Payload, field: str = "value") -> Payload:
    """A slot's value: JSON text when its content type says JSON (the size is bounded
    by the payload limit where it is converted)."""
    content_type = value.headers.get("content-type", "").split(";")[0].strip()
    if content_type in _JSON_TYPES:
        try:
            json.loads(value.data)
        except ValueError as exc:
            raise InvalidArgument(
                field, f"says content-type {content_type} but is not JSON ({exc})"
            ) from None
    return value


def not_parked_because(root: Promise, task: Task | None) -> str | None:
    """Why the run is not parked (None: it is): its root settled, or a worker holds its task."""
    if root.is_settled:
        return f"it is over ({root.state.value})"
    if task is not None and task.state is TaskState.CLAIMED:
        return f"worker {task.worker_id!r} holds its task {task.id!r}"
    return None


def replace(
    slot: WorkflowState,
    root: Promise,
    task: Task | None,
    expected_version: int,
    value: Payload,
    principal: str | None,
    now: int,
) -> WorkflowState | Lost:
    """An operator's rewrite of `slot`, based on `expected_version`: the new slot, or
    what it lost to. The run's end wins over everything, then a worker holding the
    task, then a version moved on."""
    if root.is_settled:
        return Lost(
            LostTo.RUN_ENDED,
            f"workflow {root.id!r} ended ({root.state.value}) before the rewrite was written",
        )
    if task is not None and task.state is TaskState.CLAIMED:
        return Lost(
            LostTo.TASK_CLAIMED,
            f"worker {task.worker_id!r} claimed the task {task.id!r} of workflow {root.id!r} "
            "(it resumed) before the rewrite was written: the run is not parked",
        )
    if slot.version != expected_version:
        by = f" by {slot.updated_by}" if slot.updated_by else ""
        return Lost(
            LostTo.VERSION_CHANGED,
            f"state {slot.name!r} of workflow {root.id!r} is at version {slot.version} "
            f"(written{by}), not {expected_version} as the rewrite was based on",
        )
    return WorkflowState(root.id, slot.name, slot.version + 1, value, now, principal)


def written_by_run(slot: WorkflowState, value: Payload, now: int) -> WorkflowState:
    """The run's own write (`ctx.set_state`), by the worker holding its task."""
    return WorkflowState(slot.workflow_id, slot.name, slot.version + 1, value, now, BY_WORKFLOW)
