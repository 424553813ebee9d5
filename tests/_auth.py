"""Test support for authentication: token files, JWT keys and tokens, raw calls with metadata."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

from troth_server.auth import mint

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from pathlib import Path


@dataclass(frozen=True)
class Grant:
    name: str
    roles: tuple[str, ...]
    groups: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    permissions: tuple[str, ...] = ()


def write_token_file(path: Path, grants: Iterable[Grant]) -> dict[str, str]:
    """A token file with one entry per grant; returns name -> token."""
    tokens: dict[str, str] = {}
    entries = []
    for grant in grants:
        minted = mint(grant.name, grant.roles, grant.groups, grant.prefixes, grant.permissions)
        entries.append(minted.entry)
        tokens[grant.name] = minted.token
    path.write_text("\n".join(entries))
    return tokens


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclass(frozen=True)
class JwtKeys:
    """An HS256 secret, an RSA and an Ed25519 key pair, each written where a server reads it."""

    hs_secret: bytes
    rsa_private: Any
    ed_private: Any
    hs_file: Path
    rsa_file: Path
    ed_file: Path
    jwks_file: Path


def make_jwt_keys(workdir: Path) -> JwtKeys:
    workdir.mkdir(parents=True, exist_ok=True)
    hs = secrets.token_hex(32).encode()
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed_key = ed25519.Ed25519PrivateKey.generate()

    def pem(key: Any) -> bytes:
        return bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    (workdir / "hs.key").write_bytes(hs + b"\n")
    (workdir / "rsa.pem").write_bytes(pem(rsa_key))
    (workdir / "ed.pem").write_bytes(pem(ed_key))
    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    ed_jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(ed_key.public_key()))
    rsa_jwk.update(kid="rsa-1", alg="RS256", use="sig")
    ed_jwk.update(kid="ed-1", alg="EdDSA", use="sig")
    (workdir / "jwks.json").write_text(json.dumps({"keys": [rsa_jwk, ed_jwk]}))
    return JwtKeys(
        hs, rsa_key, ed_key, workdir / "hs.key", workdir / "rsa.pem", workdir / "ed.pem",
        workdir / "jwks.json",
    )  # fmt: skip


def make_jwt(
    key: Any,
    alg: str,
    sub: str,
    roles: Iterable[str],
    *,
    groups: Iterable[str] = (),
    ttl: float = 300,
    kid: str | None = None,
    **claims: Any,
) -> str:
    now = time.time()
    payload = {
        "sub": sub,
        "iat": int(now),
        "exp": int(now + ttl),
        "troth_roles": list(roles),
        "troth_groups": list(groups),
        **claims,
    }
    headers = {"kid": kid} if kid else None
    return jwt.encode(payload, key, algorithm=alg, headers=headers)


def code_and_reason(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """Make a call; (OK, "") or its status code and ErrorInfo reason."""
    from _support import error_info

    try:
        call()
    except grpc.RpcError as error:
        code = error.code()  # type: ignore[attr-defined]
        try:
            reason = error_info(error).reason
        except AssertionError:
            reason = ""
        return code, reason
    return grpc.StatusCode.OK, ""


def opened(call: Any) -> str:
    """Wait until a server stream is open or refused: "opened" once its initial
    metadata comes (every troth stream sends some once past the door: WATCH_READY,
    POLL_OPEN, the batching flag of `Calls`), else its error raised. No deadline is
    part of the answer: a refusal answered late (a bad secret, 0.5 s) or a loaded
    machine cannot pass for an open stream."""
    try:
        call.initial_metadata()
        if call.done():  # ended before or just after it opened: its status says which
            next(call)
        return "opened"
    finally:
        call.cancel()


def first_message(call: Any) -> object:
    """Read one message of a server stream (or let its error or deadline surface)."""
    try:
        return next(call)
    finally:
        call.cancel()
