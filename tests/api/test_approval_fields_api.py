"""The approval fields of CreatePromise (schema, title, message, requested_by) and
settling before the wait exists, against a real server (every back end): what is
stored, and bad input refused naming the field."""

from __future__ import annotations

import json
import uuid

import grpc
import pytest
from _support import error_info

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

SCHEMA = json.dumps(
    {"type": "object", "properties": {"approved": {"type": "boolean"}}, "required": ["approved"]}
)


def uid() -> str:
    return f"ask-{uuid.uuid4().hex[:12]}"


def json_value(value: object) -> types.Payload:
    return types.Payload(
        headers={"content-type": "application/json"}, data=json.dumps(value).encode()
    )


def refused(call: object, request: object, field: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)  # type: ignore[operator]
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info(error)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field), error.details()
    return error


def test_requested_by_defaults_to_the_callers_principal(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    alice = [("troth-principal", "alice")]
    made = stub.CreatePromise(pb.CreatePromiseRequest(id=uid()), metadata=alice).promise
    assert made.requested_by == "alice"
    named = pb.CreatePromiseRequest(id=uid(), requested_by="workflow w-1")
    assert stub.CreatePromise(named, metadata=alice).promise.requested_by == "workflow w-1"
    assert stub.CreatePromise(pb.CreatePromiseRequest(id=uid())).promise.requested_by == ""


def test_approval_fields_round_trip(stub: promises_pb2_grpc.PromiseServiceStub) -> None:
    request = pb.CreatePromiseRequest(
        id=uid(), schema=SCHEMA, title="Publish?", message="é" * 100, requested_by="ops"
    )
    made = stub.CreatePromise(request).promise
    read = stub.GetPromise(pb.GetPromiseRequest(id=request.id)).promise
    for promise in (made, read):
        assert (promise.schema, promise.title, promise.message, promise.requested_by) == (
            SCHEMA,
            "Publish?",
            "é" * 100,
            "ops",
        )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"schema": "{not json"}, "schema"),
        ({"schema": "[1, 2]"}, "schema"),
        ({"schema": json.dumps({"type": "no-such-type"})}, "schema.type"),
        ({"schema": json.dumps({"description": "x" * 70_000})}, "schema"),
        ({"title": "t" * 1025}, "title"),
        ({"requested_by": "r" * 257}, "requested_by"),
        # The limit is in bytes: 40,000 two-byte characters are over 65,536 bytes.
        ({"message": "é" * 40_000}, "message"),
    ],
)
def test_bad_approval_fields_are_refused_naming_the_field(
    stub: promises_pb2_grpc.PromiseServiceStub, fields: dict[str, str], field: str
) -> None:
    refused(stub.CreatePromise, pb.CreatePromiseRequest(id=uid(), **fields), field)  # type: ignore[arg-type]


def test_a_resolve_must_match_the_schema_and_a_reject_need_not(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise_id = uid()
    stub.CreatePromise(pb.CreatePromiseRequest(id=promise_id, schema=SCHEMA))
    resolve = stub.ResolvePromise
    refused(resolve, pb.ResolvePromiseRequest(id=promise_id, value=json_value({})), "value")
    wrong = json_value({"approved": "yes"})
    refused(resolve, pb.ResolvePromiseRequest(id=promise_id, value=wrong), "value.approved")
    text = types.Payload(headers={"content-type": "text/plain"}, data=b"yes")
    refused(resolve, pb.ResolvePromiseRequest(id=promise_id, value=text), "value")
    assert (
        stub.GetPromise(pb.GetPromiseRequest(id=promise_id)).promise.state
        == types.PROMISE_STATE_PENDING
    )
    settled = stub.RejectPromise(pb.RejectPromiseRequest(id=promise_id, value=text))
    assert settled.applied and settled.promise.state == types.PROMISE_STATE_REJECTED


def test_a_schema_whose_ref_cannot_be_resolved_refuses_resolves_but_not_rejects(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise_id = uid()
    schema = json.dumps({"properties": {"a": {"$ref": "https://example.invalid/a.json"}}})
    stub.CreatePromise(pb.CreatePromiseRequest(id=promise_id, schema=schema))
    # The $ref is reached only through a value that has `a`.
    error = refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value({"a": 1})),
        "value",
    )
    assert "example.invalid" in (error.details() or "")
    settled = stub.RejectPromise(pb.RejectPromiseRequest(id=promise_id))
    assert settled.applied and settled.promise.state == types.PROMISE_STATE_REJECTED


def test_an_early_settle_is_adopted_once_and_a_pending_early_tag_changes_nothing(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    early_id = uid()
    early = stub.ResolvePromise(
        pb.ResolvePromiseRequest(id=early_id, value=json_value(1), create_if_missing=True)
    )
    assert early.applied and dict(early.promise.tags) == {"troth:early": "true"}
    create = pb.CreatePromiseRequest(id=early_id, tags={"inbox": "x"}, title="Go?")
    adopted = stub.CreatePromise(create)
    assert not adopted.created and adopted.promise.state == types.PROMISE_STATE_RESOLVED
    read = stub.GetPromise(pb.GetPromiseRequest(id=early_id)).promise
    assert (dict(read.tags), read.title) == ({"inbox": "x"}, "Go?")

    # A creator's own troth:early tag on a pending promise is only a tag: a
    # different create of the id is refused, as for any other promise.
    pending_id = uid()
    tagged = pb.CreatePromiseRequest(id=pending_id, tags={"troth:early": "true"})
    stub.CreatePromise(tagged)
    other = pb.CreatePromiseRequest(id=pending_id, tags={"troth:early": "true", "x": "y"})
    with pytest.raises(grpc.RpcError) as caught:
        stub.CreatePromise(other, timeout=10)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert dict(stub.GetPromise(pb.GetPromiseRequest(id=pending_id)).promise.tags) == {
        "troth:early": "true"
    }


def test_without_the_flag_an_unknown_id_is_not_found(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.RejectPromise(pb.RejectPromiseRequest(id=uid()), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "NOT_FOUND"
