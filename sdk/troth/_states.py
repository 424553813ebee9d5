"""A workflow's state slots from outside: `StateCalls`, a base of `Client` (`get_state`,
`replace_state`), and what they answer (`WorkflowState`, `StateReplaced`).

A slot is a named value a workflow reads and writes as recorded steps (`ctx.state`,
`ctx.set_state`). An operator rewrites it only while the run is parked (its root
PENDING, no worker holding its task): `replace_state` reads the slot (refused with
`FailedPreconditionError`, reason `WORKFLOW_NOT_PARKED`, when the run is not parked),
applies the rewrite, runs the validator, and writes by compare-and-swap on the
version it read. A resume that claimed the task, another write, or the run's end that
got there first wins; the rewrite is then answered `won=False` with what it lost to.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth import _arguments as check
from troth._convert import datetime_from_proto, payload_from_proto, payload_to_proto
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from datetime import datetime

    from troth._calls import Connection
    from troth.codec import Payload

__all__ = ["StateCalls", "StateLostTo", "StateReplaced", "WorkflowState"]

_STATE_NAME_RULE = "1 to 128 characters of letters, digits, `_`, `-`, `.` and `:`"


class StateLostTo(enum.StrEnum):
    """Why a rewrite lost (`StateReplaced.lost_to`).

    .. versionadded:: 0.3.0
    """

    NONE = ""
    """It won."""
    TASK_CLAIMED = "TASK_CLAIMED"
    """A worker claimed the run's task (a resume: its awaited promise settled or timed
    out) before the rewrite was written: the run is not parked."""
    VERSION_CHANGED = "VERSION_CHANGED"
    """The slot's version moved on (another rewrite, or the run's own write)."""
    RUN_ENDED = "RUN_ENDED"
    """The run's root settled (it finished, failed, was cancelled or timed out)."""


_LOST_TO = {
    tasks_pb2.STATE_LOST_TO_UNSPECIFIED: StateLostTo.NONE,
    tasks_pb2.STATE_LOST_TO_TASK_CLAIMED: StateLostTo.TASK_CLAIMED,
    tasks_pb2.STATE_LOST_TO_VERSION_CHANGED: StateLostTo.VERSION_CHANGED,
    tasks_pb2.STATE_LOST_TO_RUN_ENDED: StateLostTo.RUN_ENDED,
}


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """A workflow's state slot.

    Attributes:
        workflow_id: The workflow (its root promise's id).
        name: The slot's name.
        version: How many writes it had; 0: never written (`value` is None).
        value: Its value, decoded with the client's codec.
        update_time: When it was last written.
        updated_by: Who wrote it last: "workflow" for the run itself, else the
            operator's principal (empty with authentication off).
        parked: From `get_state`: whether the run is parked now (root PENDING, no
            worker holding its task), when a rewrite may be made; None elsewhere.
        not_parked_because: Why it is not parked, in words.

    .. versionadded:: 0.3.0
    """

    workflow_id: str
    name: str
    version: int
    value: Any
    update_time: datetime | None = None
    updated_by: str = ""
    parked: bool | None = None
    not_parked_because: str = ""


@dataclass(frozen=True, slots=True)
class StateReplaced:
    """What `Client.replace_state` did.

    Attributes:
        won: True: the rewrite was written (`state` is the new slot).
        state: The slot now: the new one, or for a loser the one it lost to.
        based_on: The version the rewrite read and was based on.
        lost_to: Why it lost (`StateLostTo.NONE` when it won).
        message: Why it lost, in words.

    .. versionadded:: 0.3.0
    """

    won: bool
    state: WorkflowState
    based_on: int
    lost_to: StateLostTo = StateLostTo.NONE
    message: str = ""


