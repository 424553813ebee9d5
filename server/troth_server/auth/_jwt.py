"""Signed JWTs (PyJWT): keys from a PEM or secret file or a JWKS file, claims -> Principal.

Accepted algorithms: `HS256` (a shared secret), `RS256` (an RSA public key),
`EdDSA` (an Ed25519 public key); each key is used only with the algorithm of
its kind, so a public key can never be taken for an HMAC secret, and `none`
is never accepted. Required claims: `sub` (the principal's name), `exp`, and
`iss` / `aud` when the server is given an issuer / audience. troth's own
claims: `troth_roles` (a list, or a space-separated string, of roles),
`troth_groups` (task groups a worker may poll) and `troth_prefixes` (id
prefixes); and the principal's permission names from the claim
`--jwt-permissions-claim` names (default `permissions`, as several identity
providers write it): a list of strings, or one space-separated string as OAuth's
`scope` (`--jwt-permissions-claim scope` takes a token's scopes for permissions).
`exp`, `nbf` and `iat` must be JSON numbers, and `sub` no reserved
name (`troth:...`, `settle-token:...`). A verified token is cached until its `exp`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from troth.errors import Reason
from troth_server.auth._errors import AuthConfigError, Unauthenticated
from troth_server.auth._tokens import principal_from

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from troth_server.domain.access import Principal

SUPPORTED_ALGORITHMS = ("HS256", "RS256", "EdDSA")
LEEWAY_S = 30
"""Clock skew allowed on `exp`, `nbf` and `iat`."""
ROLES_CLAIM, GROUPS_CLAIM, PREFIXES_CLAIM = "troth_roles", "troth_groups", "troth_prefixes"
PERMISSIONS_CLAIM = "permissions"
"""The claim a principal's permission names are read from unless configured otherwise."""
_NOT_PERMISSION_CLAIMS = frozenset(
    {"sub", "exp", "nbf", "iat", "iss", "aud", "jti", ROLES_CLAIM, GROUPS_CLAIM, PREFIXES_CLAIM}
)


def permissions_claim_problem(name: str) -> str | None:
    """What is wrong with `name` as the permissions claim (None: nothing)."""
    if not name or name != name.strip():
        return "name a JWT claim (such as permissions or scope), without surrounding spaces"
    if name in _NOT_PERMISSION_CLAIMS:
        return f"{name!r} is a claim of its own meaning; name the claim that lists permissions"
    return None


_MIN_SECRET_BYTES = 32
_MAX_TIME = 2**53
"""Times beyond it are no instant (and a float cannot hold them exactly)."""
_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class _Key:
    kid: str | None
    algorithm: str
    key: Any


def _pem_key(data: bytes, path: Path) -> _Key:
    try:
        if b"BEGIN CERTIFICATE" in data:
            public: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            public = load_pem_public_key(data)
    except ValueError as exc:
        raise AuthConfigError(f"the JWT key file {path} is not a PEM public key: {exc}") from None
    if isinstance(public, rsa.RSAPublicKey):
        return _Key(None, "RS256", public)
    if isinstance(public, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return _Key(None, "EdDSA", public)
    raise AuthConfigError(
        f"the JWT key file {path} holds a {type(public).__name__}; troth takes RSA (RS256) "
        "or Ed25519 (EdDSA) public keys, or an HS256 secret"
    )


def _key_file(path: Path) -> _Key:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"cannot read the JWT key file {path}: {exc.strerror}") from None
    if b"-----BEGIN" in data:
        if b"PRIVATE KEY" in data:
            raise AuthConfigError(
                f"the JWT key file {path} holds a private key; give the server the public key"
            )
        return _pem_key(data, path)
    secret = data.strip()
    if len(secret) < _MIN_SECRET_BYTES:
        raise AuthConfigError(
            f"the JWT key file {path} is an HS256 secret of {len(secret)} bytes; "
            f"use at least {_MIN_SECRET_BYTES} random bytes"
        )
    return _Key(None, "HS256", secret)


