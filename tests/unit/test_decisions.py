"""Typed decisions without a server: the server's schema checks (`domain.schema`),
settling before the wait exists (`domain.promise`), and the SDK's schemas from
dataclasses and pydantic models (`troth._schema`)."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth._schema import decision_schema, to_json_compatible
from troth.codec import JsonCodec
from troth_server.domain import promise as domain
from troth_server.domain._bounded import MESSAGE_LIMIT, quoting_briefly, short_repr
from troth_server.domain.errors import (
    InvalidArgument,
    PromiseAlreadySettled,
    PromiseNotFound,
    ValueNotChecked,
)
from troth_server.domain.promise import CreateRequest, Payload, PromiseState, SettleRequest
from troth_server.domain.schema import SchemaBounds, check_schema, check_value, field_path

T0 = 1_767_225_600_000

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "tools": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
        },
        "required": ["approved"],
    }
)


def json_payload(value: Any) -> Payload:
    return Payload({"content-type": "application/json"}, json.dumps(value).encode())


# --- the server's checks ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"approved": "yes"}, "value.approved"),
        ({}, "value"),
        ({"approved": True, "tools": [{"name": "a"}, {"name": 7}]}, "value.tools[1].name"),
        ([], "value"),
    ],
)
def test_a_value_that_breaks_the_schema_names_the_field(value: Any, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_value(SCHEMA, json_payload(value))
    assert refused.value.field == field
    assert "schema rule #/" in refused.value.message


def test_a_value_that_fits_passes() -> None:
    check_value(SCHEMA, json_payload({"approved": False, "tools": [{"name": "x"}]}))


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (Payload({"content-type": "text/plain"}, b"yes"), "must be JSON"),
        (Payload(), "needs a value"),
        (Payload({"content-type": "application/json"}, b"{nope"), "not valid JSON"),
    ],
)
def test_a_value_that_is_not_json_is_refused(payload: Payload, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        check_value(SCHEMA, payload)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "schema"),
        ("[1, 2]", "schema"),
        ('{"type": "no-such-type"}', "schema.type"),
        ('{"properties": {"a": {"minimum": "ten"}}}', "schema.properties.a.minimum"),
    ],
)
def test_a_bad_schema_is_refused_naming_where(text: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_schema(text)
    assert refused.value.field == field


@given(st.lists(st.one_of(st.text(min_size=1, max_size=5), st.integers(0, 9)), max_size=4))
def test_field_paths_read_like_python(parts: list[str | int]) -> None:
    path = field_path("value", parts)
    expected = "value" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    assert path == expected


def test_only_a_resolve_is_checked_against_the_schema() -> None:
    pending, _ = domain.create(None, CreateRequest("a", Payload(), {}, schema=SCHEMA), T0)
    bad = json_payload({"approved": "maybe"})
    with pytest.raises(InvalidArgument):
        check_value(SCHEMA, bad)
    for state in (PromiseState.REJECTED, PromiseState.REJECTED_CANCELED):
        settled, applied = domain.settle(pending, SettleRequest("a", state, bad), T0 + 1)
        assert applied and settled.state is state


def test_the_writer_applies_a_resolve_only_if_checked_against_the_schema_it_sees() -> None:
    """The check runs before the write (off the writer); the domain only compares
    the schema the value was checked against with the promise's."""
    pending, _ = domain.create(None, CreateRequest("a", Payload(), {}, schema=SCHEMA), T0)
    good = json_payload({"approved": True})
    for checked in (None, '{"type": "object"}'):
        request = SettleRequest("a", PromiseState.RESOLVED, good, checked_schema=checked)
        with pytest.raises(ValueNotChecked) as missed:
            domain.settle(pending, request, T0 + 1)
        assert missed.value.schema == SCHEMA
    checked = SettleRequest("a", PromiseState.RESOLVED, good, checked_schema=SCHEMA)
    settled, applied = domain.settle(pending, checked, T0 + 1)
    assert applied and settled.state is PromiseState.RESOLVED


# --- settle before the wait exists ------------------------------------------------------


def test_settling_an_unknown_id_needs_the_flag() -> None:
    request = SettleRequest("a", PromiseState.RESOLVED, json_payload(1))
    with pytest.raises(PromiseNotFound):
        domain.settle(None, request, T0)
    early, applied = domain.settle(
        None, SettleRequest("a", PromiseState.RESOLVED, json_payload(1), create_if_missing=True), T0
    )
    assert (
        applied and early.state is PromiseState.RESOLVED and early.tags == {"troth:early": "true"}
    )
    assert early.settle_time == T0 and early.expire_time is None
    with pytest.raises(InvalidArgument, match="not to cancel"):
        domain.settle(
            None,
            SettleRequest("a", PromiseState.REJECTED_CANCELED, Payload(), create_if_missing=True),
            T0,
        )


def test_the_first_create_adopts_an_early_settle_and_repeats_are_recognised() -> None:
    early, _ = domain.settle(
        None,
        SettleRequest("a", PromiseState.REJECTED, json_payload("no"), create_if_missing=True),
        T0,
    )
    create = CreateRequest(
        "a", Payload(), {"troth:kind": "promise"}, ttl=1000, schema=SCHEMA, title="Go?"
    )
    adopted, created = domain.create(early, create, T0 + 5)
    assert not created
    assert (adopted.state, adopted.value, adopted.settle_time) == (
        PromiseState.REJECTED,
        early.value,
        T0,
    )
    assert adopted.tags == {"troth:kind": "promise"} and adopted.title == "Go?"
    again, created = domain.create(adopted, create, T0 + 6)
    assert (again, created) == (adopted, False)
    # Once adopted, a second early settle is an ordinary late one.
    with pytest.raises(PromiseAlreadySettled):
        domain.settle(
            adopted,
            SettleRequest("a", PromiseState.RESOLVED, json_payload(1), create_if_missing=True),
            T0 + 7,
        )


