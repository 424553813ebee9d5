"""troth: durable promises and generator workflows. The public API is what `__all__` names."""

from __future__ import annotations

from troth._commands import RetryPolicy
from troth._promise import CreateResult, Promise, PromiseState, SearchPage, SettleResult
from troth.client import Client, Handle
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
    PermissionDeniedError,
    PromiseRejectedError,
    PromiseTimedOutError,
    Reason,
    RegistrationError,
    ResourceExhaustedError,
    RpcError,
    TrothError,
    UnauthenticatedError,
    UnavailableError,
    WorkflowError,
)
from troth.worker import Worker

__all__ = [
    "AlreadyExistsError",
    "AlreadySettledError",
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
    "Payload",
    "PermissionDeniedError",
    "Promise",
    "PromiseHandle",
    "PromiseRejectedError",
    "PromiseState",
    "PromiseTimedOutError",
    "Reason",
    "RegistrationError",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RpcError",
    "SearchPage",
    "SettleResult",
    "TrothError",
    "UnauthenticatedError",
    "UnavailableError",
    "Worker",
    "WorkflowError",
]
