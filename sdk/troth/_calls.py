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
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from troth._convert import payload_to_proto, promise_from_proto, timedelta_to_proto
from troth._promise import CreateResult
from troth.v1 import promises_pb2, types_pb2

if TYPE_CHECKING:
    import grpc

    from troth._approvers import Approvers
    from troth._promise import Promise
    from troth._transport import Transport
    from troth.codec import Payload

__all__ = ["Connection", "schema_text"]

_R = TypeVar("_R")


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

    def create(
        self,
        id: str,
        param: Payload,
        *,
        tags: Mapping[str, str],
        ttl: timedelta | None = None,
        idempotency_key: str | None = None,
        resolved_with: Payload | None = None,
        rejected_with: Payload | None = None,
        schema: Mapping[str, Any] | None = None,
        title: str = "",
        message: str = "",
        requested_by: str = "",
        fence: types_pb2.TaskFence | None = None,
        approvers: Approvers | None = None,
    ) -> CreateResult:
        """Create a promise with a param already encoded (a start, a workflow step); with
        `resolved_with`/`rejected_with` it is created already settled."""
        request = promises_pb2.CreatePromiseRequest(
            id=id,
            param=payload_to_proto(param),
            tags=dict(tags),
            idempotency_key=idempotency_key or "",
            schema=schema_text(schema),
            title=title,
            message=message,
            requested_by=requested_by,
        )
        if ttl is not None:
            request.ttl.CopyFrom(timedelta_to_proto(ttl))
        if resolved_with is not None:
            request.resolved_with.CopyFrom(payload_to_proto(resolved_with))
        elif rejected_with is not None:
            request.rejected_with.CopyFrom(payload_to_proto(rejected_with))
        if fence is not None:
            request.fence.CopyFrom(fence)
        if approvers is not None:
            request.approvers.CopyFrom(approvers.to_proto())
        response = self.call(self.transport.promises.CreatePromise, request)
        return CreateResult(promise=promise_from_proto(response.promise), created=response.created)

    def settle(
        self, id: str, value: Payload, *, ok: bool, fence: types_pb2.TaskFence | None = None
    ) -> Promise:
        """Resolve (`ok`) or reject a pending promise with an encoded value; a fresh
        idempotency key makes a retry of a settle whose reply was lost harmless."""
        promises = self.transport.promises
        key = uuid.uuid4().hex
        if ok:
            resolve = promises_pb2.ResolvePromiseRequest(
                id=id, value=payload_to_proto(value), idempotency_key=key
            )
            if fence is not None:
                resolve.fence.CopyFrom(fence)
            return promise_from_proto(self.call(promises.ResolvePromise, resolve).promise)
        reject = promises_pb2.RejectPromiseRequest(
            id=id, value=payload_to_proto(value), idempotency_key=key
        )
        if fence is not None:
            reject.fence.CopyFrom(fence)
        return promise_from_proto(self.call(promises.RejectPromise, reject).promise)

    def mint_settle_token(
        self,
        id: str,
        *,
        outcomes: Iterable[str] = (),
        ttl: timedelta | None = None,
        fence: types_pb2.TaskFence | None = None,
    ) -> str:
        """A settle token for the pending promise `id` (outcomes "resolve"/"reject")."""
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
        return self.call(self.transport.promises.MintSettleToken, request).token


def schema_text(schema: Mapping[str, Any] | None) -> str:
    """A JSON Schema as the wire carries it ("" for none)."""
    return "" if schema is None else json.dumps(schema, separators=(",", ":"))