# --- the SDK's schemas ----------------------------------------------------------------


class Tone(enum.Enum):
    FORMAL = "formal"
    CASUAL = "casual"


@dataclass(frozen=True)
class Tool:
    name: str
    weight: float = 1.0


@dataclass(frozen=True)
class Decision:
    approved: bool
    tone: Tone
    mode: Literal["now", "later"]
    tools: list[Tool]
    scores: dict[str, int] = field(default_factory=dict)
    note: str | None = None


def test_a_dataclass_becomes_a_strict_json_schema() -> None:
    schema = decision_schema(Decision).json_schema
    assert schema["required"] == ["approved", "tone", "mode", "tools"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["tone"] == {"enum": ["formal", "casual"]}
    assert props["mode"] == {"enum": ["now", "later"]}
    assert props["tools"]["items"]["properties"]["weight"] == {"type": "number"}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    check_schema(json.dumps(schema))  # the server accepts what the SDK sends


def test_a_dataclass_round_trips_through_json_and_its_schema() -> None:
    value = Decision(True, Tone.CASUAL, "now", [Tool("search", 2)], {"a": 1}, None)
    payload = JsonCodec().encode(value)
    check_value(
        json.dumps(decision_schema(Decision).json_schema), Payload(payload.headers, payload.data)
    )
    decode = decision_schema(Decision).decode
    assert decode is not None
    assert decode(JsonCodec().decode(payload)) == value


def test_a_pydantic_model_is_used_as_it_is() -> None:
    class Budget(pydantic.BaseModel):
        amount: int = pydantic.Field(ge=0)

    schema = decision_schema(Budget)
    assert schema.json_schema == Budget.model_json_schema()
    assert schema.decode is not None and schema.decode({"amount": 3}) == Budget(amount=3)
    assert to_json_compatible(Budget(amount=3)) == {"amount": 3}


def test_a_dict_schema_is_sent_as_it_is_and_not_decoded() -> None:
    schema = decision_schema({"type": "boolean"})
    assert schema.json_schema == {"type": "boolean"} and schema.decode is None


def test_types_without_a_json_schema_are_refused_with_what_to_do() -> None:
    @dataclass
    class Odd:
        when: bytes

    with pytest.raises(TypeError, match=r"Odd\.when: .*JSON Schema dict"):
        decision_schema(Odd)
    with pytest.raises(TypeError, match="dataclass or a pydantic model"):
        decision_schema(int)


# --- the bounds of a check ----------------------------------------------------------


def test_each_bound_is_refused_naming_its_flag() -> None:
    bounds = SchemaBounds(
        max_schema_depth=4, max_value_depth=3, max_schema_steps=30, max_unique_items=5
    )
    deep = json.dumps({"properties": {"a": {"properties": {"b": {"type": "string"}}}}})
    with pytest.raises(InvalidArgument, match="--max-schema-depth") as refused:
        check_schema(deep, bounds)
    assert refused.value.field == "schema"
    flat = json.dumps({"type": "array", "uniqueItems": True})
    check_schema(flat, bounds)
    with pytest.raises(InvalidArgument, match="--max-value-depth"):
        check_value(flat, json_payload([[[[1]]]]), bounds)
    with pytest.raises(InvalidArgument, match=r"6 items.*--max-unique-items"):
        check_value(flat, json_payload([1, 2, 3, 4, 5, 6]), bounds)
    check_value(flat, json_payload([1, 2, 3, 4, 5]), bounds)
    steps = json.dumps({"type": "array", "items": {"type": "integer", "minimum": 0}})
    check_value(steps, json_payload([1] * 10), bounds)
    with pytest.raises(InvalidArgument, match="--max-schema-steps"):
        check_value(steps, json_payload([1] * 40), bounds)


def test_unique_items_uses_json_equality() -> None:
    schema = json.dumps({"type": "array", "uniqueItems": True})
    for same in ([1, 1.0], [{"a": 1, "b": [2]}, {"b": [2], "a": 1}], [[1, {"x": None}]] * 2):
        with pytest.raises(InvalidArgument, match="non-unique"):
            check_value(schema, json_payload(same))
    for distinct in ([1, True], [0, False], [{"a": 1}, {"a": "1"}], [[1, 2], [2, 1]], ["1", 1]):
        check_value(schema, json_payload(distinct))


def test_a_message_quotes_a_huge_value_briefly() -> None:
    schema = json.dumps({"type": "object"})
    with pytest.raises(InvalidArgument) as refused:
        check_value(schema, json_payload(["x" * 100_000] * 10))
    assert len(refused.value.message) < 1000
    assert "is not of type 'object'" in refused.value.message


def test_a_value_quoted_again_and_again_is_quoted_once() -> None:
    # A check that fails 50,000 times quotes its value 50,000 times: the text is
    # built once (it was two thirds of the costliest check's CPU).
    value = quoting_briefly([list(range(1000)), {"a": "x" * 1000}])
    first = repr(value)
    assert repr(value) is first
    assert repr(value[0]) is repr(value[0])
    assert first == short_repr([list(range(1000)), {"a": "x" * 1000}])
    assert first.startswith("[[0, 1, 2, ")
    assert len(first) <= MESSAGE_LIMIT
    assert value == [list(range(1000)), {"a": "x" * 1000}]
