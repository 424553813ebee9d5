"""Settle tokens: single-promise credentials that a link can carry (issue 11 part 4),
acting for a principal (DESIGN §4 rule 16, issue 26).

Pure: no I/O, no clock, no randomness (the caller passes `now` and the token's
random id). A token is an HMAC-SHA256, under one of the server's secret keys,
over the promise's identity (its id and instance), the outcomes it allows, its
expiry, the key id and the principal it acts for (its name, roles and the
permissions it held that the promise's policy lists)::

    st2.<key id>.<payload>.<mac>        (each part URL-safe base64 without padding,
                                         the key id as it is: [A-Za-z0-9_-]{1,32})

    payload = token id (12 bytes) | expiry, ms (8 bytes, big-endian)
              | outcomes (1 byte: 1 resolve, 2 reject) | roles (1 byte, `_ROLE_BITS`)
              | instance (8 bytes, big-endian) | promise id length (2 bytes)
              | promise id (UTF-8) | principal (UTF-8)
    mac     = HMAC-SHA256(key, "troth-settle-token/2" NUL key id NUL payload)

A token that carries permissions is `st3`: its payload goes on after the principal
with each permission name behind a NUL (`| NUL permission`...; neither a principal
nor a permission name holds one), and its MAC is keyed with "troth-settle-token/3".
A token without is `st2`, as before permissions (links already sent keep working,
and a server of before permissions still takes the tokens it could read); a server
of before permissions refuses an `st3` as malformed rather than read it wrong.

A settle with a token is the settle of the principal it acts for: the service
checks the promise's approver policy against that principal (its name and the
roles it held at mint; none for a named approver a gateway minted it for), and
the promise records `<principal> via settle-token <key id>:<token id>` as its
`settled_by` (`settled_by`; `settler` reads the principal back, wherever
settlers are compared).

`verify` refuses a token with a distinct error for each way it can be wrong:
malformed, of the older format (`st1`, which acted for nobody), unknown key,
bad signature (forged, or anything it says altered), expired, for another
promise, outcome not allowed. What needs the stored promise is `check_use`, a
comparison the writer makes: for an earlier promise of the same id (pruned and
created again: another instance), already used (the promise was settled with this
token) and void (the promise was cancelled, with its workflow).

Keys: a keys file (`--settle-token-keys`) holds several keys, one active (it
signs); the others still verify, so a key can be rotated without breaking the
links already sent. `parse_keys` reads its JSON text::

    {"active": "k2", "keys": {"k1": "<base64url, >= 32 bytes>", "k2": "..."}}
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import struct
from dataclasses import dataclass
from hashlib import sha256
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain.access import (
    RESERVED_NAME_PREFIXES,
    Principal,
    Role,
    permission_problem,
)
from troth_server.domain.errors import DomainError
from troth_server.domain.promise import PromiseState

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from troth_server.domain.promise import Promise

PREFIX = "st2"
PERMISSIONS_PREFIX = "st3"
"""A token whose principal carries permissions (see the module docstring)."""
_MACS = {PREFIX: b"troth-settle-token/2", PERMISSIONS_PREFIX: b"troth-settle-token/3"}
OLD_PREFIXES = frozenset({"st1"})
"""Formats of older servers: refused with `TokenOutdated` (they acted for nobody)."""
TOKEN_ID_BYTES = 12
MIN_KEY_BYTES = 32
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_HEAD = struct.Struct(">12sQBBQH")
_OUTCOME_BITS = {PromiseState.RESOLVED: 1, PromiseState.REJECTED: 2}
OUTCOMES = frozenset(_OUTCOME_BITS)
_ROLE_BITS = {Role.WORKER: 1, Role.GATEWAY: 2, Role.OPERATOR: 4, Role.ADMIN: 8}
MAX_INSTANCE = 2**63 - 1
"""Instances are drawn from 1..MAX_INSTANCE (a signed 64-bit column); 0 is a promise
created before instances were recorded, or settled before it was created."""
OLD_SETTLED_BY_PREFIX = "settle-token:"
"""`settled_by` of a promise settled with an `st1` token: `settle-token:<key>:<id>`."""
VIA = " via settle-token "
"""Between the principal and `<key id>:<token id>` in the `settled_by` of a token's settle."""
_NAME = re.compile(r"[\x21-\x7e]{1,256}")
_SETTLED_VIA = re.compile(r"([\x21-\x7e]+) via settle-token [A-Za-z0-9_-]{1,32}:[A-Za-z0-9_-]+")


