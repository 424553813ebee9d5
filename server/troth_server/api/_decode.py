"""Request bytes as they are decoded and checked, and the registration of the servicers.

grpc answers a request deserializer that raises with `UNKNOWN` and no
ErrorInfo, before any handler runs. So the servicers are registered here with
a deserializer that never raises: bytes that do not parse, and requests that
fail `_checks.check_request`, become a `Refused`, which the handler wrapper
(`_rpc`) answers with `INVALID_ARGUMENT` naming the field, logged like any
other call. Every request of every RPC passes through here: no handler can
forget a check.

Which field: protobuf's DecodeError names only the message type, so on that
(rare) path `locate` reads the wire format itself and finds the first field
whose bytes are wrong: a string that is not UTF-8 (a lone surrogate is not),
a length running past the end (a truncated message), a malformed tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from troth_server.api._checks import check_request, show
from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from google.protobuf.descriptor import Descriptor, ServiceDescriptor
    from google.protobuf.message import Message

    from troth_server.config import Limits


@dataclass(frozen=True, slots=True)
class Refused:
    """What a handler receives instead of a request refused as it was decoded."""

    error: InvalidArgument
    id: str | None = None
    """The request's promise id, if it decoded and has one: for the RPC's log line."""


def undecodable(message_type: str, field: str, problem: str) -> InvalidArgument:
    return InvalidArgument(
        field,
        f"{problem}: the request is not a valid {message_type}; "
        "send a message encoded by a protobuf library from troth's .proto files",
    )


def deserializer(cls: type[Message], limits: Limits) -> Callable[[bytes], Message | Refused]:
    """`cls.FromString`, then `check_request`; a `Refused` for bytes that fail either."""
    descriptor: Descriptor = cls.DESCRIPTOR  # type: ignore[assignment]

    def parse(data: bytes) -> Message | Refused:
        try:
            message = cls.FromString(data)
        except DecodeError as exc:
            field, problem = locate(descriptor, data)
            if field == "request" and not problem:
                problem = str(exc)
            return Refused(undecodable(descriptor.full_name, field, problem or "cannot be decoded"))
        try:
            # A decoded string never holds a lone surrogate (its bytes would not have
            # decoded), and one holding NUL puts a 0 byte in the request: the text
            # checks run only then, the cheap list and time checks always.
            check_request(message, limits, text=b"\x00" in data)
        except InvalidArgument as refused:
            return Refused(refused, getattr(message, "id", None) or None)
        return message

    return parse


def register(
    server: grpc.aio.Server, service: ServiceDescriptor, servicer: object, limits: Limits
) -> None:
    """Serve `service` with `servicer`'s methods (of the same names), through `deserializer`.

    The generated `add_*Servicer_to_server` does the same with `FromString`;
    this one is built from the descriptor, so it covers every method there is.
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        if method.client_streaming and not method.server_streaming:
            raise NotImplementedError(f"{method.full_name}: no client-only streams in troth.v1")
        make: Any = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=deserializer(request, limits),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)


# --- where the bytes go wrong -----------------------------------------------------------

_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = 0, 1, 2, 3, 4, 5
_MAX_DEPTH = 32


class _Bad(Exception):
    """A malformed field: its path, what is wrong, and (while unnamed) its number."""

    def __init__(self, field: str, problem: str, number: int | None = None) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem
        self.number = number

    def named(self, descriptor: Descriptor, path: str, counts: dict[int, int]) -> _Bad:
        """This error with the path of the field it was found in, if known."""
        if self.number is None:
            return self
        field = descriptor.fields_by_number.get(self.number)
        return _Bad(_name(field, self.number, path, counts), self.problem)


def locate(descriptor: Descriptor, data: bytes) -> tuple[str, str]:
    """The first field of `data` (encoding a `descriptor` message) that is malformed, and how.

    ("request", "") when no field is to blame (protobuf refused it for a reason
    this reader does not check).
    """
    try:
        _scan(descriptor, memoryview(data), "", 0)
    except _Bad as bad:
        return bad.field or "request", bad.problem
    return "request", ""


