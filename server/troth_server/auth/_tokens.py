"""The token file: principals with hashed secrets, and bearer tokens checked against it.

A token is `troth_<key id>_<secret>`. The key id (lowercase letters and digits)
picks the one entry to check, so a call never costs more than one scrypt, and
only the first time: a verified token is cached (key id -> SHA-256 of the
token, compared with `hmac.compare_digest`), so a repeated token costs a dict
lookup. A key id the file does not hold, and a token refused before (the last
`REFUSED_PER_KEY` refused per key id), are refused by `cached` with no scrypt
at all; only a new secret for a known key id reaches `verify`, which the server
runs on a small bounded pool of its own (`auth/_verifier_pool.py`). The file
holds only `hashlib.scrypt` hashes, each with its own salt and its parameters
recorded:

```toml
[[principal]]
name = "billing-worker"
roles = ["worker"]
groups = ["billing"]
prefixes = ["acme-"]          # optional: the ids it may see and touch
permissions = ["payouts:approve"]  # optional: what approver policies' permissions match
key_id = "k4f9c2a7d1e08b3"
secret_hash = "scrypt$n=16384,r=8,p=1$<salt, base64>$<hash, base64>"
```

`troth tokens new` mints an entry and its token (`mint`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
import tomllib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth.errors import Reason
from troth_server.auth._errors import AuthConfigError, Unauthenticated
from troth_server.domain.access import (
    ANY_GROUP,
    MAX_PERMISSIONS,
    Principal,
    Role,
    check_permissions,
    reserved_prefix,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path

TOKEN_PREFIX = "troth_"
KEY_ID = re.compile(r"^[a-z0-9]{8,64}$")
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
"""scrypt's cost: about 16 MiB and tens of milliseconds per check, paid once per token."""
_MAXMEM = 256 * 1024 * 1024
"""Room for the dearest parameters a token file may name (OpenSSL's default is 32 MiB)."""
_HASH = re.compile(r"^scrypt\$n=(\d+),r=(\d+),p=(\d+)\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$")
_MAX_NAME = 256
_NAME_CHARS = re.compile(r"^[\x21-\x7e]+$")
REFUSED_PER_KEY = 64
"""Digests of refused tokens remembered per key id (the oldest forgotten first), so that
a repeated bad token costs no scrypt: a flood of fresh secrets for one key id pushes
out that key id's own entries only, never another's."""

_SCRYPT_SLOTS = threading.BoundedSemaphore(2)
"""At most two scrypt checks at once in the process, whoever asks: a flood of bad tokens
cannot take every core (the server's own pool runs fewer than this)."""


def check_name(name: object, where: str) -> str:
    """A principal name: 1 to 256 printable ASCII characters, not `troth:...` nor
    `settle-token:...` (`domain.access.RESERVED_NAME_PREFIXES`)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a principal name is required")
    if len(name) > _MAX_NAME or not _NAME_CHARS.fullmatch(name):
        raise ValueError(f"{where}: {name[:60]!r} must be 1 to 256 printable ASCII characters")
    if (prefix := reserved_prefix(name)) is not None:
        raise ValueError(
            f"{where}: {name[:60]!r}: names starting with {prefix!r} are reserved for the "
            "server's own records; name the principal otherwise"
        )
    return name


def parse_roles(values: Iterable[str], where: str) -> frozenset[Role]:
    roles = set()
    for value in values:
        try:
            roles.add(Role(value))
        except ValueError:
            known = ", ".join(r.value for r in Role)
            raise ValueError(f"{where}: unknown role {value!r}; the roles are {known}") from None
    return frozenset(roles)


def parse_strings(values: object, where: str) -> tuple[str, ...]:
    if values is None:
        return ()
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{where}: must be a list of non-empty strings")
    return tuple(values)


def principal_from(
    name: object,
    roles: object,
    groups: object,
    prefixes: object,
    where: str,
    *,
    permissions: object = None,
    permissions_where: str | None = None,
) -> Principal:
    """A `Principal` from the fields of a token-file entry or the claims of a JWT."""
    role_names = parse_strings(roles, f"{where} roles")
    if not role_names:
        raise ValueError(f"{where}: give at least one role (worker, gateway, operator, admin)")
    permissions_at = permissions_where or f"{where} permissions"
    if permissions is not None and not isinstance(permissions, list):
        raise ValueError(
            f"{permissions_at}: must be a list of permission names (a JWT's claim may also "
            "be one space-separated string)"
        )
    return Principal(
        name=check_name(name, f"{where} name"),
        roles=parse_roles(role_names, f"{where} roles"),
        groups=frozenset(parse_strings(groups, f"{where} groups")),
        prefixes=parse_strings(prefixes, f"{where} prefixes"),
        permissions=check_permissions(permissions or (), permissions_at, MAX_PERMISSIONS),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def hash_secret(secret: str, *, n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """`secret_hash` for a token file: scrypt with a fresh 16-byte salt, parameters recorded."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=32)
    return f"scrypt$n={n},r={r},p={p}${_b64(salt)}${_b64(digest)}"


