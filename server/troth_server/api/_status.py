"""The only place that knows gRPC status codes: domain and store errors -> status + ErrorInfo."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from troth.errors import ERROR_DOMAIN, Reason
from troth_server.auth import AuthError, NotAllowed, Unauthenticated, VerificationsBusy
from troth_server.domain.approvers import NotAnApprover, PolicyNotChecked
from troth_server.domain.errors import (
    DomainError,
    InvalidArgument,
    InvalidPageToken,
    NotAWorkflow,
    Overloaded,
    PromiseAlreadyExists,
    PromiseAlreadySettled,
    PromiseNotFound,
    PromiseTimedOut,
    SettleTargetNotFound,
    ValueNotChecked,
)
from troth_server.domain.schedules import ScheduleAlreadyExists, ScheduleNotFound
from troth_server.domain.settle_tokens import (
    BadSignature,
    MintForAnother,
    OutcomeNotAllowed,
    PromiseReplaced,
    SettleTokenError,
    TokenExpired,
    TokenMalformed,
    TokenOutdated,
    TokensOff,
    TokenUsed,
    TokenVoid,
    UnknownKey,
    WrongPromise,
)
from troth_server.domain.starts import WorkflowAlreadyExists
from troth_server.domain.states import WorkflowNotParked
from troth_server.domain.steps import (
    OutsideWorkersGroups,
    ReservedForWorkflow,
    StepRecorded,
    WorkflowSettled,
)
from troth_server.domain.task import (
    GroupNotAllowed,
    NotTheTasksWorker,
    StaleCounter,
    TaskNotClaimable,
    TaskNotFound,
    TaskRunning,
    WorkflowNotPaused,
    WorkflowOver,
)
from troth_server.store import (
    CommitOutcomeUnknown,
    SchemaBehind,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from troth_server.watch import EventsMissed, WatchFellBehind
from troth_server.writes.group_commit import ShuttingDown

# Exhaustive: tests walk every DomainError subclass and require an entry.
STATUS_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidPageToken: grpc.StatusCode.INVALID_ARGUMENT,
    PromiseNotFound: grpc.StatusCode.NOT_FOUND,
    SettleTargetNotFound: grpc.StatusCode.NOT_FOUND,
    NotAWorkflow: grpc.StatusCode.FAILED_PRECONDITION,
    PromiseAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    WorkflowAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    ScheduleNotFound: grpc.StatusCode.NOT_FOUND,
    ScheduleAlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    PromiseAlreadySettled: grpc.StatusCode.FAILED_PRECONDITION,
    PromiseTimedOut: grpc.StatusCode.FAILED_PRECONDITION,
    # The service checks and retries it; reaching a client would be a server bug.
    ValueNotChecked: grpc.StatusCode.INTERNAL,
    ShuttingDown: grpc.StatusCode.UNAVAILABLE,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    StoreError: grpc.StatusCode.UNAVAILABLE,
    SchemaTooNew: grpc.StatusCode.UNAVAILABLE,
    SchemaBehind: grpc.StatusCode.UNAVAILABLE,
    CommitOutcomeUnknown: grpc.StatusCode.UNAVAILABLE,
    StaleCounter: grpc.StatusCode.FAILED_PRECONDITION,
    WorkflowSettled: grpc.StatusCode.FAILED_PRECONDITION,
    StepRecorded: grpc.StatusCode.FAILED_PRECONDITION,
    ReservedForWorkflow: grpc.StatusCode.PERMISSION_DENIED,
    OutsideWorkersGroups: grpc.StatusCode.PERMISSION_DENIED,
    TaskNotClaimable: grpc.StatusCode.FAILED_PRECONDITION,
    TaskNotFound: grpc.StatusCode.NOT_FOUND,
    TaskRunning: grpc.StatusCode.FAILED_PRECONDITION,
    WorkflowOver: grpc.StatusCode.FAILED_PRECONDITION,
    WorkflowNotPaused: grpc.StatusCode.FAILED_PRECONDITION,
    WorkflowNotParked: grpc.StatusCode.FAILED_PRECONDITION,
    NotTheTasksWorker: grpc.StatusCode.PERMISSION_DENIED,
    GroupNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    WatchFellBehind: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Overloaded: grpc.StatusCode.RESOURCE_EXHAUSTED,
    EventsMissed: grpc.StatusCode.UNAVAILABLE,
    AuthError: grpc.StatusCode.PERMISSION_DENIED,
    Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    # A new credential that cannot be verified now (the verification pool is full).
    VerificationsBusy: grpc.StatusCode.RESOURCE_EXHAUSTED,
    NotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    NotAnApprover: grpc.StatusCode.PERMISSION_DENIED,
    # Like ValueNotChecked: the service checks the policy again and resends.
    PolicyNotChecked: grpc.StatusCode.INTERNAL,
    # A settle token: not one at all is the caller's mistake; one that does not
    # grant this settle is a refusal; one spent or voided is about the state.
    SettleTokenError: grpc.StatusCode.PERMISSION_DENIED,
    TokenMalformed: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownKey: grpc.StatusCode.PERMISSION_DENIED,
    BadSignature: grpc.StatusCode.PERMISSION_DENIED,
    TokenExpired: grpc.StatusCode.PERMISSION_DENIED,
    TokenOutdated: grpc.StatusCode.PERMISSION_DENIED,
    WrongPromise: grpc.StatusCode.PERMISSION_DENIED,
    PromiseReplaced: grpc.StatusCode.PERMISSION_DENIED,
    OutcomeNotAllowed: grpc.StatusCode.PERMISSION_DENIED,
    TokenUsed: grpc.StatusCode.FAILED_PRECONDITION,
    TokenVoid: grpc.StatusCode.FAILED_PRECONDITION,
    TokensOff: grpc.StatusCode.FAILED_PRECONDITION,
    MintForAnother: grpc.StatusCode.PERMISSION_DENIED,
}


def _code(exc: Exception) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL


def status_for(exc: Exception) -> grpc.Status:
    """The rich status (code, message, ErrorInfo) that answers `exc`."""
    if isinstance(exc, Overloaded):
        return _status(
            _code(exc), exc.message, exc.reason, exc.metadata, retry_after_ms=exc.retry_after_ms
        )
    if isinstance(exc, DomainError):
        return _status(_code(exc), exc.message, exc.reason, exc.metadata)
    if isinstance(exc, CommitOutcomeUnknown):
        return _status(
            _code(exc),
            f"the store is unavailable ({exc}); the change may or may not have been made: "
            "retry the same call (with the same id and idempotency key) to find out",
            Reason.STORE_UNAVAILABLE,
            {},
        )
    if isinstance(exc, StoreError):
        return _status(
            _code(exc),
            f"the store is unavailable ({exc}); nothing was changed, retry later",
            Reason.STORE_UNAVAILABLE,
            {},
        )
    return _status(
        grpc.StatusCode.INTERNAL,
        "the server failed to handle this request; it is logged, please report it",
        Reason.INTERNAL,
        {},
    )


def invalid_argument(field: str, message: str) -> grpc.Status:
    return status_for(InvalidArgument(field, message))


MAX_MESSAGE_BYTES = 2048
"""Longest status message as it travels in grpc-message (percent-encoded: a byte
outside printable ASCII takes three); it travels again, as UTF-8, inside
grpc-status-details-bin (base64). grpc's clients refuse trailers past a soft limit
of 8 KiB at random, and always past 16 KiB: "é" x 1,000 measured in UTF-8 bytes
(2 KiB) became 6 KiB of grpc-message and 8,230 bytes of trailers in all."""
MAX_METADATA_BYTES = 256
"""Longest ErrorInfo metadata value, for the same reason."""


def _encoded_size(data: bytes) -> int:
    """Bytes `data` takes percent-encoded in grpc-message (printable ASCII but `%`
    stays one byte; every other byte becomes `%XX`)."""
    return sum(1 if 0x20 <= b <= 0x7E and b != 0x25 else 3 for b in data)


def _bounded(text: str, limit: int) -> str:
    """`text`, cut to `limit` bytes as grpc-message carries them (with a note saying
    so) if it is longer: a message that quotes what the caller sent must not outgrow
    the trailers."""
    data = text.encode()
    if _encoded_size(data) <= limit:
        return text
    room = limit - 40
    end = 0
    for i, byte in enumerate(data):
        room -= 1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3
        if room < 0:
            break
        end = i + 1
    kept = data[:end].decode(errors="ignore")
    return f"{kept}... ({len(data) - len(kept.encode())} more bytes)"


def _status(
    code: grpc.StatusCode,
    message: str,
    reason: Reason,
    metadata: dict[str, str],
    *,
    retry_after_ms: int | None = None,
) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(
        reason=reason.value,
        domain=ERROR_DOMAIN,
        metadata={k: _bounded(v, MAX_METADATA_BYTES) for k, v in metadata.items()},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    message = _bounded(message, MAX_MESSAGE_BYTES)
    details = [detail]
    if retry_after_ms is not None:
        # google.rpc.RetryInfo: how long the client should wait before retrying.
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromMilliseconds(retry_after_ms)
        delay = any_pb2.Any()
        delay.Pack(retry)
        details.append(delay)
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    result: grpc.Status = rpc_status.to_status(status)
    return result
