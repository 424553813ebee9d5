"""JWT authentication on real servers: HS256, RS256 and EdDSA accepted; wrong issuer,
audience, signature, kid, expired, `none` and a public key used as an HMAC secret refused;
claims give the roles and groups; a JWKS rotated on SIGHUP drops the cached tokens."""

from __future__ import annotations

import base64
import json
import signal
import time
from typing import TYPE_CHECKING, Any

import grpc
import jwt
import pytest
from _auth import (
    Grant,
    JwtKeys,
    bearer,
    code_and_reason,
    make_jwt,
    make_jwt_keys,
    opened,
    write_token_file,
)
from _support import eventually, start_server
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from troth.v1 import promises_pb2, promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from _support import ServerProcess

ISSUER = "https://idp.example.test"
AUDIENCE = "troth"
CLAIMS = {"iss": ISSUER, "aud": AUDIENCE}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> JwtKeys:
    return make_jwt_keys(tmp_path_factory.mktemp("jwt-keys"))


@pytest.fixture(scope="module")
def jwks_server(tmp_path_factory: pytest.TempPathFactory, keys: JwtKeys) -> Iterator[ServerProcess]:
    """RS256 and EdDSA keys from a JWKS file, with issuer and audience."""
    workdir = tmp_path_factory.mktemp("jwks-server")
    jwks = workdir / "jwks.json"
    jwks.write_text(keys.jwks_file.read_text())
    server = start_server(
        workdir, "--jwt-jwks-file", str(jwks), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE
    )
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def hs_server(
    tmp_path_factory: pytest.TempPathFactory, keys: JwtKeys
) -> Iterator[tuple[ServerProcess, str]]:
    """An HS256 secret and a token file, together."""
    workdir = tmp_path_factory.mktemp("hs-server")
    tokens = write_token_file(workdir / "tokens.toml", [Grant("op-file", ("operator",))])
    server = start_server(
        workdir,
        "--jwt-key-file", str(keys.hs_file), "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE,
        "--auth-tokens", str(workdir / "tokens.toml"),
    )  # fmt: skip
    yield server, tokens["op-file"]
    assert server.stop() == 0, server.log()[-3000:]


def _create(server: ServerProcess, token: str, promise_id: str) -> tuple[grpc.StatusCode, str]:
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        return code_and_reason(
            lambda: stub.CreatePromise(
                promises_pb2.CreatePromiseRequest(id=promise_id), metadata=bearer(token), timeout=10
            )
        )


def _settled_by(server: ServerProcess, token: str, promise_id: str) -> str:
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        stub.CreatePromise(
            promises_pb2.CreatePromiseRequest(id=promise_id), metadata=bearer(token), timeout=10
        )
        reply = stub.ResolvePromise(
            promises_pb2.ResolvePromiseRequest(id=promise_id), metadata=bearer(token), timeout=10
        )
        return reply.promise.settled_by


def test_rs256_and_eddsa_from_a_jwks_file(jwks_server: ServerProcess, keys: JwtKeys) -> None:
    rs = make_jwt(keys.rsa_private, "RS256", "gw-rsa", ["gateway"], kid="rsa-1", **CLAIMS)
    ed = make_jwt(keys.ed_private, "EdDSA", "gw-ed", ["gateway"], kid="ed-1", **CLAIMS)
    assert _settled_by(jwks_server, rs, "jwt-rs-1") == "gw-rsa"
    assert _settled_by(jwks_server, ed, "jwt-ed-1") == "gw-ed"


def test_hs256_and_the_token_file_together(
    hs_server: tuple[ServerProcess, str], keys: JwtKeys
) -> None:
    server, file_token = hs_server
    hs = make_jwt(keys.hs_secret, "HS256", "gw-hs", ["gateway"], **CLAIMS)
    assert _settled_by(server, hs, "jwt-hs-1") == "gw-hs"
    with server.channel() as channel:
        stub = promises_pb2_grpc.PromiseServiceStub(channel)
        stub.SearchPromises(
            promises_pb2.SearchPromisesRequest(id="*"), metadata=bearer(file_token), timeout=10
        )
    wrong = make_jwt(b"another-secret-" * 4, "HS256", "gw-hs", ["gateway"], **CLAIMS)
    assert _create(server, wrong, "jwt-hs-2") == (grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID")


def _unsigned(payload: dict[str, Any]) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(payload)}."


