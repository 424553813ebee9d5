"""The console's pure parts: forms from JSON Schemas, and the pages' view models."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth import JsonCodec, Payload, Promise, PromiseState
from troth._commands import TAG_FUNC, TAG_GROUP, TAG_INVOKE, TAG_KIND
from troth.errors import PermissionDeniedError, Reason, UnauthenticatedError, UnavailableError
from troth_server.console import _views
from troth_server.console._forms import RAW_FIELD, FormError, form_for, value_from

DECISION = {
    "type": "object",
    "required": ["approved", "level", "who"],
    "properties": {
        "approved": {"type": "boolean"},
        "level": {"enum": ["low", "high", 3]},
        "note": {"type": "string", "title": "Note", "description": "why"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "who": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        },
    },
}


def test_a_schema_of_plain_fields_becomes_fields_with_required_marks() -> None:
    form = form_for(DECISION)
    assert not form.raw
    by_name = {f.name: f for f in form.fields}
    assert list(by_name) == ["approved", "level", "note", "count", "ratio", "who.name", "who.age"]
    assert by_name["level"].kind == "enum" and by_name["level"].choices == ('"low"', '"high"', "3")
    assert by_name["level"].required and not by_name["note"].required
    assert by_name["who.name"].required and not by_name["who.age"].required
    assert by_name["note"].label == "Note" and by_name["note"].description == "why"


def test_a_filled_form_gives_the_value_it_stands_for() -> None:
    form = form_for(DECISION)
    data = {"approved": "on", "level": "3", "note": "", "count": "7", "ratio": "0.5",
            "who.name": "ada", "who.age": ""}  # fmt: skip
    assert value_from(form, data) == {
        "approved": True, "level": 3, "count": 7, "ratio": 0.5, "who": {"name": "ada"},
    }  # fmt: skip


def test_the_approval_boolean_starts_ticked_so_approve_sends_true() -> None:
    """Approve on an untouched form means yes: an approval boolean (`approved`, `ok`...)
    without a default starts ticked; an explicit default, and other booleans, decide
    their own start; un-ticking it still sends false on purpose."""
    schema = {
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "ok": {"type": "boolean", "default": False},
            "urgent": {"type": "boolean"},
            "notify": {"type": "boolean", "default": True},
            "who": {"type": "object", "properties": {"approved": {"type": "boolean"}}},
        },
    }
    by_name = {f.name: f for f in form_for(schema).fields}
    assert by_name["approved"].default == "on"
    assert by_name["ok"].default == ""  # the schema's default wins
    assert by_name["urgent"].default == ""
    assert by_name["notify"].default == "on"
    assert by_name["who.approved"].default == "", "only the decision's own boolean"
    untouched = {f.name: "on" for f in by_name.values() if f.default == "on"}
    assert value_from(form_for(schema), untouched)["approved"] is True
    assert value_from(form_for(schema), {})["approved"] is False


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"level": ""}, "level"),
        ({"level": '"medium"'}, "level"),
        ({"level": '"low"', "count": "x"}, "count"),
        ({"level": '"low"', "ratio": "nan"}, "ratio"),
        ({"level": '"low"', "who.name": ""}, "name"),
    ],
)
def test_a_bad_field_is_named(data: dict[str, str], field: str) -> None:
    with pytest.raises(FormError) as caught:
        value_from(form_for(DECISION), {"who.name": "ada", **data})
    assert caught.value.field == field


@pytest.mark.parametrize(
    "schema",
    [
        None,
        {},
        {"type": "array", "items": {"type": "string"}},
        {"type": "object", "properties": {"tags": {"type": "array"}}},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "properties": {"x": {"$ref": "#/defs/x"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"a.b": {"type": "string"}}},
    ],
)
def test_what_fields_cannot_express_falls_back_to_raw_json(schema: Any) -> None:
    form = form_for(schema)
    assert form.raw and not form.fields
    assert value_from(form, {RAW_FIELD: '{"any": [1, 2]}'}) == {"any": [1, 2]}
    with pytest.raises(FormError):
        value_from(form, {RAW_FIELD: "{not json"})


_scalars = st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=20)


@given(st.lists(_scalars, min_size=1, max_size=5, unique_by=lambda v: (type(v), v)))
def test_every_enum_choice_posts_back_as_itself(choices: list[Any]) -> None:
    form = form_for({"type": "object", "properties": {"c": {"enum": choices}}})
    (field,) = form.fields
    for value, text in zip(choices, field.choices, strict=True):
        assert value_from(form, {"c": text}) == {"c": value}


def test_the_console_reads_the_tags_the_sdk_writes() -> None:
    assert (_views.TAG_KIND, _views.TAG_FUNC, _views.TAG_GROUP, _views.TAG_INVOKE) == (
        TAG_KIND, TAG_FUNC, TAG_GROUP, TAG_INVOKE,
    )  # fmt: skip


NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _promise(id: str, state: PromiseState, created: timedelta, **extra: Any) -> Promise:
    return Promise(id=id, state=state, param=Payload(), value=extra.pop("value", Payload()),
                   tags=extra.pop("tags", {}), create_time=NOW - created, **extra)  # fmt: skip


def test_inbox_rows_say_age_and_deadline_in_words() -> None:
    pending = _promise("a", PromiseState.PENDING, timedelta(hours=3, minutes=5),
                       expire_time=NOW + timedelta(days=2, hours=4), title="Publish?",
                       tags={TAG_GROUP: "editors"}, root_id="wf", requested_by="ann")  # fmt: skip
    settled = _promise("b", PromiseState.RESOLVED, timedelta(seconds=1))
    (row,) = _views.inbox_rows([pending, settled], NOW)
    assert (row.title, row.age, row.deadline, row.group, row.root_id) == (
        "Publish?", "3h5m", "in 2d4h", "editors", "wf",
    )  # fmt: skip


def test_a_timeline_orders_steps_and_marks_where_it_waits() -> None:
    codec = JsonCodec()
    root = _promise("wf", PromiseState.PENDING, timedelta(minutes=9), tags={TAG_FUNC: "publish"})
    ran = _promise("wf.0", PromiseState.RESOLVED, timedelta(minutes=8), value=codec.encode(7),
                   tags={TAG_KIND: "run", TAG_FUNC: "draft"})  # fmt: skip
    wait = _promise("wf.1", PromiseState.PENDING, timedelta(minutes=1), tags={TAG_KIND: "promise"})
    lines = _views.timeline(root, [wait, ran], codec.decode)
    assert [(s.id, s.kind, s.waiting, s.value) for s in lines] == [
        ("wf", "workflow", "", ""), ("wf.0", "run", "", "7"), ("wf.1", "promise", "a decision", ""),
    ]  # fmt: skip


def test_a_refusal_is_said_in_words() -> None:
    error = PermissionDeniedError(grpc.StatusCode.PERMISSION_DENIED, Reason.NOT_AN_APPROVER,
                                  "only principals ann may settle it")  # fmt: skip
    words = _views.error_words(error)
    assert words.startswith("You are not one of the approvers")
    assert "only principals ann" in words and "NOT_AN_APPROVER" in words


def test_an_unreachable_server_is_said_so() -> None:
    error = UnavailableError(grpc.StatusCode.UNAVAILABLE, "", "connection refused")
    assert _views.error_words(error).startswith("The troth server cannot be reached now")


def test_a_refusal_without_a_reason_is_said_by_its_code() -> None:
    """A refusal that reached the console without its ErrorInfo (a proxy dropped it)
    is still said in words for what its code means."""
    error = UnauthenticatedError(grpc.StatusCode.UNAUTHENTICATED, "", "token refused")
    assert _views.error_words(error).startswith("The server did not accept your token")
    denied = PermissionDeniedError(grpc.StatusCode.PERMISSION_DENIED, "", "no")
    assert _views.error_words(denied).startswith("You may not do this")
