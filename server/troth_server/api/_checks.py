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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.protobuf.descriptor import FieldDescriptor

from troth_server.api._inputs import LIST_LIMITS, ListLimit
from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Sequence

    from google.protobuf.descriptor import Descriptor
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


def check_request(message: Message, limits: Limits, *, text: bool = True) -> None:
    """Refuse the first field of `message` that breaks a rule above.

    Args:
        message: A decoded request.
        limits: The lists' maxima.
        text: False to skip the text checks: the deserializer knows that no
            string holds NUL when the request's bytes hold no 0 byte.

    Raises:
        InvalidArgument: Naming the field's path.
    """
    if text:
        _walk(message, "", limits)
    else:
        _walk_lean(message, "", limits)


# How each field is walked, decided once per message type from its descriptor.
_TEXT, _TEXTS, _MAP, _MESSAGE, _MESSAGES, _TIMESTAMP_FIELD, _DURATION_FIELD, _LIST, _SKIP = range(9)


@dataclass(frozen=True, slots=True)
class _Field:
    kind: int
    limit: ListLimit | None = None
    key_is_text: bool = False
    value_kind: int = _SKIP


_PLANS: dict[str, dict[int, _Field]] = {}


def _plan(descriptor: Descriptor) -> dict[int, _Field]:
    plan = _PLANS.get(descriptor.full_name)
    if plan is None:
        plan = _PLANS[descriptor.full_name] = {
            f.number: _field(descriptor, f) for f in descriptor.fields
        }
    return plan


def _field(descriptor: Descriptor, field: FieldDescriptor) -> _Field:
    sub = field.message_type
    if field.is_repeated:
        # KeyError here: a list field without a documented maximum (a test checks
        # that LIST_LIMITS has every one).
        limit = LIST_LIMITS[(descriptor.full_name, field.name)]
        if sub is not None and sub.GetOptions().map_entry:
            key, value = sub.fields_by_name["key"], sub.fields_by_name["value"]
            value_kind = (
                _TEXT if value.type == _STRING else _MESSAGE if value.message_type else _SKIP
            )
            return _Field(_MAP, limit, key.type == _STRING, value_kind)
        if field.type == _STRING:
            return _Field(_TEXTS, limit)
        return _Field(_MESSAGES if sub is not None else _LIST, limit)
    if sub is not None:
        if sub.full_name == _TIMESTAMP:
            return _Field(_TIMESTAMP_FIELD)
        if sub.full_name == _DURATION:
            return _Field(_DURATION_FIELD)
        return _Field(_MESSAGE)
    return _Field(_TEXT if field.type == _STRING else _SKIP)


def _walk(message: Message, prefix: str, limits: Limits) -> None:
    plan = _plan(message.DESCRIPTOR)  # type: ignore[arg-type]
    for field, value in message.ListFields():
        how = plan[field.number]
        kind = how.kind
        if kind == _TEXT:
            if "\x00" in value or not value.isascii():
                check_text(prefix + field.name, value)
        elif kind == _SKIP:
            continue
        elif how.limit is not None:
            path = prefix + field.name
            _check_length(how.limit, path, len(value), limits)
            if kind == _TEXTS:
                _check_texts(path, value)
            elif kind == _MAP:
                _walk_map(how, path, value, limits)
            elif kind == _MESSAGES:
                for i, item in enumerate(value):
                    _walk(item, f"{path}[{i}].", limits)
        elif kind == _MESSAGE:
            _walk(value, prefix + field.name + ".", limits)
        elif kind == _TIMESTAMP_FIELD:
            check_timestamp(prefix + field.name, value.seconds, value.nanos)
        elif kind == _DURATION_FIELD:
            check_duration(prefix + field.name, value.seconds, value.nanos)


def _walk_lean(message: Message, prefix: str, limits: Limits) -> None:
    """`_walk` without the text: only the fields that are, or may hold, lists and times."""
    for name, how in _lean_plan(message.DESCRIPTOR):  # type: ignore[arg-type]
        kind = how.kind
        if how.limit is not None:
            value: Any = getattr(message, name)
            if not value:
                continue
            path = prefix + name
            _check_length(how.limit, path, len(value), limits)
            if kind == _MESSAGES and _lean_plan(value[0].DESCRIPTOR):
                for i, item in enumerate(value):
                    _walk_lean(item, f"{path}[{i}].", limits)
            elif kind == _MAP and how.value_kind == _MESSAGE:
                for key, item in value.items():
                    _walk_lean(item, f"{path}[{show(key)}].", limits)
        elif message.HasField(name):
            value = getattr(message, name)
            if kind == _MESSAGE:
                _walk_lean(value, prefix + name + ".", limits)
            elif kind == _TIMESTAMP_FIELD:
                check_timestamp(prefix + name, value.seconds, value.nanos)
            else:
                check_duration(prefix + name, value.seconds, value.nanos)


_LEAN: dict[str, list[tuple[str, _Field]]] = {}


def _lean_plan(descriptor: Descriptor) -> list[tuple[str, _Field]]:
    """The fields of `descriptor` that `_walk_lean` visits (nested: those that hold some)."""
    found = _LEAN.get(descriptor.full_name)
    if found is None:
        found = _LEAN[descriptor.full_name] = []
        plan = _plan(descriptor)
        for field in descriptor.fields:
            how = plan[field.number]
            sub = field.message_type
            if how.kind == _MESSAGE and sub is not None and not _lean_plan(sub):
                continue  # nothing in it to check
            if how.kind in (_TEXT, _SKIP):
                continue
            found.append((field.name, how))
    return found


def _check_texts(path: str, texts: Sequence[str]) -> None:
    # One scan of them all in C; the slow loop only finds which one is bad.
    joined = "".join(texts)
    if "\x00" in joined or (not joined.isascii() and _SURROGATE.search(joined)):
        for i, text in enumerate(texts):
            check_text(f"{path}[{i}]", text)


def _walk_map(how: _Field, path: str, entries: Any, limits: Limits) -> None:
    if how.key_is_text:
        keys = "".join(entries)
        if "\x00" in keys or not keys.isascii():
            for key in entries:
                check_text(path, key, what="a key")
    if how.value_kind == _TEXT:
        values = "".join(entries.values())
        if "\x00" in values or not values.isascii():
            for key, value in entries.items():
                check_text(f"{path}[{show(key)}]", value)
    elif how.value_kind == _MESSAGE:
        for key, value in entries.items():
            _walk(value, f"{path}[{show(key)}].", limits)


def _check_length(limit: ListLimit, path: str, length: int, limits: Limits) -> None:
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
