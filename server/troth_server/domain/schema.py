"""Typed decisions: checking a promise's JSON Schema, and a resolve value against it.

A promise may carry a JSON Schema (draft 2020-12 unless the schema names
another draft with `$schema`). The server checks the schema when the promise
is created and every resolve value against it before the settle is applied, so
a gateway that sends a malformed decision is told which field is wrong and the
workflow never sees it. Rejections carry a reason, not a decision: they are
not checked.

Every check is bounded (`SchemaBounds`, `domain._bounded`): schema and value
depth, RE2 for patterns, a step budget, linear `uniqueItems` over a bounded
number of items; past a bound the answer is INVALID_ARGUMENT naming the limit.
The service runs value checks off the writer and off the event loop; the
writer only compares the schema it sees with the one that was checked
(`promise.settle`). Pure functions; validators are cached by schema text
because the same few schemas (one per approval kind) come back on every settle.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson
from jsonschema import exceptions as jsonschema_errors
from jsonschema import validators
from referencing import Registry
from referencing.exceptions import Unresolvable

from troth_server.domain._bounded import (
    MESSAGE_LIMIT,
    OverBudget,
    SchemaBounds,
    Uncheckable,
    bounded_class,
    clip,
    quoting_briefly,
    run_bounded,
    why_not_re2,
)
from troth_server.domain.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Iterable

    from jsonschema.protocols import Validator

    from troth_server.domain.promise import Payload

__all__ = ["SchemaBounds", "check_schema", "check_value", "field_path"]

_JSON_TYPES = ("application/json", "")
DEFAULT_BOUNDS = SchemaBounds()


def check_schema(text: str, bounds: SchemaBounds = DEFAULT_BOUNDS) -> str:
    """Validate a promise's schema (JSON text); return it unchanged.

    Raises:
        InvalidArgument: on field `schema` (or where in it, `schema.properties.a`),
            when it is not JSON, not a valid schema, or past a bound.
    """
    _validator(text, bounds)
    return text


def check_value(schema: str, value: Payload, bounds: SchemaBounds = DEFAULT_BOUNDS) -> None:
    """Check a resolve value against the promise's schema.

    Raises:
        InvalidArgument: on the failing field's path, e.g. `value.channel` or
            `value.tools[2].name` (`value` itself when the whole value is wrong,
            or when the check went past one of `bounds`).
    """
    content_type = value.headers.get("content-type", "")
    if content_type.split(";")[0].strip() not in _JSON_TYPES:
        raise InvalidArgument(
            "value",
            f"the promise has a schema, so its value must be JSON, not {content_type!r}: "
            "the server checks it against the schema, which it cannot do on an encrypted "
            "or otherwise opaque value; send it with the JSON codec (content-type "
            "application/json), or give the promise no schema and check the value where "
            "it is decoded",
        )
    if not value.data:
        raise InvalidArgument(
            "value", "the promise has a schema, so resolving it needs a value that matches it"
        )
    decoded = _parse(value.data, "value", bounds.max_value_depth, "--max-value-depth")
    try:
        validator = _validator(schema, bounds)
    except InvalidArgument as exc:
        # Stored before the server's current rules (a pattern RE2 refuses, say).
        raise InvalidArgument(
            "value",
            f"cannot be checked: the promise's schema is not accepted by this server "
            f"({exc.message}); reject the promise instead",
        ) from None
    try:
        error = run_bounded(
            bounds, lambda: jsonschema_errors.best_match(validator.iter_errors(decoded))
        )
    except (OverBudget, Uncheckable) as exc:
        raise InvalidArgument("value", exc.message) from None
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
            f"{_message(error)} (schema rule {_rule(error)}); send a value that "
            "matches the promise's schema (GetPromise shows it)",
        )


def field_path(root: str, parts: Iterable[str | int]) -> str:
    """`value`, `value.channel`, `value.tools[2].name`: where in the value an error is."""
    path = root
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _message(error: jsonschema_errors.ValidationError) -> str:
    """jsonschema's message, with the failing value it quotes first cut short."""
    message = error.message
    quoted = repr(error.instance)
    if len(quoted) > MESSAGE_LIMIT and message.startswith(quoted):
        message = clip(quoted) + message[len(quoted) :]
    return message if len(message) <= 4 * MESSAGE_LIMIT else clip(message)


def _rule(error: jsonschema_errors.ValidationError) -> str:
    return clip("/".join(["#", *(str(p) for p in error.absolute_schema_path)]))


def _parse(data: bytes | str, field: str, max_depth: int, flag: str) -> Any:
    try:
        decoded = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "recursion" in str(exc).lower():  # orjson's own bound, 1024 levels
            raise InvalidArgument(field, _too_deep(max_depth, flag)) from None
        raise InvalidArgument(field, f"is not valid JSON ({exc})") from None
    if _depth_over(decoded, max_depth):
        raise InvalidArgument(field, _too_deep(max_depth, flag))
    return quoting_briefly(decoded)


def _too_deep(max_depth: int, flag: str) -> str:
    return f"nests deeper than {max_depth} levels (limit {flag}); send a flatter one"


def _depth_over(value: Any, max_depth: int) -> bool:
    """Whether arrays and objects nest more than `max_depth` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _nested_draft(schema: dict[str, Any]) -> list[str | int] | None:
    """Where a `$schema` names a draft below the top (None if nowhere): jsonschema
    would switch there to that draft's own validator, outside the bounds."""
    stack: list[tuple[Any, list[str | int]]] = [(schema, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            if path and isinstance(node.get("$schema"), str):
                return [*path, "$schema"]
            stack.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, [*path, i]) for i, v in enumerate(node))
    return None


class _Cache:
    """The last `size` validators built, by (schema text, bounds); thread-safe."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, SchemaBounds], Validator] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, SchemaBounds]) -> Validator | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[str, SchemaBounds], validator: Validator) -> None:
        with self._lock:
            self._items[key] = validator
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_CACHE = _Cache(256)


def _validator(text: str, bounds: SchemaBounds) -> Validator:
    found = _CACHE.get((text, bounds))
    if found is None:
        found = _build(text, bounds)
        _CACHE.put((text, bounds), found)
    return found


def _build(text: str, bounds: SchemaBounds) -> Validator:
    schema = _parse(text, "schema", bounds.max_schema_depth, "--max-schema-depth")
    if not isinstance(schema, dict):
        raise InvalidArgument(
            "schema", f"must be a JSON object (a JSON Schema), not {type(schema).__name__}"
        )
    if (nested := _nested_draft(schema)) is not None:
        raise InvalidArgument(
            field_path("schema", nested),
            "names a draft below the top of the schema; name the draft only at the top "
            "(`$schema` of the whole schema), where it applies to every part",
        )
    cls = bounded_class(validators.validator_for(schema, default=validators.Draft202012Validator))
    # The metaschema check costs what the schema's size (bounded) makes it cost; its
    # `format: regex` is RE2's compile, so a pattern RE2 cannot run is refused here.
    meta = validators.validator_for(cls.META_SCHEMA, default=cls)
    checker = meta(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)
    error = next(iter(checker.iter_errors(schema)), None)
    if error is not None:
        where = field_path("schema", error.absolute_path)
        if error.validator == "format" and error.validator_value == "regex":
            raise InvalidArgument(where, why_not_re2(str(error.instance), str(error.cause)))
        raise InvalidArgument(where, f"is not a valid JSON Schema: {clip(error.message)}")
    # No registry beyond the schema itself: a $ref to a metaschema (or anything
    # else) would be checked by a validator outside the bounds.
    validator: Validator = cls(schema, registry=Registry())
    return validator