def test_refused_jwts(jwks_server: ServerProcess, keys: JwtKeys) -> None:
    now = int(time.time())
    other_rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = keys.rsa_file.read_bytes()
    confused = jwt.api_jws.PyJWS()
    confused._algorithms["HS256"].prepare_key = lambda key: key  # type: ignore[method-assign]
    hs_with_public_key = confused.encode(
        json.dumps({"sub": "x", "exp": now + 300, "troth_roles": ["admin"], **CLAIMS}).encode(),
        public_pem,
        algorithm="HS256",
        headers={"kid": "rsa-1"},
    )
    cases = {
        "wrong issuer": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", iss="https://evil",
                     aud=AUDIENCE),
            "TOKEN_INVALID",
        ),
        "wrong audience": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", iss=ISSUER,
                     aud="someone-else"),
            "TOKEN_INVALID",
        ),
        "no audience": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", iss=ISSUER),
            "TOKEN_INVALID",
        ),
        "expired": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", ttl=-600, **CLAIMS),
            "TOKEN_EXPIRED",
        ),
        "bad signature": (
            make_jwt(other_rsa, "RS256", "a", ["gateway"], kid="rsa-1", **CLAIMS),
            "TOKEN_INVALID",
        ),
        "unknown kid": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-9", **CLAIMS),
            "TOKEN_UNKNOWN",
        ),
        "alg none": (
            _unsigned({"sub": "a", "exp": now + 300, "troth_roles": ["admin"], **CLAIMS}),
            "TOKEN_INVALID",
        ),
        "public key as HMAC secret": (hs_with_public_key, "TOKEN_INVALID"),
        "unsupported alg": (
            make_jwt(ec.generate_private_key(ec.SECP256R1()), "ES256", "a", ["gateway"],
                     kid="rsa-1", **CLAIMS),
            "TOKEN_INVALID",
        ),
        "no roles": (
            make_jwt(keys.rsa_private, "RS256", "a", [], kid="rsa-1", **CLAIMS),
            "TOKEN_INVALID",
        ),
        "unknown role": (
            make_jwt(keys.rsa_private, "RS256", "a", ["wizard"], kid="rsa-1", **CLAIMS),
            "TOKEN_INVALID",
        ),
        "reserved name": (
            make_jwt(keys.rsa_private, "RS256", "troth:me", ["gateway"], kid="rsa-1", **CLAIMS),
            "TOKEN_INVALID",
        ),
        # Its settles would look like a settle link's (issue 26).
        "a settle token's name": (
            make_jwt(keys.rsa_private, "RS256", "settle-token:k1:abc", ["gateway"], kid="rsa-1",
                     **CLAIMS),
            "TOKEN_INVALID",
        ),
        # PyJWT takes a string of digits for a time (issue 26): a JSON number or nothing.
        "exp a string": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", exp="9999999999",
                     **CLAIMS),
            "TOKEN_INVALID",
        ),
        "nbf a string": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", nbf=str(now),
                     **CLAIMS),
            "TOKEN_INVALID",
        ),
        "iat true": (
            make_jwt(keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", iat=True, **CLAIMS),
            "TOKEN_INVALID",
        ),
    }  # fmt: skip
    wrong = []
    for what, (token, reason) in cases.items():
        got = _create(jwks_server, token, f"refused-{what.replace(' ', '-')}")
        if got != (grpc.StatusCode.UNAUTHENTICATED, reason):
            wrong.append(f"{what}: {got[0].name} {got[1]}, want {reason}")
    assert wrong == []
    # The server writes its log out every 0.2 s, in order, at most a few `auth.refused`
    # lines per reason and subject (the refusals above share two): one more refusal, of
    # a principal refused nothing before, is written after them.
    sentinel = make_jwt(keys.rsa_private, "RS256", "sentinel", ["operator"], kid="rsa-1",
                        **CLAIMS)  # fmt: skip
    assert _create(jwks_server, sentinel, "refused-sentinel")[1] == "ROLE_NOT_ALLOWED"
    eventually(
        lambda: any(
            "auth.refused" in line and "sentinel" in line for line in jwks_server.log().splitlines()
        ),
        what="the last refusal",
    )
    log = jwks_server.log()
    assert log.count("auth.refused") >= 3  # TOKEN_INVALID, TOKEN_EXPIRED, ROLE_NOT_ALLOWED
    for token, _ in cases.values():
        assert token not in log