def _jwks_file(path: Path) -> list[_Key]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        key_set = jwt.PyJWKSet.from_dict(document)
    except OSError as exc:
        raise AuthConfigError(f"cannot read the JWKS file {path}: {exc.strerror}") from None
    except (ValueError, jwt.PyJWTError) as exc:
        raise AuthConfigError(f"the JWKS file {path} is not a usable JWK set: {exc}") from None
    keys = [
        _Key(jwk.key_id, jwk.algorithm_name, jwk.key)
        for jwk in key_set.keys
        if jwk.algorithm_name in SUPPORTED_ALGORITHMS
    ]
    if not keys:
        raise AuthConfigError(
            f"the JWKS file {path} has no key for {', '.join(SUPPORTED_ALGORITHMS)}"
        )
    return keys


def parse_algorithms(text: str) -> tuple[str, ...]:
    """`--jwt-algorithms`: a comma-separated subset of HS256, RS256, EdDSA."""
    names = tuple(a.strip() for a in text.split(",") if a.strip())
    wrong = [a for a in names if a not in SUPPORTED_ALGORITHMS]
    if wrong or not names:
        raise ValueError(
            f"{', '.join(wrong) or text!r}: the JWT algorithms troth accepts are "
            f"{', '.join(SUPPORTED_ALGORITHMS)}"
        )
    return names


def _invalid(message: str) -> Unauthenticated:
    return Unauthenticated(Reason.TOKEN_INVALID, f"the JWT is not accepted: {message}")


NUMERIC_CLAIMS = ("exp", "nbf", "iat")
"""Claims that are times: JSON numbers of seconds since 1970 (RFC 7519 NumericDate)."""


