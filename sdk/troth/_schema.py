"""Typed decisions: the JSON Schema of `ctx.promise(schema=...)`, and decoding into its type.

A schema is given as a JSON Schema dict, a dataclass, or a pydantic model
class. The SDK sends the JSON Schema to the server (which checks every resolve
value against it) and, for a class, turns the decoded JSON back into an
instance at the workflow's `yield`. pydantic is used only when the user passes
a pydantic model; the SDK does not import it.

Dataclass fields may be `str`, `int`, `float`, `bool`, `None`, `Any`, an
`Enum`, a `Literal`, `X | None`, `list[X]`, `tuple[X, ...]`, `dict[str, X]`
or another dataclass; a field with a default is optional. Anything else is a
`TypeError` at the `ctx.promise` call, saying to pass a JSON Schema dict.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DecisionSchema", "decision_schema", "to_json_compatible"]


@dataclass(frozen=True, slots=True)
class DecisionSchema:
    """A promise's schema as sent to the server, and how to type its decoded value.

    Attributes:
        json_schema: The JSON Schema.
        decode: Turns the decoded JSON value into the declared type; None for a dict schema.
        name: What the schema describes, for messages (the class name, or "schema").
    """

    json_schema: Mapping[str, Any]
    decode: Callable[[Any], Any] | None
    name: str


def decision_schema(schema: Mapping[str, Any] | type) -> DecisionSchema:
    """Read `ctx.promise(schema=...)`: a JSON Schema dict, a dataclass or a pydantic model.

    Raises:
        TypeError: `schema` is none of these, or a dataclass field has a type
            that has no JSON Schema here.
    """
    if isinstance(schema, Mapping):
        return DecisionSchema(dict(schema), None, "schema")
    if isinstance(schema, type) and dataclasses.is_dataclass(schema):
        return DecisionSchema(
            _dataclass_schema(schema), lambda value: _from_json(schema, value), schema.__name__
        )
    if isinstance(schema, type) and callable(getattr(schema, "model_json_schema", None)):
        model: Any = schema
        return DecisionSchema(model.model_json_schema(), model.model_validate, schema.__name__)
    raise TypeError(
        f"schema must be a JSON Schema dict, a dataclass or a pydantic model class, not {schema!r}"
    )


def to_json_compatible(value: Any) -> Any:
    """`json.dumps(default=...)`: dataclass instances and pydantic models as plain JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# --- dataclass -> JSON Schema ------------------------------------------------------


def _dataclass_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        properties[f.name] = _type_schema(hints[f.name], f"{cls.__name__}.{f.name}")
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    schema: dict[str, Any] = {
        "title": cls.__name__,
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


_SCALARS: Mapping[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _type_schema(hint: Any, where: str) -> dict[str, Any]:
    if hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [member.value for member in hint]}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_schema(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(arg, where) for arg in args]}
    if origin in (list, tuple) and (origin is list or (len(args) == 2 and args[1] is ...)):
        return {"type": "array", "items": _type_schema(args[0], where) if args else {}}
    if origin is dict and (not args or args[0] is str):
        values = _type_schema(args[1], where) if args else {}
        return {"type": "object", "additionalProperties": values}
    raise TypeError(
        f"{where}: type {hint!r} has no JSON Schema here; use str, int, float, bool, "
        "an Enum, a Literal, X | None, list[X], dict[str, X] or a dataclass, or pass "
        "schema= a JSON Schema dict"
    )


# --- JSON -> dataclass -------------------------------------------------------------


def _from_json(hint: Any, value: Any) -> Any:
    """Build `hint` from a JSON value the server already checked against its schema."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise TypeError(f"expected a JSON object for {hint.__name__}, got {value!r}")
        hints = typing.get_type_hints(hint)
        known = {f.name for f in dataclasses.fields(hint)}
        return hint(**{k: _from_json(hints[k], v) for k, v in value.items() if k in known})
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if value is None and arg is type(None):
                return None
            if arg is not type(None):
                try:
                    return _from_json(arg, value)
                except (TypeError, ValueError):
                    continue
        return value
    if origin is list and args and isinstance(value, list):
        return [_from_json(args[0], item) for item in value]
    if origin is tuple and args and isinstance(value, list):
        return tuple(_from_json(args[0], item) for item in value)
    if origin is dict and len(args) == 2 and isinstance(value, dict):
        return {k: _from_json(args[1], v) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
