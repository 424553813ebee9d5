"""The fuzzer's oracle: what every answer to any request must look like (issue 10, item 5).

Pure: it judges an `Answer` already received. An answer is OK, or one of the
documented statuses with a `google.rpc.ErrorInfo` (domain `troth.dev`, a
reason, and for INVALID_ARGUMENT the field it names); never UNKNOWN, INTERNAL,
CANCELLED, DEADLINE_EXCEEDED, or UNAVAILABLE (the store is up in these tests);
no traceback text, exception class name or driver module in any message; and
no other caller's health check stalled while it was being answered.

The one exception is the transport's own size limit: a request larger than the
server's gRPC receive limit is refused by gRPC itself (RESOURCE_EXHAUSTED)
before any troth code runs, so no ErrorInfo can be attached to it.
"""

from __future__ import annotations

import base64
import builtins
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from _fuzz_proto import TRANSPORT_LIMIT
from google.protobuf import text_format

from troth.errors import ERROR_DOMAIN, Reason

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from google.rpc import error_details_pb2

DOCUMENTED = frozenset({
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
})  # fmt: skip
"""DESIGN §5's statuses a client's request may get while the store is up."""

STALL_LIMIT_S = 1.5
"""Longest a health check may take while another request is being answered. The
issue asks for 100 ms; this leaves room for a loaded, shared 2-core CI machine."""

_LIBRARY_ERRORS = (
    "DecodeError", "EncodeError", "RecursionError", "IntegrityError", "OperationalError",
    "DataError", "ProgrammingError", "InterfaceError", "DatabaseError", "StatementError",
    "ValidationError", "SchemaError", "RefResolutionError", "Unresolvable", "JSONDecodeError",
    "InvalidPageToken", "InvalidArgument", "DomainError", "StoreError", "StoreUnavailable",
    "CommitOutcomeUnknown", "PromiseNotFound", "StaleCounter", "TaskNotFound",
)  # fmt: skip
_BUILTIN_ERRORS = tuple(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException) and name != "Warning"
)
LEAKS = re.compile(
    r"Traceback \(most recent call last\)|File \"|\bline \d+, in\b|"
    r"\b(?:sqlalchemy|psycopg2?|sqlite3|orjson|jsonschema|referencing)\.|"
    r"Background on this error|"
    rf"\b(?:{'|'.join(_BUILTIN_ERRORS + _LIBRARY_ERRORS)})\b"
)
"""What a message must not contain: it is the server's insides, not an answer."""


@dataclass(frozen=True)
class Call:
    """One request to send: a typed message, or raw bytes (`what` says how they are bad)."""

    path: str
    request: Message | bytes
    streaming: bool
    principal: str | None = None
    what: str = ""

    def wire(self) -> bytes:
        if isinstance(self.request, bytes):
            return self.request
        return self.request.SerializeToString()

    def __repr__(self) -> str:
        return describe(self)


def describe(call: Call, limit: int = 4000) -> str:
    """The request, readable and replayable: its text form (long strings elided)
    and its exact wire bytes in base64 when they are short enough to paste."""
    if isinstance(call.request, bytes):
        shown = f"raw bytes ({call.what}): {call.request[:200]!r}" + (
            f"... ({len(call.request)} bytes)" if len(call.request) > 200 else ""
        )
    else:
        shown = text_format.MessageToString(call.request, as_one_line=True)
        shown = re.sub(r'"((?:[^"\\]|\\.){120})(?:[^"\\]|\\.)+"', r'"\1..."', shown)
        shown = f"{type(call.request).__name__}{{{shown[:limit]}}}"
    wire = call.wire()
    replay = (
        f" wire(base64)={base64.b64encode(wire).decode()}"
        if len(wire) <= limit
        else f" wire: {len(wire)} bytes"
    )
    who = f" principal={call.principal!r}" if call.principal is not None else ""
    return f"{call.path}{who} {shown}{replay}"


