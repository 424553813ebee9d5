"""Request strategies built from the protobuf descriptors, and raw request bytes.

Pure: strategies and byte builders, no I/O. `methods()` lists every RPC of
every service in `troth.v1`; `requests(descriptor, pools)` walks a request
message's fields (strings, bytes, integers, enums, repeated, maps, nested
messages, oneofs, Timestamps, Durations) and draws a value for each, so a field
added to a .proto is fuzzed without anyone writing a strategy. Field names
that call for hostile values (ids, globs, page tokens, schemas, payload data)
get theirs from `_fuzz_edges.field_hint`.

`raw_requests(descriptor, pools)` draws bytes that protobuf Python will not
produce: invalid UTF-8 (lone surrogates among it) in each string field at any
depth, truncated messages, wrong wire types, overlong varints, deep groups,
and plain noise; they are sent with `request_serializer=None`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import _fuzz_edges as edges
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import strategies as st

from troth.v1 import promises_pb2, tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from google.protobuf.descriptor import Descriptor, MethodDescriptor
    from google.protobuf.message import Message

MAX_DEPTH = 3
"""Nested messages deeper than this are left unset (troth's requests nest at most 3)."""


@dataclass(frozen=True)
class Method:
    """One RPC: its path (`/troth.v1.PromiseService/GetPromise`) and message types."""

    path: str
    request: Descriptor
    response: type[Message]
    server_streaming: bool

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]


def methods() -> list[Method]:
    """Every RPC of every service the troth.v1 files declare, from their descriptors."""
    found: list[Method] = []
    for file in (promises_pb2.DESCRIPTOR, tasks_pb2.DESCRIPTOR):
        for service in file.services_by_name.values():
            for method in service.methods:
                found.append(_method(service.full_name, method))
    return found


def _method(service: str, method: MethodDescriptor) -> Method:
    # One request per call: a bidirectional stream (`Calls`) gets one message and the
    # end of its requests, as a server stream's single request goes out.
    assert method.server_streaming or not method.client_streaming, "no client-only streams"
    return Method(
        path=f"/{service}/{method.name}",
        request=method.input_type,
        response=message_factory.GetMessageClass(method.output_type),
        server_streaming=method.server_streaming,
    )


def message_type(field: FieldDescriptor) -> Descriptor:
    """The message type of a message (or map) field."""
    assert field.message_type is not None, field.full_name
    return field.message_type


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(
        message_type(field).GetOptions().map_entry
    )


# --- typed requests ------------------------------------------------------------------


def _scalar(field: FieldDescriptor, hostile: bool) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return edges.texts() if hostile else edges.plain_texts()
    if t == FieldDescriptor.TYPE_BYTES:
        return edges.payload_data() if hostile else st.binary(max_size=16)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        numbers = [v.number for v in field.enum_type.values]
        valid = st.sampled_from(numbers)
        return st.one_of(valid, edges.ints(32, signed=True)) if hostile else valid
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=hostile, allow_infinity=hostile, width=32)
    bits, signed = _INT_TYPES[t]
    return edges.ints(bits, signed) if hostile else st.integers(0, 10)


_INT_TYPES = {
    FieldDescriptor.TYPE_INT32: (32, True),
    FieldDescriptor.TYPE_SINT32: (32, True),
    FieldDescriptor.TYPE_SFIXED32: (32, True),
    FieldDescriptor.TYPE_INT64: (64, True),
    FieldDescriptor.TYPE_SINT64: (64, True),
    FieldDescriptor.TYPE_SFIXED64: (64, True),
    FieldDescriptor.TYPE_UINT32: (32, False),
    FieldDescriptor.TYPE_FIXED32: (32, False),
    FieldDescriptor.TYPE_UINT64: (64, False),
    FieldDescriptor.TYPE_FIXED64: (64, False),
}

# Well-known types: (hostile, benign) strategies of (seconds, nanos).
_WELL_KNOWN: dict[str, tuple[Callable[[], st.SearchStrategy[tuple[int, int]]], ...]] = {
    "google.protobuf.Timestamp": (edges.timestamps, edges.near_timestamps),
    "google.protobuf.Duration": (edges.durations, edges.short_durations),
}


