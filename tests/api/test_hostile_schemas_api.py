"""Hostile schemas and values against a real server (every back end): each is
answered at once, `INVALID_ARGUMENT` naming the field and the limit (or OK where
the value is valid and bounded), never INTERNAL and never a stall.

Each call has a deadline of a few seconds: before the bounded validator, every
one of these either ran for seconds to hours (a deadline exceeded) or crashed
with a RecursionError (INTERNAL).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from _support import error_info

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc
from troth.v1 import types_pb2 as types

DEADLINE = 30.0
"""Generous: checks run at a low priority, and on a loaded 2-core machine the budget-
bound ones take seconds; unbounded, they took hours (or crashed at once)."""


def uid() -> str:
    return f"hostile-{uuid.uuid4().hex[:12]}"


def json_value(value: object) -> types.Payload:
    return types.Payload(
        headers={"content-type": "application/json"}, data=json.dumps(value).encode()
    )


def refused(call: Any, request: object, field: str, *words: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=DEADLINE)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (error.code(), error.details())
    info = error_info(error)
    assert (info.reason, info.metadata["field"]) == ("INVALID_ARGUMENT", field), error.details()
    details = error.details() or ""
    for word in words:
        assert word in details, details
    return details


def create(stub: promises_pb2_grpc.PromiseServiceStub, schema: object) -> str:
    promise_id = uid()
    request = pb.CreatePromiseRequest(id=promise_id, schema=json.dumps(schema))
    stub.CreatePromise(request, timeout=DEADLINE)
    return promise_id


def resolve(stub: promises_pb2_grpc.PromiseServiceStub, promise_id: str, value: object) -> Any:
    request = pb.ResolvePromiseRequest(id=promise_id, value=json_value(value))
    return stub.ResolvePromise(request, timeout=DEADLINE)


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def nested_list(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


def test_a_catastrophic_backtracking_pattern_answers_at_once(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise_id = create(stub, {"type": "string", "pattern": "^(a+)+$"})
    # 27 `a`s stalled Python's backtracking engine for 6-10 s; 40 would take days.
    stub_resolve = stub.ResolvePromise
    request = pb.ResolvePromiseRequest(id=promise_id, value=json_value("a" * 40 + "!"))
    refused(stub_resolve, request, "value", "does not match", "schema rule #/pattern")
    assert resolve(stub, promise_id, "a" * 40).applied


def test_pattern_properties_and_additional_properties_use_the_linear_engine(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    promise_id = create(stub, schema)
    hostile = "a" * 40 + "!"
    request = pb.ResolvePromiseRequest(id=promise_id, value=json_value({hostile: 1}))
    refused(stub.ResolvePromise, request, "value", "does not match any of the regexes")
    assert resolve(stub, promise_id, {"a" * 40: 1}).applied


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(a)\\1", "backreference"), ("a(?=b)", "lookaround"), ("(?<!x)y", "lookaround")],
)
def test_a_pattern_the_linear_engine_cannot_run_is_refused_at_create(
    stub: promises_pb2_grpc.PromiseServiceStub, pattern: str, why: str
) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": pattern}}}
    request = pb.CreatePromiseRequest(id=uid(), schema=json.dumps(schema))
    refused(stub.CreatePromise, request, "schema.properties.name.pattern", why, "RE2")
    keyed = {"type": "object", "patternProperties": {pattern: {}}}
    request = pb.CreatePromiseRequest(id=uid(), schema=json.dumps(keyed))
    refused(stub.CreatePromise, request, "schema.patternProperties", why)


def test_unique_items_over_thousands_of_objects_answers_at_once(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise_id = create(stub, {"type": "array", "uniqueItems": True})
    # 2,500 distinct objects (30 KB) stalled every write for 6-11 s.
    items = [{"id": i, "tags": [str(i), {"n": i}]} for i in range(2500)]
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value([*items, {"id": 7}, {"id": 7}])),
        "value",
        "non-unique",
    )
    assert resolve(stub, promise_id, items).applied


def test_unique_items_up_to_the_value_limit_is_refused_naming_the_limit(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    promise_id = create(stub, {"type": "array", "uniqueItems": True})
    items = [{"i": i} for i in range(65_000)]  # just under 1 MB of JSON
    assert len(json.dumps(items)) < 1_048_576
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value(items)),
        "value",
        "65000 items",
        "--max-unique-items",
    )


def test_a_schema_400_levels_deep_is_refused_at_create(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    request = pb.CreatePromiseRequest(id=uid(), schema=json.dumps(deep_schema(400)))
    refused(stub.CreatePromise, request, "schema", "deeper than", "--max-schema-depth")


def test_a_value_under_a_recursive_ref_schema_is_bounded(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    schema = {"$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
    promise_id = create(stub, {**schema, "$ref": "#/$defs/node"})
    # 500 levels: under the JSON parser's own limit, far past Python's recursion.
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value(nested_list(500))),
        "value",
        "nests deeper than 64 levels",
        "--max-value-depth",
    )
    assert resolve(stub, promise_id, nested_list(20)).applied


def test_a_ref_cycle_that_never_descends_is_refused_not_crashed(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    schema = {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}
    promise_id = create(stub, schema)
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value(1)),
        "value",
        "--max-check-depth",
    )


def test_an_exponential_schema_is_stopped_by_the_step_budget(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    # 40 definitions, each trying the next one twice: 2**40 checks of one value.
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(40)
    }
    defs["d40"] = {"type": "string"}
    promise_id = create(stub, {"$defs": defs, "$ref": "#/$defs/d0"})
    refused(
        stub.ResolvePromise,
        pb.ResolvePromiseRequest(id=promise_id, value=json_value(1)),
        "value",
        "--max-schema-steps",
    )
    # A value the first branch accepts is checked in linear time.
    assert resolve(stub, promise_id, "fine").applied


def test_a_draft_named_inside_a_schema_is_refused_at_create(
    stub: promises_pb2_grpc.PromiseServiceStub,
) -> None:
    # A nested `$schema` would switch the check to a validator outside the bounds.
    inner = {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "^(a+)+$"}
    schema = {"type": "object", "properties": {"a": inner}}
    request = pb.CreatePromiseRequest(id=uid(), schema=json.dumps(schema))
    refused(stub.CreatePromise, request, "schema.properties.a.$schema", "top")
