"""The API layer's table of client mistakes (`troth_server.api._inputs.ANSWERS`), walked
against a live server on SQLite and on PostgreSQL.

For every RPC and every class of bad input the table lists, the bad requests are
built from the request's descriptor (every text field, every list field, every
Timestamp and Duration, nested ones included), sent, and answered as the table
says, with an ErrorInfo naming the field. Undecodable ones go out as raw bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from _support import ServerProcess, error_info, wait_serving
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor

from troth.v1 import promises_pb2, tasks_pb2
from troth.v1 import types_pb2 as types
from troth_server import paging
from troth_server.api._inputs import ANSWERS, LIST_LIMITS, Answer, BadInput
from troth_server.config import Limits

LIMITS = Limits()
SERVICES = [
    promises_pb2.DESCRIPTOR.services_by_name["PromiseService"],
    tasks_pb2.DESCRIPTOR.services_by_name["TaskService"],
]
METHODS: dict[str, MethodDescriptor] = {
    f"{s.full_name}/{m.name}": m for s in SERVICES for m in s.methods
}
SNOWMAN = "\u2603"  # 3 bytes of UTF-8, swapped for an encoded lone surrogate (also 3)
LONE_SURROGATE = b"\xed\xa0\x80"
STRING = FieldDescriptor.TYPE_STRING

# A bad request: a message's constructor arguments or raw bytes, and the field it names.
Case = tuple[dict[str, Any] | bytes, str]


# --- bad requests, from the descriptors ---------------------------------------------------


def text_cases(message: Descriptor, text: str, within: tuple[str, ...] = ()) -> list[Case]:
    """`text` in each text field of `message` (map keys and values, list entries...);
    a message type that holds itself (`CallsRequest.more`) is walked once."""
    cases: list[Case] = []
    within = (*within, message.full_name)
    for field in message.fields:
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            key, value = sub.fields_by_name["key"], sub.fields_by_name["value"]
            if key.type == STRING:
                cases.append(({field.name: {text: _scalar(value)}}, field.name))
            if value.type == STRING:
                cases.append(({field.name: {"k": text}}, f"{field.name}[k]"))
        elif field.is_repeated and field.type == STRING:
            cases.append(({field.name: ["a", text]}, f"{field.name}[1]"))
        elif sub is not None and (
            sub.full_name.startswith("google.protobuf.") or sub.full_name in within
        ):
            continue
        elif sub is not None:
            for kwargs, path in text_cases(sub, text, within):
                wrapped = [kwargs] if field.is_repeated else kwargs
                index = "[0]" if field.is_repeated else ""
                cases.append(({field.name: wrapped}, f"{field.name}{index}.{path}"))
        elif field.type == STRING:
            cases.append(({field.name: text}, field.name))
    return cases


def list_cases(message: Descriptor) -> list[Case]:
    """Each list field of `message` one entry above its maximum."""
    cases: list[Case] = []
    for field in message.fields:
        sub = field.message_type
        if field.is_repeated:
            n = LIST_LIMITS[(message.full_name, field.name)].of(LIMITS) + 1
            if sub is not None and sub.GetOptions().map_entry:
                entries: Any = {f"k{i}": _scalar(sub.fields_by_name["value"]) for i in range(n)}
            elif sub is not None and sub.full_name == "troth.v1.WorkflowVersion":
                entries = [{"name": "w", "version": "1"}] * n
            elif sub is not None:
                entries = [{}] * n
            elif field.type == FieldDescriptor.TYPE_ENUM:
                entries = [1] * n
            else:
                entries = [f"p{i}" for i in range(n)]
            cases.append(({field.name: entries}, field.name))
        elif sub is not None and not sub.full_name.startswith("google.protobuf."):
            cases += [({field.name: kw}, f"{field.name}.{p}") for kw, p in list_cases(sub)]
    return cases


def well_known_cases(message: Descriptor, type_name: str, bad: list[dict[str, int]]) -> list[Case]:
    """Each field of type `type_name` (Timestamp, Duration) set to each of `bad`."""
    cases: list[Case] = []
    for field in message.fields:
        sub = field.message_type
        if sub is None or sub.GetOptions().map_entry:
            continue
        if sub.full_name == type_name:
            cases += [({field.name: value}, field.name) for value in bad]
        elif not sub.full_name.startswith("google.protobuf.") and not field.is_repeated:
            nested = well_known_cases(sub, type_name, bad)
            cases += [({field.name: kw}, f"{field.name}.{p}") for kw, p in nested]
    return cases


BAD_TIMESTAMPS = [
    {"seconds": 10**17},
    {"seconds": -62_135_596_801},
    {"seconds": 253_402_300_800},
    {"seconds": 1, "nanos": -1},
    {"seconds": 1, "nanos": 1_000_000_000},
]
BAD_DURATIONS = [
    {"seconds": 10, "nanos": -500_000_000},
    {"seconds": -10, "nanos": 500_000_000},
    {"nanos": 1_000_000_000},
    {"nanos": -1_000_000_000},
    {"seconds": 10**12},
]


def token(fields: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


def forged_tokens() -> list[str]:
    query = paging.fingerprint("*", frozenset(), {})
    issued = json.loads(
        base64.urlsafe_b64decode(paging.encode(paging.Cursor(3), _ASC, query) + "==")
    )
    return [
        token({**issued, "after": 10**30}),  # was INTERNAL (SQLite) / UNAVAILABLE (PostgreSQL)
        token({**issued, "after": 2**63}),
        token({**issued, "after": -1}),
        token({**issued, "after": "3"}),
        token({**issued, "query": "0123456789abcdef"}),
        token({**issued, "order": "SIDEWAYS"}),
        token({**issued, "expire": 5}),
        token([issued]),
        "not a token!",
        "A" * 513,
    ]


def deep_tokens() -> list[str]:
    return [
        base64.urlsafe_b64encode(b"[" * 3000).decode(),  # was RecursionError: INTERNAL
        base64.urlsafe_b64encode(b"[" * 380).decode().rstrip("="),
        base64.urlsafe_b64encode(b'{"after":' + b"{" * 370).decode().rstrip("="),
    ]


def cases_for(rpc: str, bad: BadInput) -> list[Case]:
    message = METHODS[rpc].input_type
    match bad:
        case BadInput.NUL:
            return text_cases(message, "a\x00b")
        case BadInput.NOT_UTF8:
            return [(_not_utf8(message, kw), path) for kw, path in text_cases(message, SNOWMAN)]
        case BadInput.TRUNCATED:
            texts = [f.name for f in message.fields if f.type == STRING and not f.is_repeated]
            if not message.fields:  # an empty message (WhoAmI): garbage bytes only
                return [(b"\xff", "request")]
            if not texts:  # no text field (PrunePromises): garbage bytes, cut messages
                first = message.fields[0].name
                whole = _request(message, {first: {"seconds": 5}}).SerializeToString()
                return [(whole[:-1], first), (b"\xff", "request")]
            first = texts[0]
            whole = _request(message, {first: "hello"}).SerializeToString()
            # 0x0a opens field 1 (length-delimited), and the message ends there.
            opened = message.fields_by_number[1].name
            return [(whole[:-1], first), (b"\xff", "request"), (whole + b"\x0a", opened)]
        case BadInput.LIST_TOO_LONG:
            return list_cases(message)
        case BadInput.BAD_TIMESTAMP:
            return well_known_cases(message, "google.protobuf.Timestamp", BAD_TIMESTAMPS)
        case BadInput.BAD_DURATION:
            return well_known_cases(message, "google.protobuf.Duration", BAD_DURATIONS)
        case BadInput.FORGED_PAGE_TOKEN:
            return [({"page_token": t}, "page_token") for t in forged_tokens()]
        case BadInput.DEEP_PAGE_TOKEN:
            return [({"page_token": t}, "page_token") for t in deep_tokens()]


_ASC = paging.PromiseOrder.CREATED_ASC
ROWS = [(rpc, bad, answer) for rpc, answers in ANSWERS.items() for bad, answer in answers.items()]


def _request(message: Descriptor, kwargs: dict[str, Any]) -> Any:
    return message_factory.GetMessageClass(message)(**kwargs)


def _not_utf8(message: Descriptor, kwargs: dict[str, Any]) -> bytes:
    data = _request(message, kwargs).SerializeToString()
    assert data.count(SNOWMAN.encode()) == 1
    return data.replace(SNOWMAN.encode(), LONE_SURROGATE)


def _scalar(field: FieldDescriptor) -> Any:
    return "v" if field.type == STRING else 1


# --- the walk ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def raw_channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with server.channel() as channel:
        yield channel


def call(channel: grpc.Channel, rpc: str, request: dict[str, Any] | bytes) -> grpc.RpcError:
    """Send `request` (raw bytes as they are) and return the error it was answered with."""
    method = METHODS[rpc]
    data = (
        request
        if isinstance(request, bytes)
        else _request(method.input_type, request).SerializeToString()
    )
    path = f"/{rpc}"
    try:
        if method.server_streaming:
            stream = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
            for _ in stream(data, timeout=10):
                pass
        else:
            channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
                data, timeout=10
            )
    except grpc.RpcError as error:
        return error
    raise AssertionError(f"{rpc} accepted a bad request: {request!r:.300}")


@pytest.mark.parametrize(
    ("rpc", "bad", "answer"), ROWS, ids=[f"{r.split('/')[1]}-{b.name}" for r, b, _ in ROWS]
)
def test_each_bad_input_gets_the_answer_of_the_table(
    raw_channel: grpc.Channel, rpc: str, bad: BadInput, answer: Answer
) -> None:
    cases = cases_for(rpc, bad)
    assert cases, f"no {bad.name} case built for {rpc}: the table lists one"
    for request, field in cases:
        error = call(raw_channel, rpc, request)
        info = error_info(error)
        details = error.details() or ""
        where = f"{rpc} {bad.name} {field}: {details}"
        assert (error.code().name, info.reason) == (answer.code, answer.reason.value), where
        assert info.domain == "troth.dev"
        assert info.metadata["field"] == field, where
        assert "Traceback" not in details and details.startswith(field.split("[")[0]), where


def test_the_server_is_healthy_and_logged_no_crash_after_the_walk(server: ServerProcess) -> None:
    wait_serving(server.address, 10)
    log = server.log().replace(" ", "")
    assert "rpc.crashed" not in log
    assert '"code":"UNKNOWN"' not in log and '"code":"INTERNAL"' not in log
    assert '"code":"UNAVAILABLE"' not in log


def test_a_good_request_still_works(raw_channel: grpc.Channel) -> None:
    # The same raw path, with valid bytes: what the walk sends is only the bad part.
    ok = promises_pb2.CreatePromiseRequest(id="input-table-ok", title=SNOWMAN, tags={"k": "v"})
    raw = raw_channel.unary_unary(
        "/troth.v1.PromiseService/CreatePromise",
        request_serializer=None,
        response_deserializer=None,
    )
    reply = promises_pb2.CreatePromiseResponse.FromString(raw(ok.SerializeToString(), timeout=10))
    assert reply.promise.title == SNOWMAN
    assert reply.promise.param == types.Payload()
