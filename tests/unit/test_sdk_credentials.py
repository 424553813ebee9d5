"""Client credentials without a server: TLS settings from arguments and TROTH_TLS_*,
the bearer token from `token=` and TROTH_TOKEN, the plaintext-token refusal, and the
token kept out of reprs and error messages. (The wire itself: test_sdk_bearer.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from _tls import TestCA

from troth import Client, ConfigurationError, TlsConfig
from troth._credentials import (
    AUTHORIZATION_METADATA_KEY,
    is_loopback,
    resolve_tls,
    resolve_token,
)
from troth._transport import Transport

TOKEN = "tok-3f9a1c77e2b54d0d"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.create(tmp_path_factory.mktemp("ca"))


# --- TLS settings ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tls", "environ", "expected"),
    [
        (None, {}, None),
        (False, {"TROTH_TLS_CA": "/ca.pem"}, None),
        (True, {}, TlsConfig()),
        (True, {"TROTH_TLS_CA": "/ca.pem"}, TlsConfig(ca_file="/ca.pem")),
        (None, {"TROTH_TLS": "true"}, TlsConfig()),
        (None, {"TROTH_TLS": "false"}, None),
        (None, {"TROTH_TLS_CA": "/ca.pem"}, TlsConfig(ca_file="/ca.pem")),
        (
            None,
            {"TROTH_TLS_CA": "/ca.pem", "TROTH_TLS_CERT": "/c.crt", "TROTH_TLS_KEY": "/c.key"},
            TlsConfig("/ca.pem", "/c.crt", "/c.key"),
        ),
        (None, {"TROTH_TLS_CA": ""}, None),  # an empty variable is an unset one
        (TlsConfig(ca_file="/mine.pem"), {"TROTH_TLS_CA": "/ca.pem"}, TlsConfig("/mine.pem")),
    ],
)
def test_tls_comes_from_the_argument_else_the_environment(
    tls: bool | TlsConfig | None, environ: dict[str, str], expected: TlsConfig | None
) -> None:
    assert resolve_tls(tls, environ) == expected


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({"TROTH_TLS": "maybe"}, "TROTH_TLS='maybe' is not a yes/no value"),
        ({"TROTH_TLS": "false", "TROTH_TLS_CA": "/ca.pem"}, "turns TLS off, yet TROTH_TLS_CA"),
        ({"TROTH_TLS_CERT": "/c.crt"}, "cert_file given without key_file"),
        ({"TROTH_TLS_KEY": "/c.key"}, "key_file given without cert_file"),
    ],
)
def test_contradictory_tls_settings_are_refused_saying_which(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        resolve_tls(None, environ)


def test_a_tls_argument_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must be True"):
        resolve_tls("yes", {})  # type: ignore[arg-type]


def test_tls_files_that_cannot_be_used_are_named(tmp_path: Path, ca: TestCA) -> None:
    with pytest.raises(ConfigurationError, match=r"ca_file '.*missing\.pem': no such file"):
        Client("127.0.0.1:1", tls=TlsConfig(ca_file=tmp_path / "missing.pem"))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=r"ca_file .*garbage\.pem.*not PEM"):
        Client("127.0.0.1:1", tls=TlsConfig(ca_file=garbage))
    issued = ca.issue(tmp_path, "alice")
    with pytest.raises(ConfigurationError, match=r"key_file .*: not PEM"):
        Client("127.0.0.1:1", tls=TlsConfig(ca.cert, issued.cert, issued.cert))


def test_a_client_over_tls_says_so_and_a_plaintext_one_does_not(ca: TestCA) -> None:
    with Client("127.0.0.1:1", tls=TlsConfig(ca_file=ca.cert)) as client:
        assert client.tls == TlsConfig(ca_file=ca.cert)
        assert client.tls is not None and not client.tls.mutual
    with Client("127.0.0.1:1", tls=False) as client:
        assert client.tls is None


# --- the token ------------------------------------------------------------------------


def test_the_token_comes_from_the_argument_else_troth_token() -> None:
    assert resolve_token(TOKEN, {"TROTH_TOKEN": "other"}) == TOKEN
    assert resolve_token(None, {"TROTH_TOKEN": TOKEN}) == TOKEN
    assert resolve_token(None, {"TROTH_TOKEN": ""}) is None
    assert resolve_token(None, {}) is None


@pytest.mark.parametrize(
    ("token", "says"),
    [
        ("", "token is empty"),
        (f"Bearer {TOKEN}", "starts with 'Bearer '"),
        (f"{TOKEN}\n", "spaces, line breaks or non-ASCII"),
        (f"{TOKEN} x", "spaces, line breaks or non-ASCII"),
        (f"{TOKEN}é", "spaces, line breaks or non-ASCII"),
    ],
)
def test_an_unusable_token_is_refused_without_showing_it(token: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says) as caught:
        Client("127.0.0.1:1", token=token)
    assert TOKEN not in str(caught.value) and TOKEN not in repr(caught.value)


def test_the_token_travels_as_bearer_metadata_and_no_repr_shows_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="troth")
    transport = Transport("127.0.0.1:1", principal="alice", token=TOKEN)
    try:
        assert dict(transport.metadata) == {
            "troth-principal": "alice",
            AUTHORIZATION_METADATA_KEY: f"Bearer {TOKEN}",
        }
        assert TOKEN not in repr(transport.metadata)
        assert "<redacted>" in repr(transport.metadata)
    finally:
        transport.close()
    with Client("127.0.0.1:1", token=TOKEN) as client:
        assert TOKEN not in repr(client)
        assert TOKEN not in repr(vars(client))
    assert TOKEN not in caplog.text


# --- no token in plaintext off this machine -------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:7070", True),
        ("127.8.9.10:7070", True),
        ("localhost:7070", True),
        ("[::1]:7070", True),
        ("[::ffff:127.0.0.1]:7070", True),
        ("unix:/run/troth.sock", True),
        ("dns:localhost:7070", True),
        ("dns:///localhost:7070", True),
        ("ipv4:127.0.0.1:7070,127.0.0.2:7071", True),
        ("10.0.0.1:7070", False),
        ("troth.internal:7070", False),
        ("localhost.evil.example:7070", False),
        ("0.0.0.0:7070", False),
        ("dns://8.8.8.8/localhost:7070", False),
        ("ipv4:127.0.0.1:7070,10.0.0.2:7070", False),
        ("vsock:3:7070", False),
        ("garbage", False),
    ],
)
def test_loopback_addresses_are_told_from_the_rest(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


@pytest.mark.parametrize("address", ["10.0.0.1:7070", ["127.0.0.1:7070", "10.0.0.2:7070"]])
def test_a_token_in_plaintext_off_this_machine_is_refused(address: str | list[str]) -> None:
    with pytest.raises(ConfigurationError, match="refusing to send a bearer token in plaintext"):
        Client(address, token=TOKEN)
    with pytest.raises(ConfigurationError, match=r"10\.0\.0"):
        Client(address, token=TOKEN)


def test_a_token_over_tls_on_loopback_or_when_allowed_is_accepted(ca: TestCA) -> None:
    for client in (
        Client("10.0.0.1:7070", token=TOKEN, tls=TlsConfig(ca_file=ca.cert)),
        Client("127.0.0.1:7070", token=TOKEN),
        Client("10.0.0.1:7070", token=TOKEN, allow_plaintext_token=True),
        Client("10.0.0.1:7070"),  # no token: nothing to protect
    ):
        client.close()


def test_troth_token_from_the_environment_is_checked_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TROTH_TOKEN", TOKEN)
    with pytest.raises(ConfigurationError, match="plaintext") as caught:
        Client("10.0.0.1:7070")
    assert TOKEN not in str(caught.value)


# --- several replicas over TLS --------------------------------------------------------


def test_several_addresses_over_tls_need_a_server_name(ca: TestCA) -> None:
    replicas = ["10.0.0.1:7070", "10.0.0.2:7070"]
    with pytest.raises(ConfigurationError, match=r"need the name.*server_name"):
        Client(replicas, tls=TlsConfig(ca_file=ca.cert))
    Client(replicas, tls=TlsConfig(ca_file=ca.cert, server_name="troth.internal")).close()
    Client(replicas).close()  # plaintext: no name is checked


def test_troth_tls_server_name_sets_the_name() -> None:
    environ = {"TROTH_TLS_CA": "/ca.pem", "TROTH_TLS_SERVER_NAME": "troth.internal"}
    assert resolve_tls(None, environ) == TlsConfig("/ca.pem", server_name="troth.internal")
    assert resolve_tls(None, {"TROTH_TLS_SERVER_NAME": "troth.internal"}) is None
