"""The server's TLS files, read and checked at start: flags and TROTH_TLS_* variables,
and a clear error for each way the files can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from _tls import Issued, TestCA

from troth_server._tls import TlsError, TlsMode, load_server_tls
from troth_server.config import settings_from


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, Issued, Issued]:
    directory = tmp_path_factory.mktemp("pki")
    ca = TestCA.create(directory)
    return ca, ca.issue(directory, "server", server=True), ca.issue(directory, "other", server=True)


def test_tls_settings_come_from_flags_or_troth_tls_variables() -> None:
    flags = settings_from(["--tls-cert", "a.crt", "--tls-key", "a.key", "--tls-client-ca", "c"])
    assert (flags.tls_cert, flags.tls_key, flags.tls_client_ca) == ("a.crt", "a.key", "c")
    env = settings_from(
        [], {"TROTH_TLS_CERT": "b.crt", "TROTH_TLS_KEY": "b.key", "TROTH_TLS_CLIENT_CA": "d"}
    )
    assert (env.tls_cert, env.tls_key, env.tls_client_ca) == ("b.crt", "b.key", "d")
    plain = settings_from([], {})
    assert (plain.tls_cert, plain.tls_key, plain.tls_client_ca) == (None, None, None)


def test_no_files_is_plaintext() -> None:
    assert load_server_tls(None, None, None) is None


def test_a_certificate_and_key_serve_tls_and_a_client_ca_mtls(
    pki: tuple[TestCA, Issued, Issued],
) -> None:
    ca, server, _ = pki
    tls = load_server_tls(str(server.cert), str(server.key), None)
    assert tls is not None and tls.mode is TlsMode.TLS
    mtls = load_server_tls(str(server.cert), str(server.key), str(ca.cert))
    assert mtls is not None and mtls.mode is TlsMode.MTLS
    assert mtls.client_ca == ca.cert.read_bytes()
    assert "PRIVATE" not in repr(mtls)
    assert mtls.credentials() is not None


def test_each_bad_combination_or_file_says_what_to_do(
    pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, other = pki
    cert, key = str(server.cert), str(server.key)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("hello\n")
    cases: list[tuple[tuple[str | None, str | None, str | None], str]] = [
        ((cert, None, None), r"--tls-cert needs --tls-key FILE \(or TROTH_TLS_KEY\)"),
        ((None, key, None), r"--tls-key needs --tls-cert FILE \(or TROTH_TLS_CERT\)"),
        ((None, None, str(ca.cert)), r"--tls-client-ca \(TROTH_TLS_CLIENT_CA\) needs"),
        ((str(tmp_path / "nope.crt"), key, None), "nope.crt: no such file"),
        ((str(tmp_path), key, None), "is a directory"),
        ((str(garbage), key, None), "garbage.pem: does not hold a PEM certificate"),
        ((cert, str(garbage), None), "garbage.pem: does not hold a PEM private key"),
        ((cert, str(other.key), None), "is not the private key of the certificate"),
        ((cert, key, str(garbage)), "--tls-client-ca .*garbage.pem: does not hold PEM CA"),
        ((cert, key, str(tmp_path / "ca.pem")), "ca.pem: no such file"),
    ]
    for (given_cert, given_key, given_ca), says in cases:
        with pytest.raises(TlsError, match=says):
            load_server_tls(given_cert, given_key, given_ca)
