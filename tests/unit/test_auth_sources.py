"""The sources of principals, in process: token files, JWT key files, `troth tokens new`,
and the settings that decide whether `troth serve` may start without authentication."""

from __future__ import annotations

import stat
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from _auth import make_jwt, make_jwt_keys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from troth.errors import Reason
from troth_server.api import _convert as convert
from troth_server.auth import (
    AuthConfigError,
    Authenticator,
    AuthSources,
    Unauthenticated,
    bearer_token,
    mint,
)
from troth_server.config import (
    NO_AUTH_CONFIGURED,
    Limits,
    auth_refusal,
    is_loopback,
    settings_from,
)
from troth_server.domain.access import Role, reserved_prefix
from troth_server.domain.errors import InvalidArgument
from troth_server.domain.promise import TIMEOUT_PRINCIPAL
from troth_server.domain.settle_tokens import OLD_SETTLED_BY_PREFIX

if TYPE_CHECKING:
    from pathlib import Path


def _table(tmp_path: Path, text: str) -> Authenticator:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    return Authenticator(AuthSources(tokens_file=path))


def test_a_minted_token_verifies_once_then_comes_from_the_cache(tmp_path: Path) -> None:
    minted = mint("billing-worker", ["worker"], ["billing"], ["acme-"])
    assert minted.token.split("_", 2)[2] not in minted.entry  # the hash only
    auth = _table(tmp_path, minted.entry)
    assert auth.cached(minted.token) is None
    principal = auth.verify(minted.token)
    assert principal.name == "billing-worker"
    assert principal.roles == frozenset({Role.WORKER})
    assert principal.groups == frozenset({"billing"})
    assert principal.prefixes == ("acme-",)
    assert auth.cached(minted.token) == principal
    key_id = minted.token.split("_")[1]
    with pytest.raises(Unauthenticated) as wrong:
        auth.verify(f"troth_{key_id}_not-the-secret")
    assert wrong.value.reason is Reason.TOKEN_INVALID
    # Refused again from the cache of refused tokens, with no scrypt (issue 26).
    with pytest.raises(Unauthenticated) as again:
        auth.cached(f"troth_{key_id}_not-the-secret")
    assert again.value.reason is Reason.TOKEN_INVALID
    for check in (auth.verify, auth.cached):
        with pytest.raises(Unauthenticated) as unknown:
            check("troth_ffffffffffffffff_whatever")
        assert unknown.value.reason is Reason.TOKEN_UNKNOWN
    auth.reload()
    # Kept across a reload while its entry keeps its secret: no scrypt again.
    assert auth.cached(minted.token) == principal
    (tmp_path / "tokens.toml").write_text("")
    auth.reload()
    with pytest.raises(Unauthenticated) as gone:  # its entry is gone: refused at once
        auth.cached(minted.token)
    assert gone.value.reason is Reason.TOKEN_UNKNOWN


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[principal]]\nname = "a"\nroles = ["wizard"]\n', "unknown role 'wizard'"),
        ('[[principal]]\nname = "a"\nroles = ["gateway"]\ncolour = 1\n', "unknown keys"),
        (
            '[[principal]]\nname = "a"\nroles = ["gateway"]\nkey_id = "abcdefgh12"\n'
            'secret_hash = "plain-text-secret"\n',
            "secret_hash must look like scrypt$",
        ),
        ('[[principal]]\nname = "troth:x"\nroles = ["gateway"]\n', "reserved"),
        ("[[principal]\n", "not valid TOML"),
    ],
)
def test_a_bad_token_file_is_refused_saying_why(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(AuthConfigError, match=message.replace("$", r"\$").replace("(", r"\(")):
        _table(tmp_path, text)


def test_a_key_id_used_twice_is_refused(tmp_path: Path) -> None:
    entry = mint("a", ["gateway"]).entry
    twice = entry + entry.replace('name = "a"', 'name = "b"')
    with pytest.raises(AuthConfigError, match="used twice"):
        _table(tmp_path, twice)


def test_bearer_metadata_is_parsed_strictly() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc") == "abc"
    for header, reason in [
        (None, Reason.CREDENTIALS_MISSING),
        ("Basic dXNlcg==", Reason.CREDENTIALS_MALFORMED),
        ("Bearer ", Reason.CREDENTIALS_MALFORMED),
    ]:
        with pytest.raises(Unauthenticated) as caught:
            bearer_token(header)
        assert caught.value.reason is reason


def test_pem_key_files_rs256_and_eddsa(tmp_path: Path) -> None:
    keys = make_jwt_keys(tmp_path)
    for key_file, private, alg in [
        (keys.rsa_file, keys.rsa_private, "RS256"),
        (keys.ed_file, keys.ed_private, "EdDSA"),
    ]:
        auth = Authenticator(AuthSources(jwt_key_file=key_file))
        token = make_jwt(private, alg, "svc", ["gateway"])
        assert auth.verify(token).name == "svc"
        assert auth.cached(token) is not None
        # The other algorithm's token is refused: each key is used with its own only.
        other = make_jwt(keys.hs_secret, "HS256", "svc", ["admin"])
        with pytest.raises(Unauthenticated) as caught:
            auth.verify(other)
        assert caught.value.reason is Reason.TOKEN_INVALID


@pytest.mark.parametrize("name", ["troth:timeout", "settle-token:k1:abc", "settle-token:"])
def test_a_reserved_name_is_no_principal_from_any_source(tmp_path: Path, name: str) -> None:
    """`troth:...` and `settle-token:...` are the names the server records itself
    (`settled_by` of a timeout, of a settle link): no principal is named so (issue 26)."""
    entry = f'[[principal]]\nname = "{name}"\nroles = ["gateway"]\n'
    with pytest.raises(AuthConfigError, match="reserved for the server's own records"):
        _table(tmp_path, entry)
    with pytest.raises(ValueError, match="reserved"):
        mint(name, ["gateway"])
    keys = make_jwt_keys(tmp_path / "keys")
    auth = Authenticator(AuthSources(jwt_key_file=keys.hs_file))
    with pytest.raises(Unauthenticated, match="reserved") as caught:
        auth.verify(make_jwt(keys.hs_secret, "HS256", name, ["gateway"]))
    assert caught.value.reason is Reason.TOKEN_INVALID
    with pytest.raises(InvalidArgument, match="reserved") as declared:
        convert.principal({"troth-principal": name}, Limits())
    assert declared.value.field == "troth-principal"


def test_the_reserved_prefixes_cover_every_name_the_server_records() -> None:
    for recorded in (TIMEOUT_PRINCIPAL, "troth:workflow", f"{OLD_SETTLED_BY_PREFIX}k1:abc"):
        assert reserved_prefix(recorded) is not None, recorded
    assert reserved_prefix("alice") is None
    assert reserved_prefix("settle-tokens-team") is None


def test_unusable_key_files_are_refused(tmp_path: Path) -> None:
    private = tmp_path / "private.pem"
    private.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(AuthConfigError, match="private key"):
        Authenticator(AuthSources(jwt_key_file=private))
    short = tmp_path / "short.key"
    short.write_text("tooshort")
    with pytest.raises(AuthConfigError, match="at least 32"):
        Authenticator(AuthSources(jwt_key_file=short))


def test_troth_tokens_new_prints_the_entry_and_the_token_once(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "troth_server", "tokens", "new", "--name", "ops",
         "--roles", "operator,gateway"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    token = done.stderr.strip().splitlines()[-1]
    assert token.startswith("troth_")
    assert token not in done.stdout and token.split("_", 2)[2] not in done.stdout
    auth = _table(tmp_path, done.stdout)
    assert auth.verify(token).roles == frozenset({Role.OPERATOR, Role.GATEWAY})

    out = tmp_path / "worker.token"
    done = subprocess.run(
        [sys.executable, "-m", "troth_server", "tokens", "new", "--name", "w",
         "--roles", "worker", "--groups", "billing", "--token-out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text().strip() not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("listen", "loopback"),
    [
        ("127.0.0.1:7070", True),
        ("127.0.0.2:1", True),
        ("localhost:7070", True),
        ("[::1]:7070", True),
        ("unix:/tmp/troth.sock", True),
        ("0.0.0.0:7070", False),
        ("[::]:7070", False),
        ("10.0.0.5:7070", False),
        ("troth.example.com:7070", False),
    ],
)
def test_loopback_addresses(listen: str, loopback: bool) -> None:
    assert is_loopback(listen) is loopback


def test_when_troth_serve_may_start() -> None:
    def refusal(*argv: str) -> str | None:
        return auth_refusal(settings_from(list(argv), environ={}))

    assert refusal() == NO_AUTH_CONFIGURED
    assert refusal("--no-auth") is None
    assert refusal("--auth-tokens", "t.toml", "--listen", "0.0.0.0:1") is None
    assert "not a loopback address" in (refusal("--no-auth", "--listen", "0.0.0.0:1") or "")
    assert refusal("--no-auth", "--listen", "0.0.0.0:1", "--allow-public-without-auth") is None
    assert auth_refusal(settings_from([], environ={"TROTH_NO_AUTH": "1"})) is None


def test_contradictory_auth_flags_are_usage_errors() -> None:
    for argv in (
        ["--no-auth", "--auth-tokens", "t.toml"],
        ["--jwt-issuer", "https://idp"],
        ["--jwt-key-file", "k", "--jwt-algorithms", "none"],
    ):
        with pytest.raises(SystemExit):
            settings_from(argv, environ={})
