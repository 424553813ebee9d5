"""Protobuf <-> domain, with the validation of every request field against `Limits`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from troth.v1 import promises_pb2, tasks_pb2, types_pb2
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import (
    EMPTY,
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)
from troth_server.domain.task import Task, TaskKind, TaskState

if TYPE_CHECKING:
    from collections.abc import Mapping

    from google.protobuf.duration_pb2 import Duration

    from troth_server.config import Limits

ID_PATTERN = re.compile(r"[A-Za-z0-9._~:@/+=\-]+")
ID_CHARSET = "letters, digits and . _ ~ : @ / + = -"

_PB_STATES: dict[PromiseState, int] = {
    PromiseState.PENDING: types_pb2.PENDING,
    PromiseState.RESOLVED: types_pb2.RESOLVED,
    PromiseState.REJECTED: types_pb2.REJECTED,
    PromiseState.REJECTED_CANCELED: types_pb2.REJECTED_CANCELED,
    PromiseState.REJECTED_TIMEDOUT: types_pb2.REJECTED_TIMEDOUT,
}
_DOMAIN_STATES = {v: k for k, v in _PB_STATES.items()}


# --- requests -------------------------------------------------------------------------


def promise_id(value: str, limits: Limits, field: str = "id") -> str:
    if not value:
        raise InvalidArgument(field, "is required: give the promise id")
    if len(value) > limits.max_id_length:
        raise InvalidArgument(
            field, f"is {len(value)} characters long; the limit is {limits.max_id_length}"
        )
    if not ID_PATTERN.fullmatch(value):
        raise InvalidArgument(field, f"{value!r} has characters outside {ID_CHARSET}")
    return value


def create_request(request: promises_pb2.CreatePromiseRequest, limits: Limits) -> CreateRequest:
    expiry = request.WhichOneof("expiry")
    if request.never_expires and expiry is not None:
        raise InvalidArgument(
            "never_expires", f"cannot be combined with {expiry}; send one of the two"
        )
    ttl: int | None = None
    expire_time: int | None = None
    if expiry == "ttl":
        ttl = _duration_ms(request.ttl)
        if ttl <= 0:
            raise InvalidArgument("ttl", "must be positive, e.g. 30s; omit it for the default")
        if ttl > limits.max_ttl_ms:
            raise InvalidArgument("ttl", f"exceeds the limit of {limits.max_ttl_ms} ms")
    elif expiry == "expire_time":
        expire_time = timestamp_ms(request.expire_time, "expire_time")
    elif not request.never_expires:
        ttl = limits.default_ttl_ms
    return CreateRequest(
        id=promise_id(request.id, limits),
        param=payload(request.param, limits, "param") if request.HasField("param") else EMPTY,
        tags=tags(request.tags, limits),
        expire_time=expire_time,
        ttl=ttl,
        idempotency_key=idempotency_key(request.idempotency_key, limits),
        strict=request.strict,
    )


def settled_with(
    request: promises_pb2.CreatePromiseRequest,
    create: CreateRequest,
    limits: Limits,
    principal: str | None,
) -> SettleRequest | None:
    which = request.WhichOneof("settled_with")
    if which is None:
        return None
    state = PromiseState.RESOLVED if which == "resolved_with" else PromiseState.REJECTED
    return SettleRequest(
        id=create.id,
        state=state,
        value=payload(getattr(request, which), limits, which),
        idempotency_key=create.idempotency_key,
        principal=principal,
    )


def settle_request(
    request: promises_pb2.ResolvePromiseRequest
    | promises_pb2.RejectPromiseRequest
    | promises_pb2.CancelPromiseRequest,
    state: PromiseState,
    limits: Limits,
    principal: str | None,
) -> SettleRequest:
    return SettleRequest(
        id=promise_id(request.id, limits),
        state=state,
        value=payload(request.value, limits, "value") if request.HasField("value") else EMPTY,
        idempotency_key=idempotency_key(request.idempotency_key, limits),
        strict=request.strict,
        principal=principal,
    )


def search_states(values: list[int]) -> frozenset[PromiseState]:
    states = set()
    for value in values:
        state = _DOMAIN_STATES.get(value)
        if state is None:
            raise InvalidArgument(
                "states",
                f"{value} is not a promise state; use PENDING, RESOLVED, REJECTED, "
                "REJECTED_CANCELED or REJECTED_TIMEDOUT",
            )
        states.add(state)
    return frozenset(states)


def search_id_glob(value: str, limits: Limits) -> str:
    if not value:
        return "*"
    if len(value) > limits.max_id_length:
        raise InvalidArgument("id", f"glob is longer than {limits.max_id_length} characters")
    if not ID_PATTERN.fullmatch(value.replace("*", "")) and value.replace("*", ""):
        raise InvalidArgument("id", f"glob {value!r} has characters outside {ID_CHARSET} and *")
    return value


def page_size(value: int, limits: Limits) -> int:
    if value < 0:
        raise InvalidArgument("page_size", "cannot be negative; omit it for the default")
    if value > limits.max_page_size:
        raise InvalidArgument("page_size", f"exceeds the limit of {limits.max_page_size}")
    return value or limits.default_page_size


def tags(values: Mapping[str, str], limits: Limits) -> dict[str, str]:
    if len(values) > limits.max_tags:
        raise InvalidArgument("tags", f"has {len(values)} entries; the limit is {limits.max_tags}")
    for key, value in values.items():
        if not key:
            raise InvalidArgument("tags", "has an empty key")
        if len(key) > limits.max_tag_key_length:
            raise InvalidArgument(
                f"tags[{key[:40]}]", f"key is longer than {limits.max_tag_key_length} characters"
            )
        if len(value) > limits.max_tag_value_length:
            raise InvalidArgument(
                f"tags[{key}]", f"value is longer than {limits.max_tag_value_length} characters"
            )
    return dict(values)


def payload(value: types_pb2.Payload, limits: Limits, field: str) -> Payload:
    size = len(value.data) + sum(len(k) + len(v) for k, v in value.headers.items())
    if size > limits.max_payload_bytes:
        raise InvalidArgument(
            field, f"is {size} bytes; the limit is {limits.max_payload_bytes} (data plus headers)"
        )
    return Payload(dict(value.headers), value.data)


def idempotency_key(value: str, limits: Limits) -> str | None:
    if len(value) > limits.max_idempotency_key_length:
        raise InvalidArgument(
            "idempotency_key",
            f"is longer than {limits.max_idempotency_key_length} characters",
        )
    return value or None


def principal(metadata: Mapping[str, str] | None, limits: Limits) -> str | None:
    if not metadata:
        return None
    value = metadata.get("troth-principal")
    if value is None:
        return None
    if len(value) > limits.max_principal_length:
        raise InvalidArgument(
            "troth-principal", f"metadata is longer than {limits.max_principal_length} characters"
        )
    if value.startswith("troth:"):
        raise InvalidArgument(
            "troth-principal",
            f"{value!r}: names starting with 'troth:' are reserved for the server",
        )
    return value or None


def timestamp_ms(value: Timestamp, field: str) -> int:
    if value.seconds < 0 or value.nanos < 0 or value.nanos >= 1_000_000_000:
        raise InvalidArgument(field, "is not a valid timestamp after 1970")
    return value.seconds * 1000 + value.nanos // 1_000_000


def name(value: str, limits: Limits, field: str) -> str:
    """A group or worker id: the id charset, at most 256 characters."""
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > 256 or not ID_PATTERN.fullmatch(value):
        raise InvalidArgument(field, f"{value[:60]!r} must be 1 to 256 characters of {ID_CHARSET}")
    return value


def lease_ms(request_lease: Duration | None, limits: Limits) -> int:
    if request_lease is None:
        return limits.default_lease_ms
    lease = _duration_ms(request_lease)
    if lease < 1000 or lease > limits.max_lease_ms:
        raise InvalidArgument(
            "lease", f"must be between 1s and {limits.max_lease_ms} ms; omit it for the default"
        )
    return lease


def capacity(value: int, limits: Limits) -> int:
    if value < 0 or value > limits.max_poll_capacity:
        raise InvalidArgument(
            "capacity", f"must be between 1 and {limits.max_poll_capacity} (0 means 1)"
        )
    return value or 1


def counter(value: int) -> int:
    if value <= 0:
        raise InvalidArgument("counter", "is required: send the counter of the delivered task")
    return value


_PB_TASK_KINDS = {TaskKind.INVOKE: tasks_pb2.INVOKE, TaskKind.RESUME: tasks_pb2.RESUME}
_PB_TASK_STATES = {
    TaskState.PENDING: tasks_pb2.TASK_PENDING,
    TaskState.CLAIMED: tasks_pb2.TASK_CLAIMED,
    TaskState.COMPLETED: tasks_pb2.TASK_COMPLETED,
}


def task_to_pb(task: Task) -> tasks_pb2.Task:
    message = tasks_pb2.Task(
        id=task.id,
        root_promise_id=task.root_promise_id,
        group=task.group,
        kind=_PB_TASK_KINDS[task.kind],
        state=_PB_TASK_STATES[task.state],
        counter=task.counter,
        worker_id=task.worker_id or "",
    )
    if task.lease_expire_time is not None:
        message.lease_expire_time.CopyFrom(_timestamp(task.lease_expire_time))
    return message


def _duration_ms(value: Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


# --- responses ------------------------------------------------------------------------


def to_pb(promise: Promise) -> types_pb2.Promise:
    message = types_pb2.Promise(
        id=promise.id,
        state=_PB_STATES[promise.state],  # type: ignore[arg-type]
        param=types_pb2.Payload(headers=promise.param.headers, data=promise.param.data),
        value=types_pb2.Payload(headers=promise.value.headers, data=promise.value.data),
        tags=promise.tags,
        create_time=_timestamp(promise.create_time),
        idempotency_key_for_create=promise.idempotency_key_for_create or "",
        idempotency_key_for_settle=promise.idempotency_key_for_settle or "",
        settled_by=promise.settled_by or "",
        schema=promise.schema or "",
        title=promise.title or "",
        message=promise.message or "",
        requested_by=promise.requested_by or "",
        workflow_version=promise.workflow_version or "",
    )
    if promise.settle_time is not None:
        message.settle_time.CopyFrom(_timestamp(promise.settle_time))
    if promise.expire_time is not None:
        message.expire_time.CopyFrom(_timestamp(promise.expire_time))
    return message


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