class SettleTokenError(DomainError):
    """A settle token that does not allow this settle; `reason` says why."""


class TokenMalformed(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_MALFORMED

    def __init__(self, why: str) -> None:
        super().__init__(f"settle_token: is not a settle token ({why}); send it as minted")


class UnknownKey(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_UNKNOWN_KEY

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"settle_token: signed with key {key_id!r}, which this server does not have "
            "(retired, or never one of its keys); ask for a new link",
            key_id=key_id,
        )


class TokenOutdated(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_OUTDATED

    def __init__(self, prefix: str) -> None:
        super().__init__(
            f"settle_token: is of the format {prefix!r}, minted by an older server, which "
            "acted for no principal; ask for a new link",
            format=prefix,
        )


class BadSignature(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_BAD_SIGNATURE

    def __init__(self) -> None:
        super().__init__(
            "settle_token: its signature does not match (forged, or its promise, outcomes, "
            "expiry or principal altered); nothing was changed"
        )


class TokenExpired(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_EXPIRED

    def __init__(self, promise_id: str, expire_time: int) -> None:
        super().__init__(
            f"settle_token: for promise {promise_id!r} expired at {expire_time} ms since the "
            "epoch; ask for a new link",
            promise_id=promise_id,
        )


class WrongPromise(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_WRONG_PROMISE

    def __init__(self, token_promise: str, promise_id: str) -> None:
        super().__init__(
            f"settle_token: is for promise {token_promise!r}, not {promise_id!r}",
            promise_id=promise_id,
        )


class OutcomeNotAllowed(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_OUTCOME_NOT_ALLOWED

    def __init__(self, promise_id: str, outcome: PromiseState, allowed: Collection[str]) -> None:
        super().__init__(
            f"settle_token: for promise {promise_id!r} allows {', '.join(sorted(allowed))}, "
            f"not {outcome.value}",
            promise_id=promise_id,
        )


class PromiseReplaced(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_PROMISE_REPLACED

    def __init__(self, promise_id: str) -> None:
        super().__init__(
            f"settle_token: is for an earlier promise {promise_id!r}, which is gone (pruned); "
            "the promise of that id now is another one; ask for a new link",
            promise_id=promise_id,
        )


class TokenUsed(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_USED

    def __init__(self, promise: Promise) -> None:
        super().__init__(
            f"settle_token: promise {promise.id!r} was already {promise.state.value.lower()} "
            "with this token; a token works once",
            promise_id=promise.id,
            state=promise.state.value,
        )


class TokenVoid(SettleTokenError):
    reason = Reason.SETTLE_TOKEN_VOID

    def __init__(self, promise: Promise) -> None:
        super().__init__(
            f"settle_token: promise {promise.id!r} was cancelled (its workflow was cancelled "
            "or ended), which voids every link to it",
            promise_id=promise.id,
            state=promise.state.value,
        )


class TokensOff(DomainError):
    """A token minted or presented on a server that has no settle-token keys."""

    reason = Reason.SETTLE_TOKENS_OFF

    def __init__(self) -> None:
        super().__init__(
            "settle tokens are off on this server: start it with --settle-token-keys FILE "
            "(python -m troth_server.settle_keys new k1 > FILE makes one)"
        )


class MintForAnother(DomainError):
    """A token asked for another principal (`acts_for`) by one without the gateway role."""

    reason = Reason.ROLE_NOT_ALLOWED

    def __init__(self, acts_for: str) -> None:
        super().__init__(
            f"acts_for: only a principal with the gateway role mints a settle token for "
            f"another principal ({acts_for!r}); admin does not imply it (an administrator "
            "may do everything but stand in for an approver). Leave acts_for empty to mint "
            "one that acts for yourself",
            field="acts_for",
        )


class KeysInvalid(ValueError):
    """A keys file that cannot be used; the message says what to fix."""


@dataclass(frozen=True, slots=True)
class Keyring:
    """The server's token keys: every one verifies, `active` signs."""

    keys: Mapping[str, bytes]
    active: str

    def __post_init__(self) -> None:
        if self.active not in self.keys:
            raise KeysInvalid(f"the active key {self.active!r} is not among the keys")
        for key_id, secret in self.keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise KeysInvalid(f"key id {key_id!r}: use 1 to 32 of A-Z a-z 0-9 _ -")
            if len(secret) < MIN_KEY_BYTES:
                raise KeysInvalid(f"key {key_id!r} has {len(secret)} bytes; use {MIN_KEY_BYTES}+")


def parse_keys(text: str) -> Keyring:
    """The keyring a keys file's JSON text describes (see the module docstring)."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise KeysInvalid(f"is not JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("keys"), dict):
        raise KeysInvalid('needs {"active": "<key id>", "keys": {"<key id>": "<secret>"}}')
    active = body.get("active")
    if not isinstance(active, str):
        raise KeysInvalid('needs "active": the id of the key that signs new tokens')
    keys: dict[str, bytes] = {}
    for key_id, secret in body["keys"].items():
        if not isinstance(secret, str):
            raise KeysInvalid(f"key {key_id!r}: the secret must be base64url text")
        try:
            keys[key_id] = _unb64(secret)
        except ValueError:
            raise KeysInvalid(f"key {key_id!r}: the secret is not base64url") from None
    return Keyring(keys, active)


@dataclass(frozen=True, slots=True)
class SettleToken:
    """What a verified token grants, and whom it acts for."""

    key_id: str
    token_id: str
    """URL-safe base64 of the token's random id: recorded on the settle it makes."""
    promise_id: str
    instance: int
    """The `Promise.instance` it was minted for: a promise of the same id created
    later (after a prune) is another one, and the token is void for it."""
    outcomes: frozenset[PromiseState]
    expire_time: int
    principal: str
    """The name of the principal it acts for: the settle is that principal's."""
    roles: frozenset[Role]
    """That principal's roles when the token was minted (none for a named approver a
    gateway minted it for: the server cannot know them)."""
    permissions: frozenset[str] = frozenset()
    """The permissions that principal held when the token was minted, of those the
    promise's policy lists (the guard mints it so: a link carries no more than its
    promise's decision needs); none for a named approver."""

    @property
    def settled_by(self) -> str:
        """The settled_by of a promise settled with this token: the principal, the means."""
        return f"{self.principal}{VIA}{self.key_id}:{self.token_id}"

    def acting(self) -> Principal:
        """The principal the approver policy is checked against for a settle with it."""
        return Principal(name=self.principal, roles=self.roles, permissions=self.permissions)


def mint(
    keyring: Keyring,
    promise: tuple[str, int],
    outcomes: Collection[PromiseState],
    expire_time: int,
    token_id: bytes,
    acts_for: Principal,
) -> tuple[str, SettleToken]:
    """A token for `promise` (its id and instance), acting for `acts_for` (its name,
    roles and permissions: pass only those the promise's policy lists), signed with
    the active key; `token_id` is random."""
    promise_id, instance = promise
    if len(token_id) != TOKEN_ID_BYTES:
        raise ValueError(f"token_id must be {TOKEN_ID_BYTES} bytes")
    allowed = frozenset(outcomes)
    if not allowed or not allowed <= OUTCOMES:
        raise ValueError(f"outcomes must be RESOLVED and/or REJECTED, not {sorted(allowed)}")
    if not 0 <= instance <= MAX_INSTANCE:
        raise ValueError(f"instance must be 0 to {MAX_INSTANCE}")
    if not is_principal_name(acts_for.name):
        raise ValueError("the principal's name must be 1 to 256 printable ASCII characters")
    roles = frozenset(r for r in acts_for.roles if r in _ROLE_BITS)
    id_bytes = promise_id.encode()
    head = _HEAD.pack(
        token_id,
        expire_time,
        sum(_OUTCOME_BITS[o] for o in allowed),
        sum(_ROLE_BITS[r] for r in roles),
        instance,
        len(id_bytes),
    )
    permissions = sorted(acts_for.permissions)
    if any(permission_problem(p) is not None for p in permissions):
        raise ValueError("the principal's permissions must be permission names")
    payload = head + id_bytes + acts_for.name.encode()
    payload += b"".join(b"\0" + p.encode() for p in permissions)
    prefix = PERMISSIONS_PREFIX if permissions else PREFIX
    key_id = keyring.active
    mac = _mac(keyring.keys[key_id], key_id, payload, prefix)
    token = ".".join((prefix, key_id, _b64(payload), _b64(mac)))
    granted = SettleToken(
        key_id,
        _b64(token_id),
        promise_id,
        instance,
        allowed,
        expire_time,
        acts_for.name,
        roles,
        frozenset(permissions),
    )
    return token, granted


def verify(
    keyring: Keyring, token: str, promise_id: str, outcome: PromiseState, now: int
) -> SettleToken:
    """What `token` grants, if it allows settling `promise_id` as `outcome` at `now`
    (the promise's instance is the writer's to compare: `check_use`)."""
    parts = token.split(".")
    if len(parts) == 4 and parts[0] in OLD_PREFIXES:
        raise TokenOutdated(parts[0])
    if len(parts) != 4 or parts[0] not in _MACS:
        raise TokenMalformed(f"expected 4 dot-separated parts starting {PREFIX!r}")
    prefix, key_id, payload_text, mac_text = parts
    if not _KEY_ID.fullmatch(key_id):
        raise TokenMalformed("the key id has characters outside A-Z a-z 0-9 _ -")
    try:
        payload, mac = _unb64(payload_text), _unb64(mac_text)
    except ValueError:
        raise TokenMalformed("a part is not URL-safe base64") from None
    if len(mac) != sha256().digest_size or len(payload) <= _HEAD.size:
        raise TokenMalformed("a part has the wrong length")
    secret = keyring.keys.get(key_id)
    if secret is None:
        raise UnknownKey(key_id)
    if not hmac.compare_digest(mac, _mac(secret, key_id, payload, prefix)):
        raise BadSignature()
    raw_id, expire_time, bits, role_bits, instance, id_length = _HEAD.unpack_from(payload)
    rest = payload[_HEAD.size :]
    try:  # signed by us, so never wrong; but never trust a decode
        token_promise = rest[:id_length].decode()
        principal, *permissions = rest[id_length:].decode().split("\0")
    except UnicodeDecodeError:
        raise TokenMalformed("the promise id or the principal is not UTF-8") from None
    if len(rest) <= id_length or not token_promise or not principal:
        raise TokenMalformed("the promise id or the principal is missing")
    if bool(permissions) != (prefix == PERMISSIONS_PREFIX):
        raise TokenMalformed(f"a {prefix!r} token with the permissions of the other format")
    allowed = frozenset(o for o, bit in _OUTCOME_BITS.items() if bits & bit)
    roles = frozenset(r for r, bit in _ROLE_BITS.items() if role_bits & bit)
    granted = SettleToken(
        key_id,
        _b64(raw_id),
        token_promise,
        instance,
        allowed,
        expire_time,
        principal,
        roles,
        frozenset(permissions),
    )
    if token_promise != promise_id:
        raise WrongPromise(token_promise, promise_id)
    if outcome not in allowed:
        raise OutcomeNotAllowed(promise_id, outcome, [o.value for o in allowed])
    if now >= expire_time:
        raise TokenExpired(promise_id, expire_time)
    return granted


def check_use(promise: Promise, token: SettleToken, idempotency_key: str | None) -> bool:
    """The writer's part: whether a settle with `token` may go on to the promise's
    approver policy and state machine. False: a repeat of the token's own settle (same
    idempotency key), answered with the settled promise. Raises `PromiseReplaced`,
    `TokenUsed`, `TokenVoid`."""
    if promise.instance != token.instance:
        raise PromiseReplaced(promise.id)
    if promise.settle_token_id == token.token_id:
        if idempotency_key and idempotency_key == promise.idempotency_key_for_settle:
            return False
        raise TokenUsed(promise)
    if promise.state is PromiseState.REJECTED_CANCELED:
        raise TokenVoid(promise)
    return True


def is_principal_name(name: str) -> bool:
    """Whether a token may act for `name`: 1 to 256 printable ASCII characters, no
    space (as every authenticated principal's), so that `settled_by` reads back, and
    none of the reserved prefixes (`domain.access.RESERVED_NAME_PREFIXES`)."""
    return _NAME.fullmatch(name) is not None and not name.startswith(RESERVED_NAME_PREFIXES)


def settler(settled_by: str | None) -> str | None:
    """The principal a settle acted for, from what the promise records as `settled_by`:
    the name itself for a direct settle, the name before `via settle-token ...` for a
    token's, None for none (not settled by a principal, or by an `st1` token, which
    acted for nobody). Settlers are compared by it (distinct quorums), never raw."""
    if settled_by is None:
        return None
    via = _SETTLED_VIA.fullmatch(settled_by)
    if via is not None:
        return via[1]
    return None if settled_by.startswith(OLD_SETTLED_BY_PREFIX) else settled_by


def _mac(secret: bytes, key_id: str, payload: bytes, prefix: str = PREFIX) -> bytes:
    message = _MACS[prefix] + b"\0" + key_id.encode() + b"\0" + payload
    return hmac.new(secret, message, sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text):
        raise ValueError("not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not base64url") from None
    if _b64(data) != text:
        # One encoding per value: unused trailing bits set make another text of the
        # same bytes, which would make a token malleable.
        raise ValueError("not canonical base64url")
    return data
