"""Typed decisions: checking a promise's JSON Schema, and a resolve value against it.

A promise may carry a JSON Schema (draft 2020-12 unless the schema names
another draft with `$schema`). The server checks the schema when the promise
is created and every resolve value against it before the settle is applied, so
a gateway that sends a malformed decision is told which field is wrong and the
workflow never sees it. Rejections carry a reason, not a decision: they are
not checked. Pure functions; validators are cached by schema text because the
same few schemas (one per approval kind) come back on every settle.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import orjson
from jsonschema import exceptions as jsonschema_errors
from jsonschema import validators
from referencing.exceptions import Unresolvable

from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterable

    from jsonschema.protocols import Validator

    from troth_server.domain.promise import Payload

_JSON_TYPES = ("application/json", "")


def check_schema(text: str) -> str:
    """Validate a promise's schema (JSON text); return it unchanged.

    Raises:
        InvalidArgument: on field `schema`, when it is not JSON or not a valid schema.
    """
    _validator(text)
    return text


def check_value(schema: str, value: Payload) -> None:
    """Check a resolve value against the promise's schema.

    Raises:
        InvalidArgument: on the failing field's path, e.g. `value.channel` or
            `value.tools[2].name` (`value` itself when the whole value is wrong).
    """
    content_type = value.headers.get("content-type", "")
    if content_type.split(";")[0].strip() not in _JSON_TYPES:
        raise InvalidArgument(
            "value",
            f"the promise has a schema, so its value must be JSON, not {content_type!r}; "
            "send it with the JSON codec (content-type application/json)",
        )
    if not value.data:
        raise InvalidArgument(
            "value", "the promise has a schema, so resolving it needs a value that matches it"
        )
    try:
        decoded = orjson.loads(value.data)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument("value", f"is not valid JSON ({exc})") from None
    try:
        error = jsonschema_errors.best_match(_validator(schema).iter_errors(decoded))
    except Unresolvable as exc:
        # Found only now: a $ref is followed only where the value leads the check.
        raise InvalidArgument(
            "value",
            f"cannot be checked: the promise's schema refers to {exc.ref!r}, which the "
            "server cannot resolve (it fetches no remote schemas); reject the promise "
            "instead, and give such promises a self-contained schema",
        ) from None
    if error is not None:
        raise InvalidArgument(
            field_path("value", error.absolute_path),
            f"{error.message} (schema rule {_rule(error)}); send a value that matches "
            "the promise's schema (GetPromise shows it)",
        )


def field_path(root: str, parts: Iterable[str | int]) -> str:
    """`value`, `value.channel`, `value.tools[2].name`: where in the value an error is."""
    path = root
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _rule(error: jsonschema_errors.ValidationError) -> str:
    return "/".join(["#", *(str(p) for p in error.absolute_schema_path)])


@functools.lru_cache(maxsize=256)
def _validator(text: str) -> Validator:
    try:
        schema: Any = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument("schema", f"is not valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise InvalidArgument(
            "schema", f"must be a JSON object (a JSON Schema), not {type(schema).__name__}"
        )
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema_errors.SchemaError as exc:
        where = field_path("schema", exc.absolute_path)
        raise InvalidArgument(where, f"is not a valid JSON Schema: {exc.message}") from None
    return cls(schema)