def test_claims_give_the_roles_and_the_groups(jwks_server: ServerProcess, keys: JwtKeys) -> None:
    # troth_roles may also be one space-separated string (as OAuth's scope is).
    operator = make_jwt(keys.ed_private, "EdDSA", "op", [], kid="ed-1",
                        troth_roles="operator gateway", **CLAIMS)  # fmt: skip
    assert _create(jwks_server, operator, "claims-1")[0] == grpc.StatusCode.OK
    reader = make_jwt(keys.ed_private, "EdDSA", "reader", ["operator"], kid="ed-1", **CLAIMS)
    assert _create(jwks_server, reader, "claims-2") == (
        grpc.StatusCode.PERMISSION_DENIED,
        "ROLE_NOT_ALLOWED",
    )
    worker = make_jwt(keys.ed_private, "EdDSA", "wk", ["worker"], groups=["billing"], kid="ed-1",
                      **CLAIMS)  # fmt: skip
    with jwks_server.channel() as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)

        def poll(group: str) -> tuple[grpc.StatusCode, str]:
            # Open or refused by the stream's initial metadata, not by a deadline.
            return code_and_reason(
                lambda: opened(
                    stub.Poll(
                        tasks_pb2.PollRequest(group=group, worker_id=f"w-{group}", capacity=1),
                        metadata=bearer(worker),
                        timeout=30,
                    )
                )
            )

        assert poll("billing") == (grpc.StatusCode.OK, "")  # open
        assert poll("payroll") == (grpc.StatusCode.PERMISSION_DENIED, "GROUP_NOT_ALLOWED")


def test_a_jwks_rotated_on_sighup_drops_cached_tokens(
    jwks_server: ServerProcess, keys: JwtKeys, tmp_path: Path
) -> None:
    """Last of the module's uses of the JWKS server: it rotates the Ed25519 key."""
    old = make_jwt(keys.ed_private, "EdDSA", "gw-old", ["gateway"], kid="ed-1", **CLAIMS)
    assert _create(jwks_server, old, "rotate-1")[0] == grpc.StatusCode.OK  # cached now
    new_key = ed25519.Ed25519PrivateKey.generate()
    jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(new_key.public_key()))
    jwk.update(kid="ed-2", alg="EdDSA")
    jwks = jwks_server.log_path.parent / "jwks.json"
    document = json.loads(jwks.read_text())
    document["keys"] = [k for k in document["keys"] if k["kid"] != "ed-1"] + [jwk]
    jwks.write_text(json.dumps(document))
    jwks_server.proc.send_signal(signal.SIGHUP)
    new = make_jwt(new_key, "EdDSA", "gw-new", ["gateway"], kid="ed-2", **CLAIMS)
    eventually(
        lambda: _create(jwks_server, new, f"rotate-{time.monotonic_ns()}")[0] == grpc.StatusCode.OK,
        what="the rotated key to work",
    )
    assert _create(jwks_server, old, "rotate-3") == (
        grpc.StatusCode.UNAUTHENTICATED,
        "TOKEN_UNKNOWN",
    )


def test_a_time_claim_that_is_no_number_is_named(jwks_server: ServerProcess, keys: JwtKeys) -> None:
    for claim, value, what in (
        ("exp", "9999999999", "a str"),
        ("nbf", [1], "a list"),
        ("iat", 1e300, "a number out of range"),
    ):
        token = make_jwt(
            keys.rsa_private, "RS256", "a", ["gateway"], kid="rsa-1", **{claim: value}, **CLAIMS
        )
        with jwks_server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.GetPromise(
                    promises_pb2.GetPromiseRequest(id="x"), metadata=bearer(token), timeout=10
                )
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        details = refused.value.details()  # type: ignore[attr-defined]
        assert f"its {claim!r} claim is {what}, not a number of seconds since 1970" in details
