"""Protobuf <-> domain, with the validation of every request field against `Limits`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from troth.codec import Payload as WirePayload
from troth.v1 import promises_pb2, tasks_pb2, types_pb2
from troth_server.api._checks import check_text
from troth_server.api._inputs import MAX_WORKFLOWS
from troth_server.domain import approvers as policies
from troth_server.domain.access import RESERVED_NAME_PREFIXES, Principal, reserved_prefix
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import (
    EMPTY,
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)
from troth_server.domain.routing import MAX_WORKFLOW_NAME, MAX_WORKFLOW_VERSION
from troth_server.domain.settle_tokens import is_principal_name
from troth_server.domain.steps import INVOKE_TAG, Fence
from troth_server.domain.task import Task, TaskKind, TaskState
from troth_server.store import PromiseOrder
from troth_server.units import duration_text, size_text
from troth_server.watch import EventFilter, EventType, PromiseEvent

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from google.protobuf import struct_pb2
    from google.protobuf.duration_pb2 import Duration

    from troth_server.config import Limits
    from troth_server.domain.workers import WorkerSummary

ID_PATTERN = re.compile(r"[A-Za-z0-9._~:@/+=\-]+")
ID_CHARSET = "letters, digits and . _ ~ : @ / + = -"
CONTENT_TYPE_HEADER = "content-type"
JSON_CONTENT_TYPE = "application/json"
_EXACT_INTEGERS = 2**53

_PB_STATES: dict[PromiseState, int] = {
    PromiseState.PENDING: types_pb2.PROMISE_STATE_PENDING,
    PromiseState.RESOLVED: types_pb2.PROMISE_STATE_RESOLVED,
    PromiseState.REJECTED: types_pb2.PROMISE_STATE_REJECTED,
    PromiseState.REJECTED_CANCELED: types_pb2.PROMISE_STATE_REJECTED_CANCELED,
    PromiseState.REJECTED_TIMEDOUT: types_pb2.PROMISE_STATE_REJECTED_TIMEDOUT,
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
    checked_tags = tags(request.tags, limits)
    start = INVOKE_TAG in checked_tags
    if start:
        # A workflow root: its group must be one a worker can Poll, or its task waits forever.
        name(checked_tags[INVOKE_TAG], limits, f"tags[{INVOKE_TAG}]")
    if expiry == "ttl":
        ttl = _duration_ms(request.ttl)
        if ttl <= 0:
            raise InvalidArgument("ttl", "must be positive, e.g. 30s; omit it for the default")
        if ttl > limits.max_ttl_ms:
            raise InvalidArgument("ttl", f"exceeds the limit of {duration_text(limits.max_ttl_ms)}")
    elif expiry == "expire_time":
        expire_time = timestamp_ms(request.expire_time, "expire_time")
    elif not request.never_expires:
        # A workflow's default lifetime is its own (--default-workflow-ttl, 30 days):
        # its steps are capped by it, so a promise's day would cut a 3-day approval.
        ttl = (
            min(limits.default_workflow_ttl_ms, limits.max_ttl_ms)
            if start
            else limits.default_ttl_ms
        )
    return CreateRequest(
        id=promise_id(request.id, limits),
        param=payload(request.param, limits, "param") if request.HasField("param") else EMPTY,
        tags=checked_tags,
        expire_time=expire_time,
        ttl=ttl,
        idempotency_key=idempotency_key(request.idempotency_key, limits),
        strict=request.strict,
        schema=_schema(request.schema, limits),
        title=_text(request.title, limits.max_title_length, "title"),
        message=_message(request.message, limits),
        requested_by=_text(request.requested_by, limits.max_principal_length, "requested_by"),
        approvers=approvers(request.approvers) if request.HasField("approvers") else None,
    )


def approvers(message: types_pb2.Approvers) -> policies.Approvers | None:
    """The policy a request gives (None when it restricts nobody)."""
    return policies.approvers(
        message.principals,
        message.roles,
        not_requester=message.not_requester,
        distinct=message.distinct,
        quorum=message.quorum,
        permissions=message.permissions,
    )


def principal_to_pb(principal: Principal) -> types_pb2.Principal:
    """A principal as `WhoAmI` describes it."""
    return types_pb2.Principal(
        name=principal.name,
        roles=sorted(role.value for role in principal.roles),
        groups=sorted(principal.groups),
        prefixes=list(principal.prefixes),
        permissions=sorted(principal.permissions),
        authenticated=principal.authenticated,
    )


def approvers_to_pb(policy: policies.Approvers) -> types_pb2.Approvers:
    return types_pb2.Approvers(
        principals=sorted(policy.principals),
        roles=sorted(policy.roles),
        not_requester=policy.not_requester,
        distinct=policy.distinct,
        quorum=policy.quorum,
        permissions=sorted(policy.permissions),
    )


MAX_SETTLE_TOKEN_LENGTH = 4096


def settle_token(
    request: promises_pb2.ResolvePromiseRequest | promises_pb2.RejectPromiseRequest,
) -> str | None:
    """The settle token a resolve or reject carries, if any (verified by the service)."""
    token = request.settle_token
    if not token:
        return None
    if len(token) > MAX_SETTLE_TOKEN_LENGTH:
        raise InvalidArgument(
            "settle_token",
            f"is longer than any settle token ({MAX_SETTLE_TOKEN_LENGTH} characters)",
        )
    if request.HasField("fence"):
        raise InvalidArgument(
            "settle_token", "cannot go with fence: a worker writes its steps with its fence"
        )
    return token


_TOKEN_OUTCOMES = {
    types_pb2.PROMISE_STATE_RESOLVED: PromiseState.RESOLVED,
    types_pb2.PROMISE_STATE_REJECTED: PromiseState.REJECTED,
}


@dataclass(frozen=True, slots=True)
class Mint:
    """A MintSettleToken request, checked."""

    promise_id: str
    outcomes: frozenset[PromiseState]
    ttl_ms: int | None
    fence: Fence | None
    acts_for: str | None
    """The principal the token is to act for; None for the caller."""


def mint_request(request: promises_pb2.MintSettleTokenRequest, limits: Limits) -> Mint:
    """A MintSettleToken request's fields, each checked."""
    outcomes = set()
    for i, value in enumerate(request.outcomes):
        outcome = _TOKEN_OUTCOMES.get(value)
        if outcome is None:
            raise InvalidArgument(f"outcomes[{i}]", "must be RESOLVED or REJECTED")
        outcomes.add(outcome)
    ttl: int | None = None
    if request.HasField("ttl"):
        ttl = _duration_ms(request.ttl)
        if ttl <= 0:
            raise InvalidArgument("ttl", "must be positive, e.g. 86400s; omit it for the default")
        if ttl > limits.max_ttl_ms:
            raise InvalidArgument("ttl", f"exceeds the limit of {duration_text(limits.max_ttl_ms)}")
    acts_for = request.acts_for or None
    if acts_for is not None and not is_principal_name(acts_for):
        raise InvalidArgument(
            "acts_for",
            "must be a principal's name: 1 to 256 printable ASCII characters, no space, "
            f"not starting with {' or '.join(map(repr, RESERVED_NAME_PREFIXES))}",
        )
    return Mint(
        promise_id(request.promise_id, limits, "promise_id"),
        frozenset(outcomes),
        ttl,
        fence(request, limits),
        acts_for,
    )


