"""A form from a promise's JSON Schema, and the value a filled form stands for: pure.

`form_for(schema)` gives the fields a human fills in (strings, numbers,
integers, booleans, enums, nested objects flattened to dotted names), or a
raw-JSON form when the schema says more than such fields can (arrays, `oneOf`,
`$ref`, patterns of properties...) or there is no schema. `value_from(form,
data)` turns the submitted strings back into the JSON value; the server still
checks it against the schema, so this only has to be right, not complete.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["APPROVAL_BOOLEANS", "RAW_FIELD", "Field", "Form", "FormError", "form_for", "value_from"]

Kind = Literal["string", "number", "integer", "boolean", "enum"]

RAW_FIELD = "troth.raw"
"""The name of the raw-JSON textarea (a dot-free schema property never has it)."""

APPROVAL_BOOLEANS = frozenset(
    {"approved", "approve", "approval", "accepted", "accept", "ok", "confirmed", "allowed",
     "granted", "signed_off"}
)  # fmt: skip
"""Names of the decision's own yes/no field: without a schema default its checkbox starts
ticked, so that Approve on an untouched form sends `true` (the person pressed Approve);
un-ticking it sends `false` on purpose. Top-level properties only."""

_SCALARS = frozenset({"string", "number", "integer", "boolean"})
_UNDERSTOOD = frozenset(
    {"type", "title", "description", "default", "enum", "const", "examples", "format",
     "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
     "exclusiveMaximum", "multipleOf", "$schema", "$id", "properties", "required",
     "additionalProperties"}
)  # fmt: skip
"""Keywords the fields can stand for (constraints are left to the server's check)."""


class FormError(ValueError):
    """A submitted field that does not make a value: which one and why, for the human."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Field:
    """One input: `name` is the dotted path of the property (`address.city`)."""

    name: str
    kind: Kind
    label: str
    required: bool = False
    description: str = ""
    choices: tuple[str, ...] = ()
    """For an enum: each allowed value as JSON text (what the form posts)."""
    default: str = ""
    """The initial input: text, JSON text for an enum, "on" for a checked box."""


@dataclass(frozen=True, slots=True)
class Form:
    """The fields, or `raw` (one JSON textarea) when the schema needs more."""

    fields: tuple[Field, ...] = field(default_factory=tuple)
    raw: bool = False
    raw_default: str = ""


def form_for(schema: Mapping[str, Any] | None) -> Form:
    """The form for `schema`; a raw-JSON form for none or one fields cannot express."""
    if not schema:
        return Form(raw=True, raw_default="true")
    fields = _object_fields(schema, "", True)
    if fields is None:
        return Form(raw=True, raw_default=_example(schema))
    return Form(fields=tuple(fields))


def _object_fields(schema: Mapping[str, Any], prefix: str, present: bool) -> list[Field] | None:
    if schema.get("type") != "object" or not _plain(schema):
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        return None
    if not isinstance(extra, bool):
        return None
    fields: list[Field] = []
    for name, sub in properties.items():
        if not isinstance(name, str) or not name or "." in name or not isinstance(sub, Mapping):
            return None
        path = f"{prefix}{name}"
        needed = present and name in required
        if sub.get("type") == "object":
            nested = _object_fields(sub, f"{path}.", needed)
            if nested is None:
                return None
            fields.extend(nested)
            continue
        one = _field(path, sub, needed)
        if one is None:
            return None
        fields.append(one)
    return fields


def _plain(schema: Mapping[str, Any]) -> bool:
    return all(key in _UNDERSTOOD for key in schema)


def _field(path: str, schema: Mapping[str, Any], required: bool) -> Field | None:
    if not _plain(schema):
        return None
    label = str(schema.get("title") or path.rsplit(".", 1)[-1].replace("_", " "))
    description = str(schema.get("description", ""))
    default = schema.get("default")
    choices = schema.get("enum")
    if "const" in schema:
        choices = [schema["const"]]
    if choices is not None:
        if not isinstance(choices, list) or not choices:
            return None
        if not all(v is None or isinstance(v, str | int | float | bool) for v in choices):
            return None
        texts = tuple(json.dumps(v) for v in choices)
        initial = json.dumps(default) if default in choices else ""
        return Field(path, "enum", label, required, description, texts, initial)
    kind = schema.get("type")
    if kind not in _SCALARS:
        return None
    if kind == "boolean":
        ticked = bool(default) if "default" in schema else path in APPROVAL_BOOLEANS
        return Field(path, "boolean", label, False, description, (), "on" if ticked else "")
    initial = "" if default is None or isinstance(default, dict | list) else str(default)
    return Field(path, kind, label, required, description, (), initial)


def _example(schema: Mapping[str, Any]) -> str:
    default = schema.get("default")
    return json.dumps(default) if default is not None else ""


def value_from(form: Form, data: Mapping[str, str]) -> Any:
    """The JSON value the submitted `data` (field name -> text) stands for.

    Raises:
        FormError: A required field left empty, a number that is not one, an
            enum choice not offered, raw text that is not JSON.
    """
    if form.raw:
        text = data.get(RAW_FIELD, "").strip()
        if not text:
            raise FormError("value", "is empty; type a JSON value, e.g. true or {}")
        try:
            return json.loads(text)
        except ValueError as exc:
            raise FormError("value", f"is not JSON ({exc})") from None
    value: dict[str, Any] = {}
    for one in form.fields:
        parsed = _parse(one, data.get(one.name, ""))
        if parsed is _ABSENT:
            continue
        target = value
        *parents, leaf = one.name.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[leaf] = parsed
    return value


_ABSENT: Any = object()


def _parse(one: Field, text: str) -> Any:
    if one.kind == "boolean":
        return text == "on"
    text = text.strip() if one.kind != "string" else text
    if text == "":
        if one.required:
            raise FormError(one.label, "is required")
        return _ABSENT
    if one.kind == "string":
        return text
    if one.kind == "enum":
        if text not in one.choices:
            raise FormError(one.label, f"must be one of {', '.join(one.choices)}")
        return json.loads(text)
    if one.kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise FormError(one.label, f"{text!r} is not a whole number") from None
    try:
        number = float(text)
    except ValueError:
        raise FormError(one.label, f"{text!r} is not a number") from None
    if not math.isfinite(number):
        raise FormError(one.label, f"{text!r} is not a finite number")
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number