def _element(
    field: FieldDescriptor, pools: edges.Pools, depth: int, hostile: bool
) -> st.SearchStrategy[Any]:
    """A strategy for one value of `field` (one element, if it is repeated)."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        kind = message_type(field)
        if kind.full_name in _WELL_KNOWN:
            cls = message_factory.GetMessageClass(kind)
            seconds_nanos = _WELL_KNOWN[kind.full_name][0 if hostile else 1]()
            return seconds_nanos.map(lambda sn: cls(seconds=sn[0], nanos=sn[1]))
        return requests(kind, pools, depth + 1, hostile=hostile)
    hinted = edges.field_hint(field, pools, hostile)
    return _scalar(field, hostile) if hinted is None else hinted


def _map(
    field: FieldDescriptor, pools: edges.Pools, depth: int, hostile: bool
) -> st.SearchStrategy[Any]:
    entry = message_type(field)
    key = _element(entry.fields_by_name["key"], pools, depth, hostile)
    value = _element(entry.fields_by_name["value"], pools, depth, hostile)
    few = st.dictionaries(key, value, max_size=4 if hostile else 2)
    if not hostile:
        return few
    small = _element(entry.fields_by_name["value"], pools, depth, hostile=False)
    many = st.builds(
        lambda n, v: {f"k{i}": v for i in range(n)}, st.sampled_from((32, 33, 1000)), small
    )
    return edges.rarely(few, many)


def _field(
    field: FieldDescriptor, pools: edges.Pools, depth: int, hostile: bool
) -> st.SearchStrategy[Any]:
    if _is_map(field):
        return _map(field, pools, depth, hostile)
    element = _element(field, pools, depth, hostile)
    if not field.is_repeated:
        return element
    if not hostile:
        return st.lists(element, max_size=2)
    return edges.rarely(st.lists(element, max_size=4), edges.long_lists(element))


def _assign(message: Message, field: FieldDescriptor, value: Any) -> None:
    target = getattr(message, field.name) if field.is_repeated else None
    if _is_map(field):
        assert target is not None
        if message_type(field).fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
            for key, item in value.items():
                target[key].CopyFrom(item)
        else:
            target.update(value)
    elif target is not None:
        target.extend(value)
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(message, field.name).CopyFrom(value)
    else:
        setattr(message, field.name, value)


def requests(
    descriptor: Descriptor, pools: edges.Pools, depth: int = 0, *, hostile: bool = True
) -> st.SearchStrategy[Message]:
    """Messages of this type: every field drawn or left unset, one member per oneof.

    With `hostile`, a request that is mostly plausible (pool ids, valid times)
    with one field hostile (8 in 10), none or two (1), or every field (1), so
    that each hostile value gets past the validation of the others. A hostile
    nested message is itself such a mix. Without it, only plausible values.
    """
    cls = message_factory.GetMessageClass(descriptor)
    if depth > MAX_DEPTH:
        return st.builds(cls)
    fields = list(descriptor.fields)
    plausible = {f: _field(f, pools, depth, hostile=False) for f in fields}
    bad = {f: _field(f, pools, depth, hostile=True) for f in fields} if hostile else plausible
    oneofs = [list(o.fields) for o in descriptor.oneofs]
    in_oneof = {f for members in oneofs for f in members}

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        chosen: set[FieldDescriptor] = set()
        if hostile and fields:
            mode = draw(st.integers(0, 9))
            if mode == 0:
                chosen = set(fields)
            elif mode == 1:
                chosen = draw(st.sets(st.sampled_from(fields), max_size=2))
            else:
                chosen = {draw(st.sampled_from(fields))}
        message = cls()
        for field in fields:
            if field in in_oneof:
                continue
            if field in chosen:
                _assign(message, field, draw(bad[field]))
            elif draw(st.booleans()):
                _assign(message, field, draw(plausible[field]))
        for members in oneofs:
            marked = [f for f in members if f in chosen]
            pick = marked[0] if marked else draw(st.sampled_from([None, *members]))
            if pick is not None:
                _assign(message, pick, draw((bad if pick in chosen else plausible)[pick]))
        return message

    return build()


# --- raw bytes -----------------------------------------------------------------------

BAD_UTF8 = (
    b"\xed\xa0\x80",  # a lone high surrogate (U+D800), as CESU-8 writes it
    b"\xed\xbf\xbf",  # a lone low surrogate (U+DFFF)
    b"\xed\xa0\xbd\xed\xb8\x80",  # a surrogate pair spelled out (CESU-8 of U+1F600)
    b"\xc0\x80",  # an overlong NUL (modified UTF-8)
    b"\xff",
    b"\x80",
    b"a\xe2\x82",  # truncated 3-byte sequence
    b"\xf4\x90\x80\x80",  # above U+10FFFF
    b"\xfe\xff",
)


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def delimited(number: int, payload: bytes) -> bytes:
    return key(number, 2) + varint(len(payload)) + payload


@dataclass(frozen=True)
class StringPath:
    """Where a string lives in a request (`tags.key`, `param.headers.value`), and how to
    wrap bytes so that they land there on the wire."""

    name: str
    wrap: Callable[[bytes], bytes]


def string_paths(descriptor: Descriptor, depth: int = 0) -> Iterator[StringPath]:
    """Every string field reachable in `descriptor` (map keys and values included)."""
    for field in descriptor.fields:
        number = field.number
        if field.type == FieldDescriptor.TYPE_STRING:
            yield StringPath(field.name, functools.partial(delimited, number))
        elif field.type == FieldDescriptor.TYPE_MESSAGE and depth < MAX_DEPTH:
            for inner in string_paths(message_type(field), depth + 1):
                yield StringPath(f"{field.name}.{inner.name}", _nested(number, inner.wrap))


def _nested(number: int, wrap: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
    return lambda raw: delimited(number, wrap(raw))


def _bad_utf8(descriptor: Descriptor, pools: edges.Pools) -> st.SearchStrategy[tuple[str, bytes]]:
    paths = list(string_paths(descriptor))
    if not paths:
        return st.nothing()
    valid = requests(descriptor, pools, hostile=False).map(lambda m: m.SerializeToString())
    return st.builds(
        lambda path, bad, before, after, base: (
            f"invalid UTF-8 in {path.name}",
            base + path.wrap(before.encode() + bad + after.encode()),
        ),
        st.sampled_from(paths),
        st.sampled_from(BAD_UTF8),
        st.sampled_from(("", "fz-", "a")),
        st.sampled_from(("", "x")),
        st.one_of(st.just(b""), valid),
    )


def _truncated(descriptor: Descriptor, pools: edges.Pools) -> st.SearchStrategy[tuple[str, bytes]]:
    serialized = requests(descriptor, pools).map(lambda m: m.SerializeToString())
    return st.builds(
        lambda data, cut: ("truncated message", data[: max(1, len(data) - 1 - cut % len(data))]),
        serialized.filter(lambda data: len(data) >= 2),
        st.integers(0, 2**16),
    )


def _wrong_wire_type(descriptor: Descriptor) -> st.SearchStrategy[tuple[str, bytes]]:
    numbers = [f.number for f in descriptor.fields] or [1]
    return st.builds(
        lambda n, wire_type, body: (
            f"field {n} with wire type {wire_type}",
            key(n, wire_type) + body,
        ),
        st.sampled_from(numbers),
        st.sampled_from((0, 1, 2, 3, 4, 5, 6, 7)),
        st.binary(max_size=12),
    )


_NOISE: tuple[tuple[str, bytes], ...] = (
    ("overlong varint", key(1, 0) + b"\xff" * 11 + b"\x01"),
    ("length past the end", key(1, 2) + varint(1000) + b"abc"),
    ("negative length", key(1, 2) + varint(-1)),
    ("field number 0", key(0, 0) + b"\x01"),
    ("field number above the maximum", varint((2**29) << 3) + b"\x01"),
    ("200 nested groups", key(99, 3) * 200 + key(99, 4) * 200),
    ("unmatched end group", key(99, 4)),
    ("empty", b""),
)


def raw_requests(
    descriptor: Descriptor, pools: edges.Pools
) -> st.SearchStrategy[tuple[str, bytes]]:
    """(what it is, bytes) for a request of this type that no well-behaved client sends."""
    return st.one_of(
        _bad_utf8(descriptor, pools),
        _truncated(descriptor, pools),
        _wrong_wire_type(descriptor),
        st.sampled_from(_NOISE),
        st.binary(min_size=1, max_size=64).map(lambda b: ("random bytes", b)),
    )


TRANSPORT_LIMIT = 3 * 1_048_576
"""The server's gRPC receive limit (2 x max payload + 1 MiB): above it, gRPC answers."""
OVERSIZED = TRANSPORT_LIMIT + 4096


def oversized_request() -> tuple[str, bytes]:
    return ("an unknown field of 3 MiB", delimited(99, b"x" * OVERSIZED))