def _check_numeric_claims(token: str) -> None:
    """Refuse a JWT whose `exp`, `nbf` or `iat` is not a JSON number: PyJWT takes a
    string of digits (`"9999999999"`) for one, and `true` for 1. Read before the
    signature is checked: it only refuses, and names the claim however the rest fails."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return  # the verified decode says what is wrong with it
    for name in NUMERIC_CLAIMS:
        if name in claims and not _is_time(claims[name]):
            value = claims[name]
            what = "a number out of range" if _is_number(value) else f"a {type(value).__name__}"
            raise _invalid(
                f"its {name!r} claim is {what}, not a number of seconds since 1970 (a JSON "
                "number, RFC 7519 NumericDate); have the issuer write it as one"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 <= value < _MAX_TIME  # NaN compares false


def _claim_list(claims: dict[str, Any], name: str) -> object:
    value = claims.get(name)
    return value.split() if isinstance(value, str) else value


class JwtVerifier:
    """Verifies JWTs with a fixed set of keys; caches verified tokens until `exp`."""

    def __init__(
        self,
        keys: Sequence[_Key],
        *,
        issuer: str | None = None,
        audience: str | None = None,
        algorithms: Sequence[str] = SUPPORTED_ALGORITHMS,
        permissions_claim: str = PERMISSIONS_CLAIM,
    ) -> None:
        self._permissions_claim = permissions_claim
        self._keys = [k for k in keys if k.algorithm in algorithms]
        if not self._keys:
            raise AuthConfigError(
                f"no JWT key can be used with --jwt-algorithms {','.join(algorithms)} "
                f"(the keys are for {', '.join(sorted({k.algorithm for k in keys}))})"
            )
        self.algorithms = tuple(sorted({k.algorithm for k in self._keys}))
        self._issuer = issuer
        self._audience = audience
        required = ["exp", "sub"] + (["iss"] if issuer else []) + (["aud"] if audience else [])
        self._options: Any = {"require": required}
        self._cache: dict[bytes, tuple[Principal, float]] = {}

    @classmethod
    def load(
        cls,
        *,
        key_file: Path | None,
        jwks_file: Path | None,
        issuer: str | None,
        audience: str | None,
        algorithms: Sequence[str] = SUPPORTED_ALGORITHMS,
        permissions_claim: str = PERMISSIONS_CLAIM,
    ) -> JwtVerifier:
        keys: list[_Key] = []
        if key_file is not None:
            keys.append(_key_file(key_file))
        if jwks_file is not None:
            keys += _jwks_file(jwks_file)
        return cls(
            keys,
            issuer=issuer,
            audience=audience,
            algorithms=algorithms,
            permissions_claim=permissions_claim,
        )

    def cached(self, token: str) -> Principal | None:
        hit = self._cache.get(hashlib.sha256(token.encode()).digest())
        if hit is not None and time.time() < hit[1] + LEEWAY_S:
            return hit[0]
        return None

    def expires_at(self, token: str) -> float | None:
        """The end of a verified token's acceptance (`exp` plus the leeway, epoch
        seconds); None when it is not in the cache (verify it)."""
        hit = self._cache.get(hashlib.sha256(token.encode()).digest())
        return None if hit is None else hit[1] + LEEWAY_S

    def verify(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated(
                Reason.CREDENTIALS_MALFORMED,
                "the bearer token looks like a JWT but does not decode",
            ) from None
        alg = header.get("alg")
        if alg not in self.algorithms:
            raise _invalid(
                f"algorithm {str(alg)[:20]!r} is not accepted; this server accepts "
                f"{', '.join(self.algorithms)}"
            )
        kid = header.get("kid")
        keys = [
            k for k in self._keys if k.algorithm == alg and (kid is None or k.kid in (kid, None))
        ]
        if not keys:
            raise Unauthenticated(
                Reason.TOKEN_UNKNOWN,
                f"no {alg} key with kid {str(kid)[:80]!r} is known to this server",
            )
        _check_numeric_claims(token)
        claims = self._decode(token, alg, keys)
        try:
            principal = principal_from(
                claims.get("sub"),
                _claim_list(claims, ROLES_CLAIM),
                _claim_list(claims, GROUPS_CLAIM),
                _claim_list(claims, PREFIXES_CLAIM),
                "the JWT's claims:",
                permissions=_claim_list(claims, self._permissions_claim),
                permissions_where=f"the JWT's {self._permissions_claim!r} claim",
            )
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        self._remember(token, principal, float(claims["exp"]))
        return principal

    def _decode(self, token: str, alg: str, keys: list[_Key]) -> dict[str, Any]:
        failure: Unauthenticated | None = None
        for key in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    key.key,
                    algorithms=[alg],
                    audience=self._audience,
                    issuer=self._issuer,
                    leeway=LEEWAY_S,
                    options=self._options,
                )
                return claims
            except jwt.ExpiredSignatureError:
                raise Unauthenticated(
                    Reason.TOKEN_EXPIRED, "the JWT has expired (its exp is past); get a new one"
                ) from None
            except jwt.InvalidSignatureError:
                failure = _invalid("its signature does not verify with this server's keys")
            except jwt.InvalidAudienceError:
                if self._audience is None:
                    raise _invalid("it names an aud, and this server expects none") from None
                raise _invalid(f"its aud is not {self._audience!r}") from None
            except jwt.InvalidIssuerError:
                raise _invalid(f"its iss is not {self._issuer!r}") from None
            except jwt.MissingRequiredClaimError as exc:
                raise _invalid(f"it has no {exc.claim!r} claim") from None
            except jwt.ImmatureSignatureError:
                raise _invalid("it is not valid yet (nbf or iat in the future)") from None
            except jwt.PyJWTError as exc:
                raise _invalid(type(exc).__name__) from None
        assert failure is not None
        raise failure

    def _remember(self, token: str, principal: Principal, exp: float) -> None:
        if len(self._cache) >= _CACHE_SIZE:
            now = time.time()
            self._cache = {k: v for k, v in self._cache.items() if v[1] + LEEWAY_S > now}
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
        self._cache[hashlib.sha256(token.encode()).digest()] = (principal, exp)