def _schema(value: str, limits: Limits) -> str | None:
    if not value:
        return None
    if len(value.encode()) > limits.max_schema_bytes:
        raise InvalidArgument(
            "schema", f"is larger than the limit of {size_text(limits.max_schema_bytes)}"
        )
    # What it says is checked by the service, off the event loop (`checks`).
    return value


def _message(value: str, limits: Limits) -> str | None:
    size = len(value.encode())
    if size > limits.max_message_bytes:
        raise InvalidArgument(
            "message",
            f"is {size_text(size)} (UTF-8); the limit is {size_text(limits.max_message_bytes)}",
        )
    return value or None


def _text(value: str, limit: int, field: str) -> str | None:
    if len(value) > limit:
        raise InvalidArgument(field, f"is {len(value)} characters long; the limit is {limit}")
    return value or None


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
        create_if_missing=(
            not isinstance(request, promises_pb2.CancelPromiseRequest) and request.create_if_missing
        ),
    )


def fence(
    request: promises_pb2.CreatePromiseRequest
    | promises_pb2.ResolvePromiseRequest
    | promises_pb2.RejectPromiseRequest
    | promises_pb2.MintSettleTokenRequest,
    limits: Limits,
) -> Fence | None:
    """The step writer's `TaskFence`, or None when the request carries none. It carries
    the authenticated caller too: the task must be leased to it (checked on the writer,
    with the counter)."""
    if not request.HasField("fence"):
        return None
    # Here, not at the top: `_auth` imports this module.
    from troth_server.api._auth import caller

    sent = request.fence
    if not sent.task_id:
        raise InvalidArgument("fence.task_id", "is required: the id of the task the worker holds")
    if not sent.worker_id:
        raise InvalidArgument("fence.worker_id", "is required: the worker holding the task")
    if sent.counter <= 0:
        raise InvalidArgument("fence.counter", "must be the task's counter as delivered (>= 1)")
    who = caller()
    return Fence(
        name(sent.task_id, limits, "fence.task_id"),
        sent.counter,
        name(sent.worker_id, limits, "fence.worker_id"),
        who if who.authenticated else None,
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


_ORDERS: dict[int, PromiseOrder] = {
    promises_pb2.PROMISE_ORDER_UNSPECIFIED: PromiseOrder.CREATED_ASC,
    promises_pb2.PROMISE_ORDER_CREATED_ASC: PromiseOrder.CREATED_ASC,
    promises_pb2.PROMISE_ORDER_CREATED_DESC: PromiseOrder.CREATED_DESC,
    promises_pb2.PROMISE_ORDER_EXPIRE_TIME_ASC: PromiseOrder.EXPIRE_TIME_ASC,
}


def search_order(value: int) -> PromiseOrder:
    order = _ORDERS.get(value)
    if order is None:
        raise InvalidArgument(
            "order", f"{value} is not an order; use CREATED_ASC, CREATED_DESC or EXPIRE_TIME_ASC"
        )
    return order


def search_parent(value: str, limits: Limits) -> str | None:
    """`SearchPromisesRequest.parent_id`: a workflow's id, or None (empty: any promise)."""
    return promise_id(value, limits, "parent_id") if value else None


def created_before(request: promises_pb2.SearchPromisesRequest) -> int | None:
    if not request.HasField("created_before"):
        return None
    return timestamp_ms(request.created_before, "created_before")


def event_filter(request: promises_pb2.WatchPromisesRequest, limits: Limits) -> EventFilter:
    """A WatchPromises filter, validated as a search's id glob and tags are."""
    return EventFilter(search_id_glob(request.id, limits), tags(request.tags, limits))


_PB_EVENT_TYPES = {
    EventType.CREATED: promises_pb2.PROMISE_EVENT_TYPE_CREATED,
    EventType.SETTLED: promises_pb2.PROMISE_EVENT_TYPE_SETTLED,
    EventType.TIMED_OUT: promises_pb2.PROMISE_EVENT_TYPE_TIMED_OUT,
}


def event_to_pb(
    event: PromiseEvent, shown: types_pb2.Promise | None = None
) -> promises_pb2.WatchPromisesResponse:
    """`event` on the wire; `shown` is its promise as the watcher may see it."""
    return promises_pb2.WatchPromisesResponse(
        type=_PB_EVENT_TYPES[event.type],
        promise=to_pb(event.promise) if shown is None else shown,
    )


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
    if value.HasField("json"):
        value = _json_payload(value, field)
    size = len(value.data) + sum(len(k) + len(v) for k, v in value.headers.items())
    if size > limits.max_payload_bytes:
        raise InvalidArgument(
            field,
            f"is {size_text(size)}; the limit is {size_text(limits.max_payload_bytes)} "
            "(data plus headers)",
        )
    return Payload(dict(value.headers), value.data)


def _json_payload(value: types_pb2.Payload, field: str) -> types_pb2.Payload:
    """`json` (a google.protobuf.Value, for callers without a codec such as grpcurl) as
    the compact UTF-8 JSON `data` the SDK's codec writes, with its content type."""
    if value.data:
        raise InvalidArgument(field, "has both data and json: send one of them")
    headers = dict(value.headers)
    sent_type = WirePayload(headers=headers).content_type
    if sent_type is None:
        headers[CONTENT_TYPE_HEADER] = JSON_CONTENT_TYPE
    elif not WirePayload(headers=headers).is_json:
        raise InvalidArgument(
            f"{field}.headers[content-type]",
            f"is {sent_type!r}, but json carries JSON: drop the header or send data instead",
        )
    try:
        # Keys sorted: a JSON object arrives as a protobuf map, whose order is not kept,
        # so sorting is what makes one value always stored as the same bytes.
        text = json.dumps(
            _plain(value.json),
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            sort_keys=True,
        )
    except ValueError:
        raise InvalidArgument(
            f"{field}.json", "holds NaN or Infinity, which JSON cannot carry"
        ) from None
    return types_pb2.Payload(headers=headers, data=text.encode())


def _plain(value: struct_pb2.Value) -> object:
    """A google.protobuf.Value as plain Python; whole numbers that a double holds exactly
    become ints, so `{"n": 1}` is stored as `1`, not `1.0`."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _plain(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_plain(item) for item in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        whole = number.is_integer() and abs(number) <= _EXACT_INTEGERS
        return int(number) if whole else number
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    return None


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
    check_text("troth-principal", value)
    if len(value) > limits.max_principal_length:
        raise InvalidArgument(
            "troth-principal", f"metadata is longer than {limits.max_principal_length} characters"
        )
    if (prefix := reserved_prefix(value)) is not None:
        raise InvalidArgument(
            "troth-principal",
            f"{value[:60]!r}: names starting with {prefix!r} are reserved for the server's "
            "own records; name yourself otherwise",
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
            "lease",
            f"must be between 1s and {duration_text(limits.max_lease_ms)}; omit it for the default",
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


_PB_TASK_KINDS = {
    TaskKind.INVOKE: tasks_pb2.TASK_KIND_INVOKE,
    TaskKind.RESUME: tasks_pb2.TASK_KIND_RESUME,
}
_PB_TASK_STATES = {
    TaskState.PENDING: tasks_pb2.TASK_STATE_PENDING,
    TaskState.CLAIMED: tasks_pb2.TASK_STATE_CLAIMED,
    TaskState.COMPLETED: tasks_pb2.TASK_STATE_COMPLETED,
}


def task_to_pb(
    task: Task, waiting_for: str = "", version_absent_since: int | None = None
) -> tasks_pb2.Task:
    message = tasks_pb2.Task(
        id=task.id,
        root_promise_id=task.root_promise_id,
        group=task.group,
        kind=_PB_TASK_KINDS[task.kind],
        state=_PB_TASK_STATES[task.state],
        counter=task.counter,
        worker_id=task.worker_id or "",
        workflow=task.workflow or "",
        workflow_version=task.workflow_version or "",
        waiting_for=waiting_for,
        worker_principal=task.worker_principal or "",
        failed_attempts=task.failed_attempts,
        last_error=task.last_error or "",
        last_traceback=task.last_traceback or "",
    )
    if task.lease_expire_time is not None:
        message.lease_expire_time.CopyFrom(_timestamp(task.lease_expire_time))
    if task.next_attempt_time is not None and task.state is TaskState.PENDING:
        message.next_attempt_time.CopyFrom(_timestamp(task.next_attempt_time))
    if task.create_time is not None:
        message.create_time.CopyFrom(_timestamp(task.create_time))
    if version_absent_since is not None:
        message.version_absent_since.CopyFrom(_timestamp(version_absent_since))
    return message


def worker_to_pb(worker: WorkerSummary) -> tasks_pb2.Worker:
    message = tasks_pb2.Worker(
        worker_id=worker.worker_id,
        group=worker.group,
        principal=worker.principal or "",
        workflows=[tasks_pb2.WorkflowVersion(name=n, version=v) for n, v in worker.workflows],
        capacity=worker.capacity,
        task_ids=worker.task_ids,
        streams=worker.streams,
        stalled=worker.stalled,
    )
    message.connect_time.CopyFrom(_timestamp(worker.connect_ms))
    message.last_heartbeat_time.CopyFrom(_timestamp(worker.last_seen_ms))
    return message


def optional_group(value: str, limits: Limits) -> str:
    """A search's group filter: empty (every group), or a group name."""
    return name(value, limits, "group") if value else ""


def workflows(values: Sequence[tasks_pb2.WorkflowVersion]) -> list[tuple[str, str]]:
    """A Poll request's workflow versions, in the order given (the first version
    listed for a name is the one its worker runs new starts with)."""
    if len(values) > MAX_WORKFLOWS:
        raise InvalidArgument(
            "workflows", f"lists {len(values)} entries; the limit is {MAX_WORKFLOWS}"
        )
    found: list[tuple[str, str]] = []
    for entry in values:
        if not entry.name or len(entry.name) > MAX_WORKFLOW_NAME:
            raise InvalidArgument(
                "workflows.name",
                f"{entry.name[:60]!r} must be 1 to {MAX_WORKFLOW_NAME} characters: "
                "the workflow's registered name",
            )
        version = entry.version
        if (
            not version
            or len(version) > MAX_WORKFLOW_VERSION
            or not version.isprintable()
            or (version.strip() != version)
        ):
            raise InvalidArgument(
                "workflows.version",
                f"{version[:60]!r} (workflow {entry.name[:60]!r}) must be 1 to "
                f"{MAX_WORKFLOW_VERSION} printable characters without leading or trailing "
                "spaces, e.g. a digest of the workflow's code",
            )
        found.append((entry.name, version))
    return found


MAX_WAIT_MS = 300_000
"""The longest a `WaitPromise` waits (5 minutes): a caller waiting longer calls again."""
DEFAULT_WAIT_MS = 60_000


def wait_ms(request: promises_pb2.WaitPromiseRequest | promises_pb2.CreatePromiseRequest) -> int:
    """How long a `WaitPromise` (or a `CreatePromise` with `wait`) may wait for the
    settle, in ms."""
    if not request.HasField("wait"):
        return DEFAULT_WAIT_MS
    wait = request.wait
    if wait.seconds < 0 or not 0 <= wait.nanos < 1_000_000_000 or _duration_ms(wait) > MAX_WAIT_MS:
        raise InvalidArgument(
            "wait",
            f"must be from 0s to {MAX_WAIT_MS // 1000}s; to wait longer, call again with what "
            f"is left (omit it to wait {DEFAULT_WAIT_MS // 1000}s)",
        )
    return _duration_ms(wait)


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
        root_id=promise.root_id or "",
        parent_id=promise.parent_id or "",
        started_by=promise.started_by or "",
    )
    if promise.approvers is not None:
        message.approvers.CopyFrom(approvers_to_pb(promise.approvers))
    if promise.settle_time is not None:
        message.settle_time.CopyFrom(_timestamp(promise.settle_time))
    if promise.expire_time is not None:
        message.expire_time.CopyFrom(_timestamp(promise.expire_time))
    return message


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)
