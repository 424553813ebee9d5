"""troth: durable promises and generator workflows. The public API is what `__all__` names."""

from __future__ import annotations

from troth._promise import CreateResult, Promise, PromiseState, SearchPage, SettleResult
from troth.client import Client
from troth.codec import Codec, JsonCodec, Payload
from troth.errors import (
    AlreadyExistsError,
    AlreadySettledError,
    ConfigurationError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    PromiseTimedOutError,
    Reason,
    ResourceExhaustedError,
    RpcError,
    TrothError,
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError",
    "AlreadySettledError",
    "Client",
    "Codec",
    "ConfigurationError",
    "CreateResult",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "JsonCodec",
    "LeaseLostError",
    "NotFoundError",
    "Payload",
    "PermissionDeniedError",
    "Promise",
    "PromiseState",
    "PromiseTimedOutError",
    "Reason",
    "ResourceExhaustedError",
    "RpcError",
    "SearchPage",
    "SettleResult",
    "TrothError",
    "UnauthenticatedError",
    "UnavailableError",
]
