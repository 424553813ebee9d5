"""troth: durable promises and generator workflows. The public API is what `__all__` names.

Each name is imported from its module when first used (PEP 562), so that a program
that needs a part of troth (the `troth` command reading one promise, a client
without the worker) does not pay for all of it: `import troth` itself is cheap.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:
    from troth._approvers import Approvers
    from troth._commands import RetryPolicy
    from troth._operators import TaskInfo, TaskKind, TaskState, WorkerInfo, WorkflowInfo
    from troth._promise import (
        Caller,
        CreateResult,
        Decision,
        Promise,
        PromiseEvent,
        PromiseEventType,
        PromiseOrder,
        PromiseState,
        SearchPage,
        SettleResult,
    )
    from troth._schedules import ScheduleInfo
    from troth._states import StateLostTo, StateReplaced, WorkflowState
    from troth._versions import WorkflowRegistration
    from troth.client import Client, Handle, PromiseEventStream, TlsConfig
    from troth.codec import Codec, JsonCodec, Payload
    from troth.context import Context, PromiseHandle
    from troth.errors import (
        AlreadyExistsError,
        AlreadySettledError,
        Cancelled,
        ConfigurationError,
        DeadlineExceededError,
        FailedPreconditionError,
        InvalidArgumentError,
        LeaseLostError,
        NonDeterminismError,
        NotFoundError,
        OverloadedError,
        PermissionDeniedError,
        PromiseRejectedError,
        PromiseTimedOutError,
        Reason,
        RegistrationError,
        Rejected,
        ResourceExhaustedError,
        RpcError,
        TimedOut,
        TrothError,
        UnauthenticatedError,
        UnavailableError,
        WorkflowError,
        WorkflowFailed,
    )
    from troth.worker import Worker

__all__ = [
    "AlreadyExistsError",
    "AlreadySettledError",
    "Approvers",
    "Caller",
    "Cancelled",
    "Client",
    "Codec",
    "ConfigurationError",
    "Context",
    "CreateResult",
    "DeadlineExceededError",
    "Decision",
    "FailedPreconditionError",
    "Handle",
    "InvalidArgumentError",
    "JsonCodec",
    "LeaseLostError",
    "NonDeterminismError",
    "NotFoundError",
    "OverloadedError",
    "Payload",
    "PermissionDeniedError",
    "Promise",
    "PromiseEvent",
    "PromiseEventStream",
    "PromiseEventType",
    "PromiseHandle",
    "PromiseOrder",
    "PromiseRejectedError",
    "PromiseState",
    "PromiseTimedOutError",
    "Reason",
    "RegistrationError",
    "Rejected",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RpcError",
    "ScheduleInfo",
    "SearchPage",
    "SettleResult",
    "StateLostTo",
    "StateReplaced",
    "TaskInfo",
    "TaskKind",
    "TaskState",
    "TimedOut",
    "TlsConfig",
    "TrothError",
    "UnauthenticatedError",
    "UnavailableError",
    "Worker",
    "WorkerInfo",
    "WorkflowError",
    "WorkflowFailed",
    "WorkflowInfo",
    "WorkflowRegistration",
    "WorkflowState",
]

_HOMES: dict[str, str] = {
    "AlreadyExistsError": "troth.errors",
    "AlreadySettledError": "troth.errors",
    "Approvers": "troth._approvers",
    "Caller": "troth._promise",
    "Cancelled": "troth.errors",
    "Client": "troth.client",
    "Codec": "troth.codec",
    "ConfigurationError": "troth.errors",
    "Context": "troth.context",
    "CreateResult": "troth._promise",
    "DeadlineExceededError": "troth.errors",
    "Decision": "troth._promise",
    "FailedPreconditionError": "troth.errors",
    "Handle": "troth.client",
    "InvalidArgumentError": "troth.errors",
    "JsonCodec": "troth.codec",
    "LeaseLostError": "troth.errors",
    "NonDeterminismError": "troth.errors",
    "NotFoundError": "troth.errors",
    "OverloadedError": "troth.errors",
    "Payload": "troth.codec",
    "PermissionDeniedError": "troth.errors",
    "Promise": "troth._promise",
    "PromiseEvent": "troth._promise",
    "PromiseEventStream": "troth.client",
    "PromiseEventType": "troth._promise",
    "PromiseHandle": "troth.context",
    "PromiseOrder": "troth._promise",
    "PromiseRejectedError": "troth.errors",
    "PromiseState": "troth._promise",
    "PromiseTimedOutError": "troth.errors",
    "Reason": "troth.errors",
    "RegistrationError": "troth.errors",
    "Rejected": "troth.errors",
    "ResourceExhaustedError": "troth.errors",
    "RetryPolicy": "troth._commands",
    "RpcError": "troth.errors",
    "SearchPage": "troth._promise",
    "SettleResult": "troth._promise",
    "StateLostTo": "troth._states",
    "StateReplaced": "troth._states",
    "TaskInfo": "troth._operators",
    "TaskKind": "troth._operators",
    "TaskState": "troth._operators",
    "TimedOut": "troth.errors",
    "TlsConfig": "troth.client",
    "TrothError": "troth.errors",
    "UnauthenticatedError": "troth.errors",
    "UnavailableError": "troth.errors",
    "Worker": "troth.worker",
    "WorkerInfo": "troth._operators",
    "WorkflowError": "troth.errors",
    "WorkflowFailed": "troth.errors",
    "WorkflowInfo": "troth._operators",
    "ScheduleInfo": "troth._schedules",
    "WorkflowRegistration": "troth._versions",
    "WorkflowState": "troth._states",
}
"""Where each public name is defined."""


def __getattr__(name: str) -> typing.Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'troth' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
