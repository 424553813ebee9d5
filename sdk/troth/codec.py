"""Payloads and the codecs that turn Python values into them and back.

A `Payload` is what the server stores for a promise's `param` and `value`:
opaque bytes plus string headers. A `Codec` decides the bytes. `JsonCodec`, the
default, writes compact UTF-8 JSON and marks it `content-type:
application/json`, so other languages and `grpcurl` can read it; plug in your
own (encryption, msgpack...) with `Client(codec=...)`. Users never base64.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from troth._schema import to_json_compatible

_CONTENT_TYPE = "content-type"
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Payload:
    """Opaque bytes plus string headers, as stored on the server.

    Attributes:
        headers: Free-form string headers; codecs use `content-type`.
        data: The encoded bytes. Empty together with empty headers means "no
            value" (what a `None` param or value is sent as).

    .. versionadded:: 0.1.0
    """

    headers: Mapping[str, str] = field(default_factory=dict)
    data: bytes = b""

    def __post_init__(self) -> None:
        # Copy so that a caller mutating its dict cannot change a "frozen" payload.
        object.__setattr__(self, "headers", dict(self.headers))

    @property
    def content_type(self) -> str | None:
        """The `content-type` header (looked up case-insensitively), if any."""
        for key, value in self.headers.items():
            if key.lower() == _CONTENT_TYPE:
                return value
        return None

    @property
    def is_json(self) -> bool:
        """Whether the content-type names JSON (`application/json`, `...+json`, parameters ok)."""
        content_type = self.content_type
        if content_type is None:
            return False
        media_type = content_type.split(";", 1)[0].strip().lower()
        return media_type == _JSON or (
            media_type.startswith("application/") and media_type.endswith("+json")
        )

    @property
    def is_empty(self) -> bool:
        """True when the payload carries neither data nor headers."""
        return not self.data and not self.headers


@runtime_checkable
class Codec(Protocol):
    """Turns Python values into payloads and back.

    .. versionadded:: 0.1.0
    """

    def encode(self, value: Any) -> Payload:
        """Encode `value`; raise `TypeError` or `ValueError` if it cannot be."""
        ...

    def decode(self, payload: Payload) -> Any:
        """Decode a payload this codec (or another writer) produced."""
        ...


class JsonCodec:
    """The default codec: compact UTF-8 JSON with `content-type: application/json`.

    Decoding is lenient about what other writers send: an empty payload is
    `None`, and a payload whose content-type is not JSON (or absent) comes back
    as its raw `bytes`, untouched.

    .. versionadded:: 0.1.0
    """

    def encode(self, value: Any) -> Payload:
        """Encode `value` as compact JSON.

        Raises:
            TypeError: `value` holds something JSON cannot represent.
            ValueError: `value` holds NaN or infinity, which JSON forbids.
        """
        try:
            text = json.dumps(
                value,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
                default=to_json_compatible,
            )
        except TypeError as exc:
            raise TypeError(
                f"JsonCodec cannot encode {type(value).__name__!r} values ({exc}); pass "
                "JSON-compatible data (dict, list, str, int, float, bool, None, a dataclass "
                "or pydantic model) or give "
                "the Client a codec that handles this type"
            ) from exc
        except ValueError as exc:
            raise ValueError(
                f"JsonCodec cannot encode {exc}: JSON has no NaN or infinity; "
                "send them as strings or None"
            ) from exc
        return Payload(headers={_CONTENT_TYPE: _JSON}, data=text.encode())

    def decode(self, payload: Payload) -> Any:
        """Decode a payload: JSON to Python values, empty to `None`, other types to `bytes`.

        Raises:
            ValueError: The payload says it is JSON but is not valid JSON.
        """
        if not payload.data:
            return None
        if not payload.is_json:
            return payload.data
        try:
            return json.loads(payload.data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(
                f"payload is marked {payload.content_type!r} but is not valid JSON ({exc}); "
                "whoever wrote it used a different encoding: read `payload.data` directly"
            ) from exc
