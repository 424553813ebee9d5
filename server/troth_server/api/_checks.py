"""The checks every decoded request passes before its handler runs, by its descriptor.

Pure: no I/O. `check_request` walks the fields a request sets (nested messages,
repeated fields and maps included), so a field added to the .proto files is
checked without anyone remembering to:

- text: no NUL character (PostgreSQL cannot store one in text or JSONB, SQLite
  would) and no lone surrogate, in strings, map keys and map values;
- lists: at most their maximum (`_inputs.LIST_LIMITS`), counted before the
  entries are looked at, so a huge list costs one `len`;
- `google.protobuf.Timestamp` and `Duration`: within the ranges the
  protobuf well-known types define (and so within a 64-bit millisecond count).

The handlers then check what each field means (an id's characters, a ttl's
sign, a page token). Errors are `InvalidArgument` naming the field's path:
`title`, `tags[team]`, `param.headers[content-type]`, `suspend_on[3]`,
`workflows[2].name`, `fence.worker_id`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor

from troth_server.api._inputs import LIST_LIMITS
from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from google.protobuf.message import Message

    from troth_server.config import Limits

_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"
# The well-known types' own ranges (timestamp.proto, duration.proto).
MIN_TIMESTAMP_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
MAX_TIMESTAMP_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
MAX_DURATION_SECONDS = 315_576_000_000  # about 10,000 years
_NANOS = 1_000_000_000
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = FieldDescriptor.TYPE_STRING


def check_request(message: Message, limits: Limits) -> None:
    """Refuse the first field of `message` that breaks a rule above.

    Raises:
        InvalidArgument: Naming the field's path.
    """
    _walk(message, "", limits)


def _walk(message: Message, prefix: str, limits: Limits) -> None:
    for field, value in message.ListFields():
        path = prefix + field.name
        if field.is_repeated:
            _check_length(message, field, path, len(value), limits)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                _walk_map(field, path, value, limits)
            elif field.type == _STRING:
                for i, text in enumerate(value):
                    check_text(f"{path}[{i}]", text)
            elif field.message_type is not None:
                for i, item in enumerate(value):
                    _walk_message(item, f"{path}[{i}]", limits)
        elif field.message_type is not None:
            _walk_message(value, path, limits)
        elif field.type == _STRING:
            check_text(path, value)


def _walk_map(field: FieldDescriptor, path: str, entries: Any, limits: Limits) -> None:
    entry = field.message_type
    assert entry is not None
    key_type = entry.fields_by_name["key"].type
    value_field = entry.fields_by_name["value"]
    for key, value in entries.items():
        if key_type == _STRING:
            check_text(path, key, what="a key")
        label = f"{path}[{show(key)}]"
        if value_field.message_type is not None:
            _walk_message(value, label, limits)
        elif value_field.type == _STRING:
            check_text(label, value)


def _walk_message(value: Message, path: str, limits: Limits) -> None:
    name = value.DESCRIPTOR.full_name
    if name == _TIMESTAMP:
        check_timestamp(path, value.seconds, value.nanos)  # type: ignore[attr-defined]
    elif name == _DURATION:
        check_duration(path, value.seconds, value.nanos)  # type: ignore[attr-defined]
    else:
        _walk(value, path + ".", limits)


def _check_length(
    message: Message, field: FieldDescriptor, path: str, length: int, limits: Limits
) -> None:
    # KeyError here means a list field without a documented maximum: the test of
    # LIST_LIMITS fails first.
    limit = LIST_LIMITS[(message.DESCRIPTOR.full_name, field.name)]
    allowed = limit.of(limits)
    if length > allowed:
        where = f" (set by {limit.flag})" if limit.flag else f" ({limit.why})"
        raise InvalidArgument(
            path, f"has {length} entries; the limit is {allowed}{where}: send fewer"
        )


def check_text(path: str, text: str, what: str = "the text") -> None:
    """Text any field may hold: no NUL character, no lone surrogate."""
    if "\x00" in text:
        raise InvalidArgument(
            path, f"{what} '{show(text)}' contains a NUL character (U+0000), which no field accepts"
        )
    if not text.isascii() and _SURROGATE.search(text):
        raise InvalidArgument(
            path, f"{what} '{show(text)}' contains a lone surrogate; send valid Unicode text"
        )


def check_timestamp(path: str, seconds: int, nanos: int) -> None:
    """A `google.protobuf.Timestamp` within its defined range."""
    if not MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(
            path,
            f"has seconds={seconds}, outside the range of a Timestamp "
            f"({MIN_TIMESTAMP_SECONDS}..{MAX_TIMESTAMP_SECONDS}, 0001-01-01..9999-12-31)",
        )
    if not 0 <= nanos < _NANOS:
        raise InvalidArgument(path, f"has nanos={nanos}; a Timestamp's nanos are 0 to 999999999")


def check_duration(path: str, seconds: int, nanos: int) -> None:
    """A `google.protobuf.Duration` by its rules: in range, nanos of the seconds' sign."""
    if not -MAX_DURATION_SECONDS <= seconds <= MAX_DURATION_SECONDS:
        raise InvalidArgument(
            path,
            f"has seconds={seconds}, outside the range of a Duration "
            f"(±{MAX_DURATION_SECONDS}, about 10,000 years)",
        )
    if not -_NANOS < nanos < _NANOS:
        raise InvalidArgument(
            path, f"has nanos={nanos}; a Duration's nanos are -999999999 to 999999999"
        )
    if (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
        raise InvalidArgument(
            path,
            f"has seconds={seconds} and nanos={nanos}: a Duration's seconds and nanos "
            "must have the same sign",
        )


def show(text: object, limit: int = 40) -> str:
    """`text` made printable and short for an error message or a field path."""
    shown = str(text)
    if not shown.isprintable():
        shown = shown.encode("unicode_escape", "backslashreplace").decode("ascii")
    return shown if len(shown) <= limit else shown[:limit] + "..."
