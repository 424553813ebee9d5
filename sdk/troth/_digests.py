"""Argument digests: what a step command asked for, in 16 hex characters.

The engine records `args_digest(command)` on each step promise as the tag
`troth:args` and, on replay, compares it with the digest of the command the
code yields at that position (DESIGN §4 rule 7). A digest must be the same in
every process and every Python run, so it is never `hash()`: it is
BLAKE2b (8-byte digest, hex) of the command's canonical encoding.

Canonical encoding ("troth canonical JSON", version 1): the JSON array
`[kind, ...fields]` written by `json.dumps` with sorted keys, separators
`(",", ":")`, `ensure_ascii=True` and no NaN or infinity, where

- tuples are lists, dict keys are strings (as JSON makes them);
- a dataclass instance is its fields, a pydantic model its
  `model_dump(mode="json")`, an enum member its value (as `JsonCodec` writes them);
- `datetime`/`date`/`time` are ISO 8601 strings, a `timedelta` its seconds,
  `Decimal` and `UUID` their `str`, `bytes` `{"$bytes": hex}`, a set or
  frozenset the sorted list of its members' encodings.

The fields per command (what "what was asked" means):

| command   | fields                                                         |
|-----------|----------------------------------------------------------------|
| `run`     | function name; args; a `functools.partial`'s bound args/kwargs |
| `promise` | explicit id or null; timeout in seconds or null; JSON Schema   |
| `start`   | workflow name; args; explicit id or null; ttl in seconds (*)   |
| `sleep`   | duration in seconds                                            |

`now` and `random` take no arguments: they get no digest. A promise's title,
message and tags, a child's group and `start` versus `rpc` are not part of it.
(*) Only when given, so a start without a ttl keeps the digest it had before ttls.

Arguments the encoding cannot represent (an object of a class it does not
know, NaN, a dict with keys of mixed types...) give no digest: the step is
recorded without `troth:args`, its arguments are not checked on replay, and
`troth.engine` logs why at DEBUG. A `repr` is not used instead: it often
holds a memory address and would fail every replay in another process.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import hashlib
import json
import logging
import uuid
from typing import Any

from troth._commands import (
    CreatePromise,
    Now,
    Random,
    RunStep,
    SettleToken,
    Sleep,
    StartWorkflow,
    StepCommand,
)
from troth._schema import to_json_compatible

__all__ = ["DIGEST_LENGTH", "args_digest", "canonical_json", "describe_args"]

DIGEST_LENGTH = 16
"""Hex characters in a digest (BLAKE2b with an 8-byte digest)."""

_log = logging.getLogger("troth.engine")


def canonical_json(value: Any) -> str:
    """`value` in troth canonical JSON (see the module docstring).

    Raises:
        TypeError: It holds a value of a type the encoding does not know.
        ValueError: It holds NaN or infinity.
    """
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
        default=_default,
    )


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, set | frozenset):
        return sorted(canonical_json(item) for item in value)
    return to_json_compatible(value)


def _fields(command: StepCommand) -> list[Any] | None:
    if isinstance(command, RunStep):
        fn: Any = command.fn
        bound: list[Any] = []
        while isinstance(fn, functools.partial):
            bound.insert(0, [list(fn.args), dict(fn.keywords)])
            fn = fn.func
        return ["run", command.name, list(command.args), bound]
    if isinstance(command, CreatePromise):
        timeout = None if command.timeout is None else command.timeout.total_seconds()
        schema = None if command.schema is None else dict(command.schema.json_schema)
        return ["promise", command.id, timeout, schema]
    if isinstance(command, StartWorkflow):
        fields = ["start", command.name, list(command.args), command.id]
        # Only when given: a start without one keeps the digest it always had.
        return fields if command.ttl is None else [*fields, command.ttl.total_seconds()]
    if isinstance(command, Sleep):
        return ["sleep", command.duration.total_seconds()]
    if isinstance(command, SettleToken):
        ttl = None if command.ttl is None else command.ttl.total_seconds()
        asked = ["settle_token", command.promise_id, list(command.outcomes), ttl]
        # Only when given: a token for the worker itself keeps the digest it always had.
        return asked if command.acts_for is None else [*asked, command.acts_for]
    return None  # Now, Random: nothing asked


def args_digest(command: StepCommand) -> str | None:
    """The digest of what `command` asks, or None: it asks nothing (`now`, `random`),
    opted out (`check_args=False`), or its arguments cannot be encoded canonically."""
    if isinstance(command, Now | Random) or not command.check_args:
        return None
    fields = _fields(command)
    if fields is None:
        return None
    try:
        text = canonical_json(fields)
    except (TypeError, ValueError) as exc:
        _log.debug(
            "%s: its arguments have no canonical encoding (%s); they are not recorded "
            "and not checked on replay",
            fields[0],
            exc,
        )
        return None
    return hashlib.blake2b(text.encode("ascii"), digest_size=DIGEST_LENGTH // 2).hexdigest()


def describe_args(command: StepCommand, limit: int = 80) -> str:
    """The arguments a command asks for, shortened for a message, e.g. `('auto_reply',)`."""
    fields = _fields(command)
    if fields is None:
        return ""
    if isinstance(command, RunStep | StartWorkflow):
        text = repr(tuple(command.args))
    elif isinstance(command, Sleep):
        text = str(command.duration)
    else:
        assert isinstance(command, CreatePromise)
        asked = {"id": command.id, "timeout": command.timeout}
        if command.schema is not None:
            asked["schema"] = command.schema.name
        text = ", ".join(f"{k}={v}" for k, v in asked.items() if v is not None) or "defaults"
    return text if len(text) <= limit else text[: limit - 3] + "..."
