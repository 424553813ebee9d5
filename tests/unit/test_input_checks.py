"""The API layer's input checks, pure: the descriptor walk, the wire-format reader that
names the field of undecodable bytes, strict page tokens, and the tables (every RPC,
every list field, the README's copy) kept complete and in step."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from troth.v1 import promises_pb2 as pb
from troth.v1 import tasks_pb2
from troth.v1 import types_pb2 as types
from troth_server import paging
from troth_server.api import _convert as convert
from troth_server.api._checks import check_request
from troth_server.api._decode import Refused, deserializer, locate
from troth_server.api._inputs import ANSWERS, LIST_LIMITS, BadInput, markdown
from troth_server.config import Limits
from troth_server.domain.errors import InvalidArgument, InvalidPageToken
from troth_server.store import PromiseOrder

LIMITS = Limits()
INPUT_TABLE_PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SERVICES = [
    pb.DESCRIPTOR.services_by_name["PromiseService"],
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"],
]
SNOWMAN = "\u2603"  # 3 bytes of UTF-8, swapped for an encoded lone surrogate (also 3)


def refused(message: object) -> InvalidArgument:
    """The error `check_request` raises, checked against what the deserializer answers."""
    with pytest.raises(InvalidArgument) as caught:
        check_request(message, LIMITS)  # type: ignore[arg-type]
    got = deserializer(type(message), LIMITS)(message.SerializeToString())  # type: ignore[arg-type, attr-defined]
    assert isinstance(got, Refused), got
    assert (got.error.field, got.error.message) == (caught.value.field, caught.value.message)
    return caught.value


# --- text -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.CreatePromiseRequest(id="a", title="x\x00"), "title"),
        (pb.CreatePromiseRequest(id="a", message="\x00"), "message"),
        (pb.CreatePromiseRequest(id="a", idempotency_key="k\x00"), "idempotency_key"),
        (pb.CreatePromiseRequest(id="a", tags={"team": "a\x00"}), "tags[team]"),
        (pb.CreatePromiseRequest(id="a", tags={"te\x00am": "a"}), "tags"),
        (
            pb.CreatePromiseRequest(id="a", param=types.Payload(headers={"ct": "\x00"})),
            "param.headers[ct]",
        ),
        (
            pb.CreatePromiseRequest(id="a", fence=types.TaskFence(worker_id="w\x00")),
            "fence.worker_id",
        ),
        (pb.ResolvePromiseRequest(id="a\x00"), "id"),
        (pb.SearchPromisesRequest(id="a*\x00"), "id"),
        (pb.SearchPromisesRequest(page_token="\x00"), "page_token"),
        (tasks_pb2.CompleteTaskRequest(suspend_on=["a", "b\x00"]), "suspend_on[1]"),
        (
            tasks_pb2.PollRequest(workflows=[tasks_pb2.WorkflowVersion(name="w", version="\x00")]),
            "workflows[0].version",
        ),
    ],
)
def test_nul_and_lone_surrogates_are_refused_in_any_text_field(message: object, field: str) -> None:
    error = refused(message)
    assert error.field == field
    assert "NUL" in error.message or "surrogate" in error.message


def test_a_principal_with_them_is_refused() -> None:
    # Protobuf strings cannot hold a lone surrogate (such bytes do not decode:
    # below); gRPC metadata arrives as str, so the principal is checked too.
    for bad in ("ops\x00", "ops\ud800"):
        with pytest.raises(InvalidArgument) as caught:
            convert.principal({"troth-principal": bad}, LIMITS)
        assert caught.value.field == "troth-principal"


def test_the_text_checks_run_whenever_the_bytes_hold_a_nul() -> None:
    # The deserializer skips the text walk for bytes without a 0 byte: a NUL
    # anywhere in any string is one, however deep (a map value in a payload).
    for message in (
        pb.CreatePromiseRequest(id="a", resolved_with=types.Payload(headers={"h": "\x00"})),
        tasks_pb2.PollRequest(workflows=[tasks_pb2.WorkflowVersion(name="\x00")]),
    ):
        data = message.SerializeToString()
        assert b"\x00" in data
        assert isinstance(deserializer(type(message), LIMITS)(data), Refused)


def test_text_without_them_passes() -> None:
    check_request(
        pb.CreatePromiseRequest(id="a", title="Zoë ✓ 🎉", tags={"k": "v"}, message="x\ty"), LIMITS
    )


# --- lists ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "field", "limit"),
    [
        (pb.CreatePromiseRequest(tags={f"k{i}": "" for i in range(33)}), "tags", 32),
        (
            pb.ResolvePromiseRequest(value=types.Payload(headers={f"h{i}": "" for i in range(65)})),
            "value.headers",
            64,
        ),
        (pb.SearchPromisesRequest(states=[types.PROMISE_STATE_PENDING] * 6), "states", 5),
        (tasks_pb2.CompleteTaskRequest(suspend_on=["p"] * 10_001), "suspend_on", 10_000),
        (tasks_pb2.RegisterCallbacksRequest(promise_ids=["p"] * 10_001), "promise_ids", 10_000),
        (
            tasks_pb2.PollRequest(workflows=[tasks_pb2.WorkflowVersion()] * 1001),
            "workflows",
            1000,
        ),
    ],
)
def test_lists_above_their_maximum_are_refused_naming_the_limit(
    message: object, field: str, limit: int
) -> None:
    error = refused(message)
    assert error.field == field
    assert f"the limit is {limit}" in error.message


def test_every_list_field_of_every_request_has_a_maximum() -> None:
    found = set()
    for message in _request_types():
        for field in message.fields:
            if field.is_repeated:
                found.add((message.full_name, field.name))
    assert found == set(LIST_LIMITS), "LIST_LIMITS must name exactly the request list fields"


# --- times ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ts",
    [
        Timestamp(seconds=10**17),
        Timestamp(seconds=253_402_300_800),
        Timestamp(seconds=-62_135_596_801),
        Timestamp(seconds=1, nanos=-1),
        Timestamp(seconds=1, nanos=1_000_000_000),
    ],
)
def test_timestamps_outside_their_range_are_refused(ts: Timestamp) -> None:
    assert refused(pb.SearchPromisesRequest(created_before=ts)).field == "created_before"
    assert refused(pb.CreatePromiseRequest(expire_time=ts)).field == "expire_time"


@pytest.mark.parametrize(
    "duration",
    [
        Duration(seconds=10, nanos=-500_000_000),
        Duration(seconds=-10, nanos=500_000_000),
        Duration(nanos=1_000_000_000),
        Duration(nanos=-1_000_000_000),
        Duration(seconds=315_576_000_001),
        Duration(seconds=-315_576_000_001),
    ],
)
def test_durations_breaking_the_proto_rules_are_refused(duration: Duration) -> None:
    assert refused(pb.CreatePromiseRequest(ttl=duration)).field == "ttl"
    assert refused(tasks_pb2.PollRequest(lease=duration)).field == "lease"
    assert refused(tasks_pb2.HeartbeatRequest(lease=duration)).field == "lease"


def test_times_within_range_pass() -> None:
    check_request(pb.CreatePromiseRequest(ttl=Duration(seconds=-1, nanos=-5)), LIMITS)
    check_request(pb.CreatePromiseRequest(ttl=Duration(nanos=999_999_999)), LIMITS)
    check_request(
        pb.SearchPromisesRequest(created_before=Timestamp(seconds=253_402_300_799)), LIMITS
    )


# --- undecodable bytes ------------------------------------------------------------------


def not_utf8(message: object) -> bytes:
    data = message.SerializeToString()  # type: ignore[attr-defined]
    assert data.count(SNOWMAN.encode()) == 1
    return data.replace(SNOWMAN.encode(), b"\xed\xa0\x80")  # U+D800, CESU-style


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (pb.GetPromiseRequest(id=SNOWMAN), "id"),
        (pb.CreatePromiseRequest(id="a", title=SNOWMAN), "title"),
        (pb.CreatePromiseRequest(id="a", tags={"team": SNOWMAN}), "tags[team]"),
        (pb.CreatePromiseRequest(id="a", tags={SNOWMAN: "v"}), "tags"),
        (
            pb.CreatePromiseRequest(id="a", resolved_with=types.Payload(headers={"h": SNOWMAN})),
            "resolved_with.headers[h]",
        ),
        (pb.ResolvePromiseRequest(id="a", fence=types.TaskFence(task_id=SNOWMAN)), "fence.task_id"),
        (tasks_pb2.CompleteTaskRequest(suspend_on=["a", "b", SNOWMAN]), "suspend_on[2]"),
        (
            tasks_pb2.PollRequest(
                workflows=[
                    tasks_pb2.WorkflowVersion(name="a"),
                    tasks_pb2.WorkflowVersion(name=SNOWMAN),
                ]
            ),
            "workflows[1].name",
        ),
    ],
)
def test_invalid_utf8_is_located(message: object, field: str) -> None:
    parse = deserializer(type(message), LIMITS)  # type: ignore[arg-type]
    got = parse(not_utf8(message))
    assert isinstance(got, Refused), got
    error = got.error
    assert error.field == field and "UTF-8" in error.message
    assert type(message).DESCRIPTOR.full_name in error.message  # type: ignore[attr-defined]


def test_truncated_and_garbage_bytes_are_located() -> None:
    full = pb.CreatePromiseRequest(id="abc", title="hello").SerializeToString()
    descriptor = pb.CreatePromiseRequest.DESCRIPTOR
    assert locate(descriptor, full[:-1])[0] == "title"
    assert "truncated" in locate(descriptor, full[:-1])[1]
    assert locate(descriptor, b"\x0a")[0] == "id"
    assert locate(descriptor, b"\xff")[0] == "request"
    assert locate(descriptor, b"\x0b")[0] == "id"  # field 1 as a group: no troth message has one
    nested = pb.CreatePromiseRequest(param=types.Payload(headers={"a": "b"})).SerializeToString()
    assert locate(descriptor, nested[:-1])[0].startswith("param")
    for data in (full[:-1], b"\xff", b"\x0a\x05ab"):
        got = deserializer(pb.CreatePromiseRequest, LIMITS)(data)
        assert isinstance(got, Refused)


def test_valid_bytes_decode_as_usual() -> None:
    message = pb.CreatePromiseRequest(id="a", title=SNOWMAN, tags={"k": "v"})
    assert deserializer(pb.CreatePromiseRequest, LIMITS)(message.SerializeToString()) == message
    assert locate(pb.CreatePromiseRequest.DESCRIPTOR, message.SerializeToString()) == (
        "request",
        "",
    )


# --- page tokens ------------------------------------------------------------------------

QUERY = paging.fingerprint("*", frozenset(), {})
DESC = PromiseOrder.CREATED_DESC
DESC_QUERY = paging.fingerprint("*", frozenset(), {}, DESC)


def token(fields: object) -> str:
    raw = json.dumps(fields, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_an_issued_token_decodes() -> None:
    for order in PromiseOrder:
        query = paging.fingerprint("*", frozenset(), {}, order)
        issued = paging.encode(paging.Cursor(12, 5), order, query)
        assert paging.decode(issued, order, query).seq == 12


@pytest.mark.parametrize(
    "bad",
    [
        token(
            {"after": 10**30, "query": QUERY}
        ),  # beyond a 64-bit seq: INTERNAL/UNAVAILABLE before
        token({"after": 2**63, "query": QUERY}),
        token({"after": -5, "query": QUERY}),
        token({"after": 1.5, "query": QUERY}),
        token({"after": [1], "query": QUERY}),
        token({"after": {"a": 1}, "query": QUERY}),
        token({"after": 3, "query": QUERY, "extra": 1}),
        token({"after": 3, "query": QUERY, "order": "CREATED_ASC"}),
        token({"after": 3}),
        token({"query": QUERY}),
        token([3, QUERY]),
        token("after"),
        base64.urlsafe_b64encode(f'{{"after":3,"after":4,"query":"{QUERY}"}}'.encode())
        .decode()
        .rstrip("="),
        base64.urlsafe_b64encode(b"[" * 3000).decode(),  # was RecursionError: INTERNAL
        base64.urlsafe_b64encode(b"[" * 300).decode().rstrip("="),  # short but deep
        base64.urlsafe_b64encode(b'{"after":' + b"[" * 300).decode().rstrip("="),
        "A" * 513,
        paging.encode(paging.Cursor(3), PromiseOrder.CREATED_ASC, QUERY) + "=",
        "abc$",
        "\x00",
        "",
    ],
)
def test_an_edited_or_forged_token_is_refused(bad: str) -> None:
    if not bad:
        return  # an empty token means "first page", not a token
    with pytest.raises(InvalidPageToken, match="not a token this server issued"):
        paging.decode(bad, PromiseOrder.CREATED_ASC, QUERY)


@pytest.mark.parametrize(
    "bad",
    [
        token({"after": 3, "query": DESC_QUERY, "order": "CREATED_DESC", "expire": None}),
        token({"after": 3, "query": DESC_QUERY, "order": 7}),
        token({"after": 3, "query": "zz", "order": "CREATED_DESC"}),
        token({"after": 3, "query": DESC_QUERY.upper(), "order": "CREATED_DESC"}),
    ],
)
def test_each_order_has_exactly_its_fields(bad: str) -> None:
    with pytest.raises(InvalidPageToken, match="not a token this server issued"):
        paging.decode(bad, DESC, DESC_QUERY)


def test_an_expire_time_token_is_range_checked() -> None:
    order = PromiseOrder.EXPIRE_TIME_ASC
    query = paging.fingerprint("*", frozenset(), {}, order)
    ok = token({"after": 3, "query": query, "order": order.value, "expire": None})
    assert paging.decode(ok, order, query) == paging.Cursor(3, None)
    for expire in (-1, 2**63, 1.0, "5", True):
        bad = token({"after": 3, "query": query, "order": order.value, "expire": expire})
        with pytest.raises(InvalidPageToken, match="not a token this server issued"):
            paging.decode(bad, order, query)


# --- the tables -------------------------------------------------------------------------


def test_the_table_names_every_rpc_of_both_services() -> None:
    rpcs = {f"{s.full_name}/{m.name}" for s in SERVICES for m in s.methods}
    assert set(ANSWERS) == rpcs


def test_the_table_lists_exactly_the_classes_each_request_can_have() -> None:
    for service in SERVICES:
        for method in service.methods:
            kinds = _kinds(method.input_type)
            expected = {BadInput.TRUNCATED}
            if "text" in kinds:
                expected |= {BadInput.NUL, BadInput.NOT_UTF8}
            if kinds & {"list"}:
                expected.add(BadInput.LIST_TOO_LONG)
            if "google.protobuf.Timestamp" in kinds:
                expected.add(BadInput.BAD_TIMESTAMP)
            if "google.protobuf.Duration" in kinds:
                expected.add(BadInput.BAD_DURATION)
            if "page_token" in kinds:
                expected |= {BadInput.FORGED_PAGE_TOKEN, BadInput.DEEP_PAGE_TOKEN}
            assert set(ANSWERS[f"{service.full_name}/{method.name}"]) == expected, method.name


def test_the_docs_show_the_table_as_the_code_has_it() -> None:
    text = INPUT_TABLE_PAGE.read_text(encoding="utf-8")
    found = re.search(
        r"<!-- input-table: start.*?-->\n(.*?)<!-- input-table: end -->", text, re.DOTALL
    )
    assert found, "docs/configuration.md lacks the input-table markers"
    assert found.group(1) == markdown(LIMITS), (
        "docs/configuration.md's input table is out of date; replace it with the output of "
        "`python -m troth_server.api._inputs`"
    )


# Well-known types with nothing to walk; google.protobuf.Value (Payload.json) is walked.
_LEAF_TYPES = {"google.protobuf.Timestamp", "google.protobuf.Duration"}


def _request_types() -> list[Descriptor]:
    seen: dict[str, Descriptor] = {}
    todo = [m.input_type for s in SERVICES for m in s.methods]
    while todo:
        message = todo.pop()
        if message.full_name in seen or message.full_name in _LEAF_TYPES:
            continue
        seen[message.full_name] = message
        todo += [f.message_type for f in message.fields if f.message_type is not None]
    return [m for m in seen.values() if not m.GetOptions().map_entry]


def _kinds(message: Descriptor, depth: int = 0) -> set[str]:
    """What a request contains: 'text', 'list', 'page_token', well-known type names."""
    kinds: set[str] = set()
    for field in message.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            kinds.add("text")
        if field.is_repeated:
            kinds.add("list")
        if field.name == "page_token":
            kinds.add("page_token")
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            kinds |= _kinds(sub, depth + 1) & {"text"}
        elif sub is not None:
            if sub.full_name.startswith("google.protobuf."):
                kinds.add(sub.full_name)
            elif depth < 5:
                kinds |= _kinds(sub, depth + 1)
        assert field.type != FieldDescriptor.TYPE_GROUP
    return kinds