@dataclass(frozen=True, slots=True)
class _SecretHash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    @classmethod
    def parse(cls, text: object, where: str) -> _SecretHash:
        match = _HASH.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"{where}: secret_hash must look like scrypt$n=16384,r=8,p=1$<salt>$<hash> "
                "(as `troth tokens new` prints it)"
            )
        n, r, p = (int(match.group(i)) for i in (1, 2, 3))
        if n < 2 or n & (n - 1) or n > 2**20 or not 1 <= r <= 32 or not 1 <= p <= 16:
            raise ValueError(f"{where}: scrypt parameters n={n},r={r},p={p} are out of range")
        try:
            salt = base64.b64decode(match.group(4), validate=True)
            digest = base64.b64decode(match.group(5), validate=True)
        except ValueError:
            raise ValueError(f"{where}: secret_hash has invalid base64") from None
        return cls(n, r, p, salt, digest)

    def matches(self, secret: str) -> bool:
        with _SCRYPT_SLOTS:
            got = hashlib.scrypt(
                secret.encode(),
                salt=self.salt,
                n=self.n,
                r=self.r,
                p=self.p,
                maxmem=_MAXMEM,
                dklen=len(self.digest),
            )
        return hmac.compare_digest(got, self.digest)


@dataclass(frozen=True, slots=True)
class _Entry:
    principal: Principal
    secret_hash: _SecretHash


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def split_token(token: str) -> tuple[str, str]:
    """`troth_<key id>_<secret>` -> (key id, secret); CREDENTIALS_MALFORMED otherwise."""
    key_id, sep, secret = token[len(TOKEN_PREFIX) :].partition("_")
    if not sep or not KEY_ID.fullmatch(key_id) or not secret:
        raise Unauthenticated(
            Reason.CREDENTIALS_MALFORMED,
            "the bearer token is not a troth token (troth_<key id>_<secret>) nor a JWT; "
            "use the token `troth tokens new` printed",
        )
    return key_id, secret


class TokenTable:
    """The parsed token file, with its caches of verified and of refused tokens.

    `cached` runs on the event loop, `verify` on the verification pool's threads: the
    caches are guarded by a lock, held for dict operations only, never for a scrypt.
    """

    def __init__(self, entries: Mapping[str, _Entry]) -> None:
        self._entries = dict(entries)
        self._verified: dict[str, tuple[bytes, Principal]] = {}
        self._refused: dict[str, OrderedDict[bytes, None]] = {}
        """key id -> digests of its tokens refused lately (the key ids are the file's:
        an unknown one is refused before anything is remembered)."""
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        """Parse a token file; `AuthConfigError` names the file, the entry and the problem."""
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise AuthConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise AuthConfigError(f"the token file {path} is not valid TOML: {exc}") from None
        try:
            return cls(_entries(document))
        except ValueError as exc:
            raise AuthConfigError(f"token file {path}: {exc}") from None

    def __len__(self) -> int:
        return len(self._entries)

    def cached(self, key_id: str, token: str) -> Principal | None:
        """The principal of a token verified before (no scrypt); None when it must be
        `verify`-ed. Raises `Unauthenticated` with no scrypt for a key id this file does
        not hold (TOKEN_UNKNOWN) and for a token refused before (TOKEN_INVALID)."""
        if key_id not in self._entries:
            raise _unknown(key_id)
        digest = token_digest(token)
        hit = self._verified.get(key_id)
        if hit is not None and hmac.compare_digest(hit[0], digest):
            return hit[1]
        with self._lock:
            refused = self._refused.get(key_id)
            if refused is not None and digest in refused:
                refused.move_to_end(digest)
                raise _wrong_secret(key_id)
        return None

    def keep_verified(self, before: TokenTable) -> None:
        """After a reload: the tokens `before` verified stay verified here when their
        entry kept its secret hash (no scrypt again), now with this file's principal
        (a narrowed grant holds at once); a removed or re-keyed entry's token is not."""
        for key_id, (digest, _principal) in before._verified.items():
            entry, old = self._entries.get(key_id), before._entries.get(key_id)
            if entry is not None and old is not None and entry.secret_hash == old.secret_hash:
                self._verified[key_id] = (digest, entry.principal)

    def verify(self, key_id: str, secret: str, token: str) -> Principal:
        """Check a token against its entry (one scrypt, unless `cached` would have
        answered); cache the answer, either way."""
        principal = self.cached(key_id, token)
        if principal is not None:
            return principal
        entry = self._entries[key_id]  # `cached` refused a key id it does not hold
        digest = token_digest(token)
        if not entry.secret_hash.matches(secret):
            self._remember_refused(key_id, digest)
            raise _wrong_secret(key_id)
        self._verified[key_id] = (digest, entry.principal)
        return entry.principal

    def _remember_refused(self, key_id: str, digest: bytes) -> None:
        with self._lock:
            refused = self._refused.setdefault(key_id, OrderedDict())
            refused[digest] = None
            refused.move_to_end(digest)
            while len(refused) > REFUSED_PER_KEY:
                refused.popitem(last=False)