class StateCalls:
    """`Client`'s calls on workflows' state slots (a base class of `Client`)."""

    _connection: Connection

    def encode(self, value: Any) -> Payload:
        raise NotImplementedError

    def decode(self, payload: Payload) -> Any:
        raise NotImplementedError

    def get_state(self, workflow_id: str, name: str) -> WorkflowState:
        """Read workflow `workflow_id`'s state slot `name`, and whether the run is parked.

        Raises:
            NotFoundError: No promise has this id.
            FailedPreconditionError: The promise is no workflow (`NOT_A_WORKFLOW`).
            InvalidArgumentError: A malformed id or name (`field` names it).
            PermissionDeniedError: The caller may not read the workflow.

        .. versionadded:: 0.3.0
        """
        return self._read_state("Client.get_state", workflow_id, name, require_parked=False)

    def replace_state(
        self,
        workflow_id: str,
        name: str,
        rewrite: Callable[[Any], Any],
        *,
        validate: Callable[[Any], object] | None = None,
    ) -> StateReplaced:
        """Rewrite a parked workflow's state slot (an operator's call): read it, apply
        `rewrite` to its value, run `validate` on the result, and write it by
        compare-and-swap on the version read.

        Args:
            workflow_id: The workflow (its root promise's id).
            name: The slot's name.
            rewrite: The new value from the current one (None for a slot never written).
            validate: Called with the new value before anything is written; raise
                (any exception) to refuse it: it propagates and nothing is written.

        Returns:
            `StateReplaced`: `won=True` and the new slot, or `won=False` with the slot
            as it is now and what the rewrite lost to (`lost_to`, `message`): a worker
            claimed the run's task (a resume), another write moved the version, or the
            run ended, any of them between the read and the write.

        Raises:
            FailedPreconditionError: The run is not parked when the slot is read (reason
                `WORKFLOW_NOT_PARKED`: a worker holds its task, or it is over), or the
                promise is no workflow (`NOT_A_WORKFLOW`).
            NotFoundError: No promise has this id.
            InvalidArgumentError: A malformed id or name, or a value over the size limit.
            PermissionDeniedError: The caller is not an operator or admin.
            UnavailableError: The server could not be reached for the write (it is not
                retried): whether it was made is unknown; `get_state` tells.

        .. versionadded:: 0.3.0
        """
        call = "Client.replace_state"
        if not callable(rewrite):
            raise TypeError(f"{call}: rewrite must be a function of the current value")
        if validate is not None and not callable(validate):
            raise TypeError(f"{call}: validate must be a function of the new value, or None")
        current = self._read_state(call, workflow_id, name, require_parked=True)
        value = rewrite(current.value)
        if validate is not None:
            validate(value)
        request = tasks_pb2.ReplaceWorkflowStateRequest(
            workflow_id=current.workflow_id,
            name=current.name,
            value=payload_to_proto(self.encode(value)),
            expected_version=current.version,
        )
        stub = self._connection.transport.tasks
        # Not retried: a write whose reply was lost would lose to itself on a retry.
        response = self._connection.call(stub.ReplaceWorkflowState, request, idempotent=False)
        return StateReplaced(
            won=response.won,
            state=self._state_from_proto(response.state),
            based_on=current.version,
            lost_to=_LOST_TO.get(response.lost_to, StateLostTo.NONE),
            message=response.message,
        )

    def _read_state(
        self, call: str, workflow_id: str, name: str, *, require_parked: bool
    ) -> WorkflowState:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{call}: name must be {_STATE_NAME_RULE}, not {name!r}")
        request = tasks_pb2.GetWorkflowStateRequest(
            workflow_id=check.promise_id(call, workflow_id, "workflow_id"),
            name=name,
            require_parked=require_parked,
        )
        stub = self._connection.transport.tasks
        response = self._connection.call(stub.GetWorkflowState, request)
        state = self._state_from_proto(response.state)
        return WorkflowState(
            state.workflow_id,
            state.name,
            state.version,
            state.value,
            state.update_time,
            state.updated_by,
            parked=response.parked,
            not_parked_because=response.not_parked_because,
        )

    def _state_from_proto(self, message: tasks_pb2.WorkflowState) -> WorkflowState:
        written = message.version > 0
        return WorkflowState(
            workflow_id=message.workflow_id,
            name=message.name,
            version=message.version,
            value=self.decode(payload_from_proto(message.value)) if written else None,
            update_time=datetime_from_proto(message.update_time)
            if message.HasField("update_time")
            else None,
            updated_by=message.updated_by,
        )