def _fields(data: memoryview, where: str) -> Iterator[tuple[int, int, memoryview | None]]:
    """(field number, wire type, bytes of a length-delimited value) for each field."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos, where, "a field tag")
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise _Bad(where, "has a field numbered 0")
        if wire == _VARINT:
            _, pos = _varint(data, pos, where, "a number", number)
            yield number, wire, None
        elif wire in (_I64, _I32):
            pos += 8 if wire == _I64 else 4
            if pos > len(data):
                raise _Bad(where, "is truncated: the message ends inside a number", number)
            yield number, wire, None
        elif wire == _LEN:
            length, pos = _varint(data, pos, where, "a length", number)
            if pos + length > len(data):
                raise _Bad(
                    where,
                    f"is truncated: a field announces {length} bytes but {len(data) - pos} follow",
                    number,
                )
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire in (_SGROUP, _EGROUP):
            raise _Bad(where, "uses the group encoding, which no troth message has", number)
        else:
            raise _Bad(where, f"has wire type {wire}, which protobuf does not define", number)


def _scan(descriptor: Descriptor, data: memoryview, path: str, depth: int) -> None:
    """Raise `_Bad` naming the first malformed field of `data` (a message at `path`)."""
    if depth > _MAX_DEPTH:
        raise _Bad(path, "nests deeper than any troth message")
    counts: dict[int, int] = {}
    fields = _fields(data, path)
    while True:
        try:
            item = next(fields, None)
        except _Bad as bad:
            raise bad.named(descriptor, path, counts) from None
        if item is None:
            return
        number, _wire, value = item
        field = descriptor.fields_by_number.get(number)
        name = _name(field, number, path, counts)
        if field is None or value is None:
            continue
        if field.type == FieldDescriptor.TYPE_STRING:
            _utf8(value, name)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            _scan_map_entry(field.message_type, value, name, depth)
        elif field.message_type is not None:
            _scan(field.message_type, value, name, depth + 1)


def _name(field: FieldDescriptor | None, number: int, path: str, counts: dict[int, int]) -> str:
    """The path of the next occurrence of field `number`: `a.b`, `a.list[2]`, `a.map`."""
    base = (path + "." if path else "") + (field.name if field is not None else f"<{number}>")
    if field is None or not field.is_repeated:
        return base
    index = counts.get(number, 0)
    counts[number] = index + 1
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return base
    return f"{base}[{index}]"


def _scan_map_entry(entry: Descriptor, value: memoryview, name: str, depth: int) -> None:
    # A bad key is the map's fault (`tags`); a bad value is named by its key (`tags[team]`).
    try:
        _scan(entry, value, "", depth + 1)
    except _Bad as bad:
        if bad.field in ("", "key"):
            raise _Bad(name, bad.problem) from None
        key = _entry_key(value)
        label = name if key is None else f"{name}[{show(key)}]"
        rest = bad.field.removeprefix("value")
        raise _Bad(label + rest, bad.problem) from None


def _entry_key(value: memoryview) -> str | None:
    try:
        for number, _wire, data in _fields(value, ""):
            if number == 1 and data is not None:
                return bytes(data).decode("utf-8")
    except (_Bad, UnicodeDecodeError):
        return None
    return None


def _utf8(value: memoryview, name: str, what: str = "the text") -> str:
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Bad(
            name,
            f"{what} is not valid UTF-8 at byte {exc.start} "
            f"({bytes(value[exc.start : exc.start + 3])!r}); text fields must be UTF-8, "
            "which has no encoding for a lone surrogate",
        ) from None


def _varint(
    data: memoryview, pos: int, name: str, what: str, number: int | None = None
) -> tuple[int, int]:
    result = shift = 0
    for _ in range(10):
        if pos >= len(data):
            raise _Bad(name, f"is truncated: the message ends inside {what}", number)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    raise _Bad(name, f"has {what} longer than 10 bytes", number)
