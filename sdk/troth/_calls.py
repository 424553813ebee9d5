"""`Connection`: one client's transport and call deadline, and the promise calls on
already-encoded payloads that `Client` and the worker's runner share.

`Client` encodes values with its codec and calls `create`/`settle` here; the
worker's runner records its steps through the same calls, with the fence of
the task it holds (interfaces §1: every step write carries it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from troth._convert import (
    datetime_to_proto,
    payload_to_proto,
    promise_from_proto,
    timedelta_to_proto,
)
from troth._promise import CreateResult, SettleResult
from troth.v1 import promises_pb2, types_pb2

if TYPE_CHECKING:
    import grpc

    from troth._approvers import Approvers
    from troth._promise import Promise
    from troth._transport import Transport
    from troth.codec import Payload

__all__ = ["Connection", "SettleRequest", "schema_text"]

_R = TypeVar("_R")

SettleRequest = (
    promises_pb2.ResolvePromiseRequest
    | promises_pb2.RejectPromiseRequest
    | promises_pb2.CancelPromiseRequest
)
"""The request of each way to settle a promise."""


class Connection:
    """A `Transport` and the seconds each call may take (retries included).

    Thread-safe, as the transport is. Made by `Client`; the worker and the
    CLI reach it through `troth.client.connection(client)`.
    """

    def __init__(self, transport: Transport, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, _R],
        request: object,
        *,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> _R:
        """A unary call through the transport, with this connection's deadline by default."""
        return self.transport.call(
            method, request, timeout=self.timeout if timeout is None else timeout,
            idempotent=idempotent,
        )  # fmt: skip

    def get(self, id: str) -> Promise:
        request = promises_pb2.GetPromiseRequest(id=id)
        response = self.call(self.transport.promises.GetPromise, request)
        return promise_from_proto(response.promise)

    @staticmethod
    def create_request(
        id: str,
        param: Payload,
        *,
        tags: Mapping[str, str],
        ttl: timedelta | None = None,
        expire_time: datetime | None = None,
        never_expires: bool = False,
        idempotency_key: str | None = None,
        strict: bool = False,
        resolved_with: Payload | None = None,
        rejected_with: Payload | None = None,
        schema: Mapping[str, Any] | None = None,
        title: str = "",
        message: str = "",
        requested_by: str = "",
        fence: types_pb2.TaskFence | None = None,
        approvers: Approvers | None = None,
        state: tuple[str, bool] | None = None,
        wait: float | None = None,
    ) -> promises_pb2.CreatePromiseRequest:
        """The `CreatePromiseRequest` of `create` (a worker carries a step's in the
        `CompleteTask` that ends its task's hold: `troth._carry`)."""
        request = promises_pb2.CreatePromiseRequest(
            id=id,
            param=payload_to_proto(param),
            tags=dict(tags),
            never_expires=never_expires,
            idempotency_key=idempotency_key or "",
            strict=strict,
            schema=schema_text(schema),
            title=title,
            message=message,
            requested_by=requested_by,
        )
        if ttl is not None:
            request.ttl.CopyFrom(timedelta_to_proto(ttl))
        elif expire_time is not None:
            request.expire_time.CopyFrom(datetime_to_proto(expire_time))
        if resolved_with is not None:
            request.resolved_with.CopyFrom(payload_to_proto(resolved_with))
        elif rejected_with is not None:
            request.rejected_with.CopyFrom(payload_to_proto(rejected_with))
        if fence is not None:
            request.fence.CopyFrom(fence)
        if approvers is not None:
            request.approvers.CopyFrom(approvers.to_proto())
        if state is not None:  # a workflow's read or write of its state slot (name, write)
            request.state.CopyFrom(promises_pb2.WorkflowStateStep(name=state[0], write=state[1]))
        if wait is not None:  # answered once settled, or after `wait` seconds
            request.wait.FromMilliseconds(round(wait * 1000))
        return request

    def create(
        self, request: promises_pb2.CreatePromiseRequest, *, timeout: float | None = None
    ) -> CreateResult:
        """Create a promise (`Client.create`, a start, a workflow step) as `request`
        (`create_request`) asks; with a result it is created already settled. The
        arguments are the caller's to check. `timeout`: the call's, if not the
        connection's (a create that waits for the settle takes longer)."""
        response = self.call(self.transport.promises.CreatePromise, request, timeout=timeout)
        return CreateResult(promise=promise_from_proto(response.promise), created=response.created)

    def settle(
        self,
        kind: type[SettleRequest],
        id: str,
        value: Payload,
        *,
        idempotency_key: str | None = None,
        strict: bool = False,
        create_if_missing: bool = False,
        settle_token: str | None = None,
        fence: types_pb2.TaskFence | None = None,
    ) -> SettleResult:
        """Resolve, reject or cancel (by `kind`, the request's type) a pending promise
        with an encoded value. Without an `idempotency_key` a fresh one makes a retry
        of a settle whose reply was lost harmless, and counts as this call's (`applied`).
        The arguments are the caller's to check."""
        generated = not idempotency_key
        key = uuid.uuid4().hex if generated else idempotency_key
        request = kind(id=id, value=payload_to_proto(value), idempotency_key=key, strict=strict)
        stubs = self.transport.promises
        if not isinstance(request, promises_pb2.CancelPromiseRequest):
            # A cancel takes none of these: a wait that does not exist yet needs no
            # cancel, and a worker's step is settled, not cancelled.
            request.create_if_missing = create_if_missing
            if settle_token:
                request.settle_token = settle_token
                # Its own permission, good with no credential: a stream would need one.
                stubs = self.transport.unary_promises
            if fence is not None:
                request.fence.CopyFrom(fence)
        else:
            assert not (create_if_missing or settle_token or fence is not None), "cancel: none"
        response = self.call(getattr(stubs, kind.__name__.removesuffix("Request")), request)
        promise = promise_from_proto(response.promise)
        # A generated key is unique to this call, so a promise settled with it
        # was settled by this call: an earlier attempt whose reply was lost.
        applied = response.applied or (generated and promise.idempotency_key_for_settle == key)
        waiting = getattr(response, "workflow_waiting", "") or None  # not on a cancel's
        return SettleResult(promise=promise, applied=applied, workflow_waiting=waiting)

    def mint_settle_token(
        self,
        id: str,
        *,
        outcomes: Iterable[str] = (),
        ttl: timedelta | None = None,
        fence: types_pb2.TaskFence | None = None,
        acts_for: str | None = None,
    ) -> str:
        """A settle token for the pending promise `id` (outcomes "resolve"/"reject"),
        acting for the caller or the principal `acts_for`."""
        states = {
            "resolve": types_pb2.PROMISE_STATE_RESOLVED,
            "reject": types_pb2.PROMISE_STATE_REJECTED,
        }
        unknown = sorted(set(outcomes) - set(states))
        if unknown:
            raise ValueError(f"settle token outcomes are 'resolve' and 'reject', not {unknown}")
        request = promises_pb2.MintSettleTokenRequest(
            promise_id=id, outcomes=[states[o] for o in sorted(set(outcomes))]
        )
        if ttl is not None:
            request.ttl.CopyFrom(timedelta_to_proto(ttl))
        if fence is not None:
            request.fence.CopyFrom(fence)
        if acts_for:
            request.acts_for = acts_for
        return self.call(self.transport.promises.MintSettleToken, request).token


def schema_text(schema: Mapping[str, Any] | None) -> str:
    """A JSON Schema as the wire carries it ("" for none)."""
    return "" if schema is None else json.dumps(schema, separators=(",", ":"))
