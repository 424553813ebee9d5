"""The server's transport security: TLS, and mTLS with a client CA, from PEM files.

`troth serve --tls-cert FILE --tls-key FILE` serves TLS; adding
`--tls-client-ca FILE` makes it mTLS: every client must present a certificate
that CA signed, or the handshake fails before any RPC runs. Without these
flags the server listens in plaintext, the default for a loopback developer
server.

The files are read and checked once, at start, with the standard library's
`ssl` (no new dependency): a missing or unreadable file, a file that holds no
PEM certificate or key, or a key that does not belong to the certificate
stops the server with a message naming the file and what to do, instead of
a server that starts and then fails every handshake.
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["TlsError", "TlsMode", "TlsServerFiles", "load_server_tls"]


class TlsError(Exception):
    """The TLS files given to the server cannot be used; the message says why and what to do."""


class TlsMode(enum.StrEnum):
    """How the server's port is secured (logged on `server.started` as `tls`)."""

    OFF = "off"
    """Plaintext: for a loopback developer server."""
    TLS = "tls"
    """The server proves who it is; clients are not asked for certificates."""
    MTLS = "mtls"
    """Both sides prove who they are: a client certificate signed by the client CA is required."""


@dataclass(frozen=True, slots=True)
class TlsServerFiles:
    """The PEM contents the server's credentials are made of (no secrets in its repr)."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    def __repr__(self) -> str:
        return f"TlsServerFiles(mode={self.mode.value!r})"

    @property
    def mode(self) -> TlsMode:
        return TlsMode.MTLS if self.client_ca is not None else TlsMode.TLS

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials; with a client CA, client certificates are required."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def load_server_tls(
    cert: str | None, key: str | None, client_ca: str | None
) -> TlsServerFiles | None:
    """Read and check the server's TLS files; None when none is given (plaintext).

    Args:
        cert: The server's certificate chain (PEM), leaf first (`--tls-cert`).
        key: Its private key (PEM, unencrypted) (`--tls-key`).
        client_ca: The CA certificates client certificates must chain to (PEM)
            (`--tls-client-ca`); turns on mTLS.

    Raises:
        TlsError: A file is missing, unreadable or not PEM; the key does not match
            the certificate; or the flags are given in a combination that cannot work.
    """
    if cert is None and key is None:
        if client_ca is not None:
            raise TlsError(
                "--tls-client-ca (TROTH_TLS_CLIENT_CA) needs the server's own certificate "
                "too: add --tls-cert FILE and --tls-key FILE"
            )
        return None
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        env = missing.upper().removeprefix("--").replace("-", "_")
        raise TlsError(f"{given} needs {missing} FILE (or TROTH_{env}) as well")
    cert_pem = _read("--tls-cert", cert, b"-----BEGIN CERTIFICATE-----", "a PEM certificate")
    key_pem = _read("--tls-key", key, b"PRIVATE KEY-----", "a PEM private key")
    _check_pair(cert, key)
    ca_pem = None
    if client_ca is not None:
        ca_pem = _read(
            "--tls-client-ca", client_ca, b"-----BEGIN CERTIFICATE-----", "PEM CA certificates"
        )
        _check_ca(client_ca)
    return TlsServerFiles(cert_pem, key_pem, ca_pem)


def _read(flag: str, path: str, marker: bytes, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{flag} {path}: no such file; give the path of {what}") from None
    except IsADirectoryError:
        raise TlsError(f"{flag} {path}: is a directory; give the path of {what}") from None
    except OSError as exc:
        raise TlsError(
            f"{flag} {path}: cannot be read ({exc.strerror or exc}); check its permissions"
        ) from None
    if marker not in data:
        raise TlsError(f"{flag} {path}: does not hold {what} (no {marker.decode()!r} block)")
    return data


def _check_pair(cert: str, key: str) -> None:
    """Fail now, not at every handshake, when the key is not the certificate's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # A password callback, so that an encrypted key fails here instead of
        # prompting on the terminal (gRPC cannot use an encrypted key anyway).
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TlsError(
                f"--tls-key {key} is not the private key of the certificate in --tls-cert "
                f"{cert}; give the key the certificate was issued for"
            ) from None
        raise TlsError(
            f"--tls-cert {cert} / --tls-key {key}: cannot be used together ({exc.reason or exc}); "
            "give a PEM certificate chain and its unencrypted PEM private key"
        ) from None


def _check_ca(client_ca: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=client_ca)
    except ssl.SSLError as exc:
        raise TlsError(
            f"--tls-client-ca {client_ca}: not usable CA certificates ({exc.reason or exc})"
        ) from None