@dataclass
class Answer:
    """What came back: the status, its message and ErrorInfo, and what was observed."""

    code: grpc.StatusCode
    details: str = ""
    info: error_details_pb2.ErrorInfo | None = None
    messages: int = 0
    undecodable: str | None = None
    """Why a response message did not decode as the method's response type."""
    cancelled_by_us: bool = False
    """A stream the fuzzer ended itself after reading it for a while."""
    stalls: list[str] = field(default_factory=list)
    """Health checks that took longer than STALL_LIMIT_S while this call ran."""


_TIMESTAMP_SECONDS = (-62_135_596_800, 253_402_300_799)
_DURATION_SECONDS = 315_576_000_000


def invalid_times(message: Message, prefix: str = "") -> list[str]:
    """The Timestamps and Durations in `message` that break the proto's own rules
    (range; nanos in [0, 1e9) for a Timestamp, |nanos| < 1e9 and of the seconds'
    sign for a Duration)."""
    found: list[str] = []
    for descriptor, value in message.ListFields():
        where = f"{prefix}{descriptor.name}"
        if descriptor.type != descriptor.TYPE_MESSAGE or descriptor.is_repeated:
            continue
        assert descriptor.message_type is not None
        kind = descriptor.message_type.full_name
        seconds, nanos = getattr(value, "seconds", 0), getattr(value, "nanos", 0)
        if kind == "google.protobuf.Timestamp":
            lo, hi = _TIMESTAMP_SECONDS
            if not (lo <= seconds <= hi and 0 <= nanos < 1_000_000_000):
                found.append(f"{where} = Timestamp(seconds={seconds}, nanos={nanos})")
        elif kind == "google.protobuf.Duration":
            in_range = abs(seconds) <= _DURATION_SECONDS and abs(nanos) < 1_000_000_000
            if not in_range or seconds * nanos < 0:
                found.append(f"{where} = Duration(seconds={seconds}, nanos={nanos})")
        else:
            found.extend(invalid_times(value, f"{where}."))
    return found


def problems(call: Call, answer: Answer) -> list[str]:
    """Everything wrong with this answer to this call (empty: it is a good answer)."""
    found = [f"health check stalled while this call ran: {s}" for s in answer.stalls]
    accepted = answer.code is grpc.StatusCode.OK or answer.cancelled_by_us
    if accepted and not isinstance(call.request, bytes):
        found.extend(
            f"accepted an invalid {bad}: it must be INVALID_ARGUMENT"
            for bad in invalid_times(call.request)
        )
    if answer.undecodable is not None:
        found.append(f"a response did not decode: {answer.undecodable}")
    leak = LEAKS.search(answer.details)
    if leak is not None:
        found.append(f"the message leaks the server's insides ({leak.group(0)!r})")
    if answer.code is grpc.StatusCode.OK or answer.cancelled_by_us:
        return found
    if answer.code is grpc.StatusCode.RESOURCE_EXHAUSTED and _transport_limit(call, answer):
        return found
    if answer.code not in DOCUMENTED:
        found.append(f"status {answer.code.name} is not a documented answer to a request")
    if answer.info is None:
        found.append(f"{answer.code.name} carries no google.rpc.ErrorInfo")
        return found
    if answer.info.domain != ERROR_DOMAIN:
        found.append(f"ErrorInfo domain is {answer.info.domain!r}, not {ERROR_DOMAIN!r}")
    if answer.info.reason not in {r.value for r in Reason}:
        found.append(f"ErrorInfo reason {answer.info.reason!r} is not a troth.errors.Reason")
    if answer.info.reason == Reason.INTERNAL:
        found.append("reason INTERNAL: the server crashed on this request")
    if answer.code is grpc.StatusCode.INVALID_ARGUMENT and not answer.info.metadata.get("field"):
        found.append("INVALID_ARGUMENT names no field (ErrorInfo metadata 'field')")
    return found


def _transport_limit(call: Call, answer: Answer) -> bool:
    """gRPC's own answer to a message over the receive limit (no troth code ran)."""
    return (
        answer.info is None
        and len(call.wire()) > TRANSPORT_LIMIT
        and "larger than max" in answer.details
    )
