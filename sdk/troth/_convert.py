"""Conversions between the wire types of `troth.v1` and the SDK's records.

The only module of the SDK that reads or builds protobuf messages field by
field; `Client` and the CLI see `Promise`, `Payload`, `datetime` and `timedelta`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from google.protobuf import duration_pb2, timestamp_pb2

from troth._approvers import Approvers
from troth._promise import Promise, PromiseEvent, PromiseEventType, PromiseOrder, PromiseState
from troth.codec import Payload
from troth.v1 import promises_pb2, types_pb2


def payload_to_proto(payload: Payload) -> types_pb2.Payload:
    """Build the wire payload."""
    return types_pb2.Payload(headers=dict(payload.headers), data=payload.data)


def payload_from_proto(message: types_pb2.Payload) -> Payload:
    """Read a wire payload."""
    return Payload(headers=dict(message.headers), data=message.data)


_STATE_TO_PROTO: dict[PromiseState, types_pb2.PromiseState] = {
    PromiseState.PENDING: types_pb2.PROMISE_STATE_PENDING,
    PromiseState.RESOLVED: types_pb2.PROMISE_STATE_RESOLVED,
    PromiseState.REJECTED: types_pb2.PROMISE_STATE_REJECTED,
    PromiseState.REJECTED_CANCELED: types_pb2.PROMISE_STATE_REJECTED_CANCELED,
    PromiseState.REJECTED_TIMEDOUT: types_pb2.PROMISE_STATE_REJECTED_TIMEDOUT,
}
_STATE_FROM_PROTO: dict[int, PromiseState] = {
    int(number): state for state, number in _STATE_TO_PROTO.items()
}


def state_to_proto(state: PromiseState) -> types_pb2.PromiseState:
    """Map an SDK state to the proto enum (same names)."""
    return _STATE_TO_PROTO[state]


def state_from_proto(value: int) -> PromiseState:
    """Map a proto enum value to the SDK state.

    Raises:
        ValueError: The server sent a state this SDK does not know; upgrade it.
    """
    try:
        return _STATE_FROM_PROTO[value]
    except KeyError:
        raise ValueError(
            f"the server sent promise state {value!r}, which this SDK does not know; "
            "upgrade the troth package to match the server"
        ) from None


def datetime_to_proto(moment: datetime) -> timestamp_pb2.Timestamp:
    """Build a Timestamp from an aware datetime.

    Raises:
        ValueError: `moment` is naive, so its instant is ambiguous.
    """
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(
            f"datetime {moment.isoformat()} has no timezone, so the instant is ambiguous; "
            "pass an aware datetime, e.g. datetime.now(UTC) + timedelta(hours=1)"
        )
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(moment)
    return stamp


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def datetime_from_proto(stamp: timestamp_pb2.Timestamp) -> datetime:
    """Read a Timestamp as an aware UTC datetime (what `stamp.ToDatetime(tzinfo=UTC)`
    gives, its microseconds truncated, in half its time: a worker reads several a step)."""
    return _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def timedelta_to_proto(delta: timedelta) -> duration_pb2.Duration:
    """Build a Duration from a timedelta."""
    duration = duration_pb2.Duration()
    duration.FromTimedelta(delta)
    return duration


def promise_from_proto(message: types_pb2.Promise) -> Promise:
    """Read a wire promise into the SDK's frozen record."""
    return Promise(
        id=message.id,
        state=state_from_proto(message.state),
        param=payload_from_proto(message.param),
        value=payload_from_proto(message.value),
        tags=dict(message.tags),
        create_time=datetime_from_proto(message.create_time),
        settle_time=(
            datetime_from_proto(message.settle_time) if message.HasField("settle_time") else None
        ),
        expire_time=(
            datetime_from_proto(message.expire_time) if message.HasField("expire_time") else None
        ),
        idempotency_key_for_create=message.idempotency_key_for_create,
        idempotency_key_for_settle=message.idempotency_key_for_settle,
        settled_by=message.settled_by,
        schema=json.loads(message.schema) if message.schema else None,
        title=message.title,
        message=message.message,
        requested_by=message.requested_by,
        workflow_version=message.workflow_version,
        root_id=message.root_id,
        parent_id=message.parent_id,
        approvers=Approvers.from_proto(message.approvers)
        if message.HasField("approvers")
        else None,
        started_by=message.started_by,
    )


_ORDER_TO_PROTO: dict[PromiseOrder, promises_pb2.PromiseOrder] = {
    PromiseOrder.CREATED_ASC: promises_pb2.PROMISE_ORDER_CREATED_ASC,
    PromiseOrder.CREATED_DESC: promises_pb2.PROMISE_ORDER_CREATED_DESC,
    PromiseOrder.EXPIRE_TIME_ASC: promises_pb2.PROMISE_ORDER_EXPIRE_TIME_ASC,
}
_EVENT_TYPE_FROM_PROTO: dict[int, PromiseEventType] = {
    promises_pb2.PROMISE_EVENT_TYPE_CREATED: PromiseEventType.CREATED,
    promises_pb2.PROMISE_EVENT_TYPE_SETTLED: PromiseEventType.SETTLED,
    promises_pb2.PROMISE_EVENT_TYPE_TIMED_OUT: PromiseEventType.TIMED_OUT,
}


def order_to_proto(order: PromiseOrder) -> promises_pb2.PromiseOrder:
    """Map an SDK search order to the proto enum (same names)."""
    return _ORDER_TO_PROTO[order]


def event_from_proto(message: promises_pb2.WatchPromisesResponse) -> PromiseEvent | None:
    """Read a wire event; None for an event type this SDK does not know (a newer
    server's), which a caller skips."""
    kind = _EVENT_TYPE_FROM_PROTO.get(message.type)
    return None if kind is None else PromiseEvent(kind, promise_from_proto(message.promise))


def parse_order(value: PromiseOrder | str) -> PromiseOrder:
    """A search order from its enum or name (ValueError naming the known ones)."""
    try:
        return PromiseOrder(value)
    except ValueError:
        names = ", ".join(order.value for order in PromiseOrder)
        raise ValueError(f"unknown search order {value!r}; use one of {names}") from None


def search_cut_off(
    created_before: datetime | None, older_than: timedelta | None
) -> datetime | None:
    """A search's `created_before`: given, or `older_than` ago by this machine's clock."""
    if older_than is None:
        return created_before
    if created_before is not None:
        raise ValueError("pass created_before or older_than, not both")
    if older_than < timedelta(0):
        raise ValueError(f"older_than={older_than!r} must not be negative")
    return datetime.now(UTC) - older_than


def parse_state(value: PromiseState | str) -> PromiseState:
    """A promise state from its enum or name (ValueError naming the known ones)."""
    try:
        return PromiseState(value)
    except ValueError:
        names = ", ".join(state.value for state in PromiseState)
        raise ValueError(f"unknown promise state {value!r}; use one of {names}") from None
