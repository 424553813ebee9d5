"""troth: durable promises and generator workflows. The public API is what `__all__` names."""

from __future__ import annotations

from troth._approvers import Approvers
from troth._commands import RetryPolicy
from troth._promise import (
    CreateResult,
    Promise,
    PromiseEvent,
    PromiseEventType,
    PromiseOrder,
    PromiseState,
    SearchPage,
    SettleResult,
)
from troth._versions import WorkflowRegistration
from troth.client import Client, Handle, PromiseEventStream
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
)
from troth.worker import Worker

__all__ = [
    "AlreadyExistsError",
    "AlreadySettledError",
    "Approvers",
    "Cancelled",
    "Client",
    "Codec",
    "ConfigurationError",
    "Context",
    "CreateResult",
    "DeadlineExceededError",
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
    "SearchPage",
    "SettleResult",
    "TimedOut",
    "TrothError",
    "UnauthenticatedError",
    "UnavailableError",
    "Worker",
    "WorkflowError",
    "WorkflowRegistration",
]
