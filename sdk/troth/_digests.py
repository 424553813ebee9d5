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
| `promise` | explicit id or null; timeout in seconds or null; JSON Schema;  |
|           | (version 2) title; message; its own tags; approvers (**)       |
| `start`   | workflow name; args; explicit id or null; ttl in seconds (*)   |
| `sleep`   | duration in seconds                                            |

`now` and `random` take no arguments: they get no digest. A child's group and
`start` versus `rpc` are not part of it.
(*) Only when given, so a start without a ttl keeps the digest it had before ttls.
(**) Their `permissions` only when listed, so a policy without keeps the digest it
had before permissions (a history recorded then replays as it did).

Versions. A recorded digest says which fields it covers, so that a history is
always checked against what it recorded and never against more: version 1 is
16 bare hex characters (every digest recorded before versions, and today every
command's but a promise's, whose fields have not changed); version n > 1 is
`v<n>:` and 16 hex characters. A promise is recorded in version 2, which adds
what its human sees and what a workflow may branch on (title, message, tags,
approvers) to version 1's id, timeout and schema. Replay computes the command's
digest in the version the step recorded (`recorded_version`): a promise
recorded in version 1 is still checked on its id, timeout and schema only, and
one recorded in a version this SDK does not know (a newer SDK's) is not checked.

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from troth._commands import (
    TAG_KIND,
    CreatePromise,
    Kind,
    Now,
    Random,
    ReadState,
    RunStep,
    SettleToken,
    Sleep,
    StartWorkflow,
    StepCommand,
    WriteState,
)
from troth._schema import to_json_compatible

if TYPE_CHECKING:
    from troth._approvers import Approvers
    from troth._promise import Promise

__all__ = [
    "DIGEST_LENGTH",
    "DIGEST_VERSION",
    "args_digest",
    "canonical_json",
    "describe_args",
    "describe_recorded",
    "digest_version",
    "recorded_version",
]

DIGEST_LENGTH = 16
"""Hex characters in a digest (BLAKE2b with an 8-byte digest), after its version prefix."""
DIGEST_VERSION = 2
"""The newest digest version this SDK records (a promise's); see the module docstring."""
_HEX = frozenset("0123456789abcdef")

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


def _fields(command: StepCommand, version: int) -> list[Any] | None:
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
        first: list[Any] = ["promise", command.id, timeout, schema]
        if version < 2:
            return first
        return [*first, command.title, command.message, dict(command.tags), _approvers(command)]
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


def _approvers(command: CreatePromise) -> dict[str, Any] | None:
    approvers = command.approvers
    if approvers is None:
        return None
    fields: dict[str, Any] = {
        "principals": list(approvers.principals),
        "roles": list(approvers.roles),
        "not_requester": approvers.not_requester,
        "distinct": approvers.distinct,
        "quorum": approvers.quorum,
    }
    if approvers.permissions:  # only when listed: older digests stay as they were
        fields["permissions"] = list(approvers.permissions)
    return fields


def digest_version(command: StepCommand) -> int:
    """The version a new step of this command records: 2 for a promise, else 1 (the
    others' fields are version 1's, and their digests stay the bare hex they were)."""
    return 2 if isinstance(command, CreatePromise) else 1


def recorded_version(digest: str) -> int | None:
    """The version of a recorded `troth:args` value (1: bare hex; `v<n>:<hex>`: n), or
    None for a value this SDK cannot check (a newer version, or not a digest)."""
    version, colon, hexdigits = digest.rpartition(":")
    if not colon:
        number = 1
    elif version.startswith("v") and version[1:].isdigit() and version[1:].isascii():
        number = int(version[1:])
        if number < 2:  # version 1 is written bare
            return None
    else:
        return None
    if number > DIGEST_VERSION or len(hexdigits) != DIGEST_LENGTH or not set(hexdigits) <= _HEX:
        return None
    return number


def args_digest(command: StepCommand, version: int | None = None) -> str | None:
    """The digest of what `command` asks, as recorded in `troth:args` (in `version`,
    default the one a new step records), or None: it asks nothing (`now`,
    `random`), opted out (`check_args=False`), or its arguments cannot be encoded
    canonically."""
    if isinstance(command, Now | Random | ReadState | WriteState) or not command.check_args:
        return None
    version = digest_version(command) if version is None else version
    fields = _fields(command, version)
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
    digest = hashlib.blake2b(text.encode("ascii"), digest_size=DIGEST_LENGTH // 2).hexdigest()
    return digest if version == 1 else f"v{version}:{digest}"


def describe_args(command: StepCommand, limit: int | None = None) -> str:
    """The arguments a command asks for, shortened for a message (to `limit`, default
    80 characters, a promise's 200), e.g. `('auto_reply',)`; a promise's as
    `title='...', tags={...}` (what its human sees)."""
    if limit is None:
        limit = 200 if isinstance(command, CreatePromise) else 80
    fields = _fields(command, digest_version(command))
    if fields is None:
        return ""
    if isinstance(command, RunStep | StartWorkflow):
        text = repr(tuple(command.args))
    elif isinstance(command, Sleep):
        text = str(command.duration)
    elif isinstance(command, CreatePromise):
        asked: dict[str, Any] = {"id": command.id, "timeout": command.timeout}
        if command.schema is not None:
            asked["schema"] = command.schema.name
        text = _promise_text(
            asked, command.title, command.message, command.tags, command.approvers, limit
        )
    else:
        text = repr(fields[1:])
    return _shorten(text, limit)


def describe_recorded(promise: Promise, limit: int = 200) -> str:
    """What a recorded `promise` step asked its human, as `describe_args` says it of
    a command (its title, message, own tags and approvers; "" for another kind)."""
    if promise.tags.get(TAG_KIND) != Kind.PROMISE:
        return ""
    own = {k: v for k, v in promise.tags.items() if not k.startswith("troth:")}
    if not (promise.title or promise.message or own or promise.approvers):
        return ""
    return _shorten(
        _promise_text({}, promise.title, promise.message, own, promise.approvers, limit), limit
    )


def _promise_text(
    asked: dict[str, Any],
    title: str,
    message: str,
    tags: Mapping[str, str],
    approvers: Approvers | None,
    limit: int,
) -> str:
    if title:
        asked["title"] = repr(_shorten(title, limit // 2))
    if message:
        asked["message"] = repr(_shorten(message, limit // 4))
    if tags:
        asked["tags"] = dict(sorted(tags.items()))
    if approvers is not None:
        asked["approvers"] = approvers
    return ", ".join(f"{k}={v}" for k, v in asked.items() if v is not None) or "defaults"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
