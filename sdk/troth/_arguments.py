"""The checks of public SDK arguments, at the API boundary (pure).

`Client` and `Context` methods check what they were given before building any
request, so a wrong type is a `TypeError` and a wrong value a `ValueError`
naming the call, the argument, what it must be and what it got, e.g.
`Client.create: ttl must be a datetime.timedelta such as timedelta(hours=1),
not int 3600 (for seconds, write timedelta(seconds=3600))`, instead of
protobuf's `TypeError` naming no argument. Each check returns the value as the
caller will use it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta

__all__ = [
    "check_bool",
    "check_count",
    "check_duration",
    "check_id",
    "check_moment",
    "check_optional_id",
    "check_optional_text",
    "check_seconds",
    "check_tags",
    "check_text",
]

_DURATION = "a datetime.timedelta such as timedelta(hours=1)"


def _got(value: object) -> str:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _wrong_type(call: str, name: str, expected: str, value: object, hint: str = "") -> TypeError:
    return TypeError(f"{call}: {name} must be {expected}, not {_got(value)}{hint}")


def check_id(call: str, value: object, name: str = "id") -> str:
    """A promise or workflow id: a str (what it may hold, the server checks, naming it)."""
    if not isinstance(value, str):
        raise _wrong_type(call, name, "a str such as 'approval-7'", value)
    return value


def check_optional_id(call: str, value: object, name: str = "id") -> str | None:
    return None if value is None else check_id(call, value, name)


def check_text(call: str, value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _wrong_type(call, name, "a str", value)
    return value


def check_optional_text(call: str, value: object, name: str) -> str | None:
    return None if value is None else check_text(call, value, name)


def check_bool(call: str, value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type(call, name, "True or False", value)
    return value


def check_duration(
    call: str, value: object, name: str, *, seconds: bool = False
) -> timedelta | None:
    """A duration: a timedelta (also a number of seconds when `seconds`), or None. Its
    sign is left to the caller (the server refuses a ttl that is not positive, naming it)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if seconds and number:
        assert isinstance(value, int | float)
        if not math.isfinite(value):
            raise ValueError(f"{call}: {name} must be a finite number of seconds, not {value!r}")
        return timedelta(seconds=value)
    expected = f"{_DURATION} or a number of seconds" if seconds else _DURATION
    hint = ""
    if number:
        hint = f" (for seconds, write timedelta(seconds={value!r}))"
    elif isinstance(value, str):
        hint = " (in Python a duration is a timedelta; '1h30m' is the CLI's syntax)"
    raise _wrong_type(call, name, expected, value, hint)


def check_seconds(call: str, value: object, name: str = "timeout") -> float | None:
    """A wait in seconds: a positive finite number (a timedelta is accepted), or None."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _wrong_type(call, name, "a number of seconds such as 30, or None", value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{call}: {name} must be a positive number of seconds, not {value!r}")
    return float(value)


def check_moment(call: str, value: object, name: str) -> datetime | None:
    """A point in time: an aware datetime, or None."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise _wrong_type(call, name, "an aware datetime such as datetime.now(UTC)", value)
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{call}: {name} {value.isoformat()} has no timezone, so the instant is ambiguous; "
            "pass an aware datetime, e.g. datetime.now(UTC) + timedelta(hours=1)"
        )
    return value


def check_tags(call: str, value: object, name: str = "tags") -> dict[str, str]:
    """String tags: a mapping of str to str, or None (no tags)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _wrong_type(call, name, "a mapping of str to str such as {'team': 'billing'}", value)
    tags: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _wrong_type(call, f"{name} keys", "str", key)
        if not isinstance(item, str):
            raise _wrong_type(call, f"{name}[{key!r}]", "a str", item)
        tags[key] = item
    return tags


def check_count(call: str, value: object, name: str) -> int | None:
    """A whole number, or None (its bounds, the server checks, naming it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(call, name, "a whole number such as 100", value)
    return value
