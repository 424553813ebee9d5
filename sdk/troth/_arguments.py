"""The checks of public SDK arguments, at the API boundary (pure).

`Client` and `Context` methods check what they were given before building any
request, so a wrong type is a `TypeError` and a wrong value a `ValueError`
naming the call, the argument, what it must be and what it got, e.g.
`Client.create: ttl must be a timedelta (datetime.timedelta) such as
timedelta(hours=1), not int 3600 (for seconds, write timedelta(seconds=3600))`,
instead of protobuf's `TypeError` naming no argument. Each check returns the value as the
caller will use it. Callers import the module (`from troth import _arguments
as check`) and call `check.duration(...)`, `check.tags(...)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from troth._approvers import Approvers

__all__ = [
    "approvers",
    "at_most_one_expiry",
    "count",
    "duration",
    "flag",
    "flags",
    "moment",
    "optional_id",
    "optional_text",
    "promise_id",
    "seconds",
    "step_name",
    "tags",
    "text",
    "texts",
    "workflow_name",
]

_DURATION = "a timedelta (datetime.timedelta) such as timedelta(hours=1)"


def _got(value: object) -> str:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{type(value).__name__} {shown}"


def _wrong_type(call: str, name: str, expected: str, value: object, hint: str = "") -> TypeError:
    return TypeError(f"{call}: {name} must be {expected}, not {_got(value)}{hint}")


def promise_id(call: str, value: object, name: str = "id") -> str:
    """A promise or workflow id: a str (what it may hold, the server checks, naming it)."""
    if not isinstance(value, str):
        raise _wrong_type(call, name, "a str such as 'approval-7'", value)
    return value


def optional_id(call: str, value: object, name: str = "id") -> str | None:
    return None if value is None else promise_id(call, value, name)


def step_name(call: str, value: object) -> str | None:
    """The `id=` a workflow gives one of its steps (`ctx.promise`, `ctx.run`, ...):
    any id but one ending in `.<number>`, the form the server keeps for the steps
    a workflow numbers itself and refuses to anyone else (`RESERVED_FOR_WORKFLOW`)."""
    name = optional_id(call, value)
    if name is not None:
        head, dot, last = name.rpartition(".")
        if dot and head and last.isascii() and last.isdigit():
            raise ValueError(
                f"{call}: id {name!r} ends in '.<number>', the form troth keeps for the "
                "steps it numbers itself ('<workflow id>.<n>'); name the step otherwise, "
                f"e.g. {f'{head}.step-{last}'!r}"
            )
    return name


def text(call: str, value: object, name: str) -> str:
    if not isinstance(value, str):
        raise _wrong_type(call, name, "a str", value)
    return value


def optional_text(call: str, value: object, name: str) -> str | None:
    return None if value is None else text(call, value, name)


def flag(call: str, value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise _wrong_type(call, name, "True or False", value)
    return value


def duration(call: str, value: object, name: str, *, in_seconds: bool = False) -> timedelta | None:
    """A duration: a timedelta (also a number of seconds when `in_seconds`), or None. Its
    sign is left to the caller (the server refuses a ttl that is not positive, naming it)."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if in_seconds and number:
        assert isinstance(value, int | float)
        if not math.isfinite(value):
            raise ValueError(f"{call}: {name} must be a finite number of seconds, not {value!r}")
        return timedelta(seconds=value)
    expected = f"{_DURATION} or a number of seconds" if in_seconds else _DURATION
    hint = ""
    if number:
        hint = f" (for seconds, write timedelta(seconds={value!r}))"
    elif isinstance(value, str):
        hint = " (in Python a duration is a timedelta; '1h30m' is the CLI's syntax)"
    raise _wrong_type(call, name, expected, value, hint)


def seconds(call: str, value: object, name: str = "timeout") -> float | None:
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


def moment(call: str, value: object, name: str) -> datetime | None:
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


def tags(call: str, value: object, name: str = "tags") -> dict[str, str]:
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


def count(call: str, value: object, name: str) -> int | None:
    """A whole number, or None (its bounds, the server checks, naming it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(call, name, "a whole number such as 100", value)
    return value


def flags(call: str, **values: object) -> None:
    """Each of these arguments is True or False."""
    for name, value in values.items():
        flag(call, value, name)


def texts(call: str, *, optional: bool = False, **values: object) -> None:
    """Each of these arguments is a str (or None, when `optional`)."""
    for name, value in values.items():
        if not (optional and value is None):
            text(call, value, name)


def approvers(call: str, value: object) -> None:
    """None, or a `troth.Approvers`."""
    if value is not None and not isinstance(value, Approvers):
        raise _wrong_type(
            call, "approvers", "a troth.Approvers such as Approvers(principals=['ann'])", value
        )


def workflow_name(workflow: str | Callable[..., Any]) -> str:
    """The name a workflow is registered under: the name given, or the function's."""
    if isinstance(workflow, str):
        if not workflow:
            raise ValueError("workflow name must not be empty")
        return workflow
    return str(getattr(workflow, "__name__", None) or type(workflow).__name__)


def at_most_one_expiry(call: str, ttl: object, expire_time: object, never_expires: bool) -> None:
    given = [n for n, value in (("ttl", ttl), ("expire_time", expire_time)) if value is not None]
    given += ["never_expires"] if never_expires else []
    if len(given) > 1:
        raise ValueError(
            f"{call} got {' and '.join(given)}; pass at most one of ttl, expire_time and "
            "never_expires"
        )
