"""An encrypting codec: the troth server stores ciphertext and never sees a value.

`EncryptingCodec` wraps another codec (default `JsonCodec`): it encodes a value
with it, then seals the result (its headers and bytes) with AES-256-GCM under
a key only the clients and workers hold. The server stores and returns the
sealed payload verbatim (`content-type: application/vnd.troth.aes-gcm`, the key
id in `troth-key-id`). Decoding opens it and hands the inner payload back to
the wrapped codec; a payload that is not sealed (one the server wrote itself,
such as the reason a workflow's step was cancelled, or a value an unencrypted
client sent) is decoded by the wrapped codec as it is.

It uses the `cryptography` package (`pip install cryptography`), which the
troth SDK does not depend on: the SDK ships the hook (`Client(codec=...)`, and
a `Worker` uses its client's codec), this file is one way to use it.

    key = EncryptingCodec.new_key()               # 32 random bytes: keep them secret
    codec = EncryptingCodec({"k1": key})
    client = Client("127.0.0.1:7070", codec=codec)

Keys rotate as settle keys do: pass every key still needed to read old values,
and `active` names the one new values are sealed with.

What the server can no longer do with an encrypted value: check it against a
JSON Schema (a promise with a schema refuses a sealed resolve with
INVALID_ARGUMENT, field `value`); read it in `SearchPromises` filters (there
are none on values) or show it in `troth promises get`. Tags, titles, messages
and ids are not payloads: they stay in clear, so keep secrets out of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from troth import Codec, JsonCodec, Payload

CONTENT_TYPE = "application/vnd.troth.aes-gcm"
KEY_ID_HEADER = "troth-key-id"
_NONCE_BYTES = 12
_AAD = b"troth-payload-v1"


class EncryptingCodec:
    """Seals every payload of `inner` with AES-256-GCM; opens sealed payloads on decode."""

    def __init__(
        self, keys: Mapping[str, bytes], active: str | None = None, inner: Codec | None = None
    ) -> None:
        if not keys:
            raise ValueError("EncryptingCodec needs at least one key")
        self._keys = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self._active = active if active is not None else next(iter(keys))
        if self._active not in self._keys:
            raise ValueError(f"the active key {self._active!r} is not among the keys")
        self._inner: Codec = inner if inner is not None else JsonCodec()

    @staticmethod
    def new_key() -> bytes:
        """A fresh 256-bit key."""
        return AESGCM.generate_key(bit_length=256)

    def encode(self, value: Any) -> Payload:
        inner = self._inner.encode(value)
        # The inner headers are sealed with the bytes: the server sees neither.
        plain = json.dumps(dict(inner.headers), sort_keys=True).encode() + b"\n" + inner.data
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._keys[self._active].encrypt(nonce, plain, _AAD)
        return Payload(
            headers={"content-type": CONTENT_TYPE, KEY_ID_HEADER: self._active},
            data=nonce + sealed,
        )

    def decode(self, payload: Payload) -> Any:
        if payload.content_type != CONTENT_TYPE:
            return self._inner.decode(payload)  # not sealed: written by the server, or in clear
        key_id = payload.headers.get(KEY_ID_HEADER, "")
        key = self._keys.get(key_id)
        if key is None:
            raise ValueError(f"payload sealed with key {key_id!r}, which this codec does not have")
        nonce, sealed = payload.data[:_NONCE_BYTES], payload.data[_NONCE_BYTES:]
        plain = key.decrypt(nonce, sealed, _AAD)  # InvalidTag if altered or the wrong key
        headers, _, data = plain.partition(b"\n")
        return self._inner.decode(Payload(headers=json.loads(headers), data=data))
