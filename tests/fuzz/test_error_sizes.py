"""Every error fits in gRPC's trailers: a long message must not turn it into another error.

Found by the fuzzer (issue 10, item 5): an error whose message echoes what the
caller sent (a schema check quoting a large value, an ALREADY_SETTLED quoting
the cancel reason it was given) grew past the 16 KiB the client accepts for
trailing metadata, so the client got RESOURCE_EXHAUSTED "received metadata
size exceeds hard limit" with no ErrorInfo instead of the answer, and a client
that retries RESOURCE_EXHAUSTED retried a mistake. Messages are bounded where
statuses are made (`api/_status.py`), whatever put the text in them.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from _support import error_info

from troth.v1 import promises_pb2, types_pb2

if TYPE_CHECKING:
    from troth.v1 import promises_pb2_grpc

pytestmark = pytest.mark.fuzz
JSON = {"content-type": "application/json"}


def _error(call: Any, request: object) -> Any:
    """The error a call fails with (typed Any: grpc's stubs do not type RpcError's
    accessors)."""
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


def test_a_schema_error_about_a_large_value_is_invalid_argument(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = f"big-{uuid.uuid4().hex[:8]}"
    stub.CreatePromise(
        promises_pb2.CreatePromiseRequest(id=pid, schema='{"type":"array","maxItems":1}'),
        timeout=30,
    )
    value = json.dumps(list(range(100_000))).encode()  # 600 kB, under the payload limit
    error = _error(
        stub.ResolvePromise,
        promises_pb2.ResolvePromiseRequest(
            id=pid, value=types_pb2.Payload(headers=JSON, data=value)
        ),
    )
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info(error)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", "value")
    assert len(error.details().encode()) <= 2048


def test_already_settled_quoting_a_long_cancel_reason_is_failed_precondition(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    pid = f"why-{uuid.uuid4().hex[:8]}"
    stub.CreatePromise(promises_pb2.CreatePromiseRequest(id=pid), timeout=30)
    reason = json.dumps({"reason": "\u00e9" * 200_000}, ensure_ascii=False).encode()
    stub.CancelPromise(
        promises_pb2.CancelPromiseRequest(
            id=pid, value=types_pb2.Payload(headers=JSON, data=reason)
        ),
        timeout=30,
    )
    error = _error(stub.ResolvePromise, promises_pb2.ResolvePromiseRequest(id=pid))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert error_info(error).reason == "ALREADY_SETTLED"
    assert "was already canceled" in error.details()
