"""A workflow's state slots on the wire: `GetWorkflowState` and `ReplaceWorkflowState`'s
requests checked (the workflow's id, the slot's name, the value's size and JSON),
and their answers; the checks of a `CreatePromise` that records a state step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth.v1 import promises_pb2, tasks_pb2, types_pb2
from troth_server.api import _convert as convert
from troth_server.domain import states
from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from troth_server.config import Limits
    from troth_server.domain.promise import Payload, SettleRequest
    from troth_server.domain.states import Lost, WorkflowState

__all__ = ["get_args", "lost_to_pb", "replace_args", "state_step", "state_to_pb"]

_LOST_TO = {
    states.LostTo.TASK_CLAIMED: tasks_pb2.STATE_LOST_TO_TASK_CLAIMED,
    states.LostTo.VERSION_CHANGED: tasks_pb2.STATE_LOST_TO_VERSION_CHANGED,
    states.LostTo.RUN_ENDED: tasks_pb2.STATE_LOST_TO_RUN_ENDED,
}


def get_args(request: tasks_pb2.GetWorkflowStateRequest, limits: Limits) -> tuple[str, str]:
    return (
        convert.promise_id(request.workflow_id, limits, "workflow_id"),
        states.check_name(request.name),
    )


def replace_args(
    request: tasks_pb2.ReplaceWorkflowStateRequest, limits: Limits
) -> tuple[str, str, Payload, int]:
    root_id = convert.promise_id(request.workflow_id, limits, "workflow_id")
    name = states.check_name(request.name)
    if not request.HasField("value"):
        raise InvalidArgument("value", "is required: the slot's new value")
    value = states.check_value(convert.payload(request.value, limits, "value"))
    if request.expected_version < 0:
        raise InvalidArgument(
            "expected_version", "must be 0 (never written) or the version the rewrite read"
        )
    return root_id, name, value, request.expected_version


def state_step(
    request: promises_pb2.CreatePromiseRequest, settled_with: SettleRequest | None, fenced: bool
) -> tuple[str, Payload | None]:
    """A state step's slot name and, for a write, its value (`CreatePromise` with `state`)."""
    if not fenced:
        raise InvalidArgument(
            "fence", "is required with state: only the worker holding the task reads or writes it"
        )
    name = states.check_name(request.state.name, "state.name")
    if not request.state.write:
        if settled_with is not None:
            raise InvalidArgument(
                "state", "a read takes no resolved_with or rejected_with: the server reads the slot"
            )
        return name, None
    if request.WhichOneof("settled_with") != "resolved_with" or settled_with is None:
        raise InvalidArgument("resolved_with", "is required with state.write: the value to write")
    return name, states.check_value(settled_with.value, "resolved_with")


def state_to_pb(state: WorkflowState) -> tasks_pb2.WorkflowState:
    message = tasks_pb2.WorkflowState(
        workflow_id=state.workflow_id,
        name=state.name,
        version=state.version,
        updated_by=state.updated_by or "",
    )
    if state.version:
        message.value.CopyFrom(
            types_pb2.Payload(headers=state.value.headers, data=state.value.data)
        )
    if state.update_time is not None:
        message.update_time.FromMilliseconds(state.update_time)
    return message


def lost_to_pb(lost: Lost | None) -> tuple[tasks_pb2.StateLostTo, str]:
    if lost is None:
        return tasks_pb2.STATE_LOST_TO_UNSPECIFIED, ""
    return _LOST_TO[lost.to], lost.message