def _unknown(key_id: str) -> Unauthenticated:
    return Unauthenticated(
        Reason.TOKEN_UNKNOWN,
        f"no token with key id {key_id!r} is known to this server (revoked, or "
        "from another server's token file)",
        key_id=key_id,
    )


def _wrong_secret(key_id: str) -> Unauthenticated:
    return Unauthenticated(
        Reason.TOKEN_INVALID,
        f"the token with key id {key_id!r} has the wrong secret",
        key_id=key_id,
    )


def _entries(document: Mapping[str, Any]) -> dict[str, _Entry]:
    unknown = set(document) - {"principal"}
    if unknown:
        raise ValueError(f"unknown top-level keys {sorted(unknown)}; entries are [[principal]]")
    rows = document.get("principal", [])
    if not isinstance(rows, list):
        raise ValueError("entries must be [[principal]] tables")
    entries: dict[str, _Entry] = {}
    names: set[str] = set()
    fields = {"name", "roles", "groups", "prefixes", "permissions", "key_id", "secret_hash"}
    for i, row in enumerate(rows):
        where = f"[[principal]] #{i + 1}"
        if isinstance(row, dict) and isinstance(row.get("name"), str):
            where += f" ({row['name']!r})"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: must be a table")
        extra = set(row) - fields
        if extra:
            raise ValueError(
                f"{where}: unknown keys {sorted(extra)}; the keys are {sorted(fields)}"
            )
        principal = principal_from(
            row.get("name"),
            row.get("roles"),
            row.get("groups"),
            row.get("prefixes"),
            where,
            permissions=row.get("permissions"),
        )
        key_id = row.get("key_id")
        if not isinstance(key_id, str) or not KEY_ID.fullmatch(key_id):
            raise ValueError(f"{where}: key_id must be 8 to 64 lowercase letters and digits")
        if key_id in entries:
            raise ValueError(f"{where}: key_id {key_id!r} is used twice")
        if principal.name in names:
            raise ValueError(f"{where}: the name {principal.name!r} is used twice")
        names.add(principal.name)
        entries[key_id] = _Entry(principal, _SecretHash.parse(row.get("secret_hash"), where))
    return entries


@dataclass(frozen=True, slots=True)
class Minted:
    """A new token-file entry (`entry`, TOML with the hash only) and its token, shown once."""

    entry: str
    token: str


def _toml_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_toml_string(v) for v in values) + "]"


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def mint(
    name: str,
    roles: Iterable[str],
    groups: Iterable[str] = (),
    prefixes: Iterable[str] = (),
    permissions: Iterable[str] = (),
) -> Minted:
    """A fresh key id and secret for `name`; the entry holds only the secret's scrypt hash."""
    role_list, group_list, prefix_list = list(roles), list(groups), list(prefixes)
    permission_list = list(permissions)
    principal = principal_from(
        name, role_list, group_list, prefix_list, "the new token", permissions=permission_list
    )
    if Role.WORKER in principal.roles and not principal.groups:
        raise ValueError(
            f"a worker token needs --groups: the task groups it may poll (or {ANY_GROUP!r})"
        )
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    lines = [
        "[[principal]]",
        f"name = {_toml_string(name)}",
        f"roles = {_toml_list(role_list)}",
    ]
    if group_list:
        lines.append(f"groups = {_toml_list(group_list)}")
    if prefix_list:
        lines.append(f"prefixes = {_toml_list(prefix_list)}")
    if permission_list:
        lines.append(f"permissions = {_toml_list(permission_list)}")
    lines += [f'key_id = "{key_id}"', f'secret_hash = "{hash_secret(secret)}"']
    return Minted("\n".join(lines) + "\n", f"{TOKEN_PREFIX}{key_id}_{secret}")
