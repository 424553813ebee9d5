"""What a client proves and checks on the wire: TLS settings and the bearer token.

- `TlsConfig`: the CA that signed the server's certificate (or the system's
  roots), and for mTLS the client's own certificate and key; read from
  `Client(tls=...)` or from `TROTH_TLS`, `TROTH_TLS_CA`, `TROTH_TLS_CERT`,
  `TROTH_TLS_KEY`.
- the bearer token (`Client(token=...)` or `TROTH_TOKEN`), sent as
  `authorization: Bearer <token>` metadata on every call. The token is a
  secret: it never appears in a repr, a log line or an error message (a
  `_Secret` keeps it out of reprs of the metadata that carries it).
- the one rule joining them: a token is never sent in plaintext to an address
  that is not loopback (`check_token_channel`), where anyone on the path could
  read and replay it.

Plaintext to a loopback address stays the default for a local developer server.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from troth._addresses import split_host_port
from troth.errors import ConfigurationError

__all__ = [
    "AUTHORIZATION_METADATA_KEY",
    "TlsConfig",
    "bearer_metadata",
    "check_tls_target",
    "check_token_channel",
    "is_loopback",
    "resolve_tls",
    "resolve_token",
]

AUTHORIZATION_METADATA_KEY = "authorization"
"""gRPC metadata key carrying `Bearer <token>`."""

_ENV_TLS = "TROTH_TLS"
_ENV_CA = "TROTH_TLS_CA"
_ENV_CERT = "TROTH_TLS_CERT"
_ENV_KEY = "TROTH_TLS_KEY"
_ENV_SERVER_NAME = "TROTH_TLS_SERVER_NAME"
_ENV_TOKEN = "TROTH_TOKEN"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """How a client connects over TLS.

    `TlsConfig()` trusts the system's root certificates (a server with a
    publicly issued certificate). Name a CA file for a private CA, and a
    certificate and key for mTLS (a server started with `--tls-client-ca`).

    Attributes:
        ca_file: PEM certificates of the CA(s) that signed the server's
            certificate; None trusts the system's roots.
        cert_file: This client's PEM certificate chain, for mTLS (needs `key_file`).
        key_file: Its unencrypted PEM private key (needs `cert_file`).
        server_name: The name to check the server's certificate against, when it
            is not the host of the address dialled (e.g. dialling an IP address
            whose certificate names a DNS name). Required with several replica
            addresses: gRPC checks all of them against one name.

    Raises:
        ConfigurationError: A certificate without its key, or a key without its
            certificate.

    .. versionadded:: 0.1.0
    """

    ca_file: str | os.PathLike[str] | None = None
    cert_file: str | os.PathLike[str] | None = None
    key_file: str | os.PathLike[str] | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("cert_file", "key_file")
            if self.cert_file is None:
                given, missing = missing, given
            raise ConfigurationError(
                f"TlsConfig {given} given without {missing}: a client certificate needs "
                "its private key (TROTH_TLS_CERT and TROTH_TLS_KEY, or --tls-cert and "
                "--tls-key), and the other way round"
            )
        if self.server_name is not None and not (
            self.server_name and self.server_name.isprintable()
        ):
            raise ConfigurationError(
                f"TlsConfig server_name {self.server_name!r} must be a host name, e.g. "
                "'troth.internal'"
            )

    @property
    def mutual(self) -> bool:
        """Whether this client presents a certificate of its own (mTLS)."""
        return self.cert_file is not None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Read the files into gRPC channel credentials.

        Raises:
            ConfigurationError: A file is missing, unreadable, or not PEM.
        """
        return grpc.ssl_channel_credentials(
            root_certificates=_read("ca_file", self.ca_file, b"-----BEGIN CERTIFICATE-----"),
            private_key=_read("key_file", self.key_file, b"PRIVATE KEY-----"),
            certificate_chain=_read("cert_file", self.cert_file, b"-----BEGIN CERTIFICATE-----"),
        )

    def channel_options(self) -> tuple[tuple[str, str], ...]:
        """Extra channel options: the certificate name override, if any."""
        if self.server_name is None:
            return ()
        return (("grpc.ssl_target_name_override", self.server_name),)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> TlsConfig | None:
        """The TLS settings in `TROTH_TLS*`, or None when they ask for none.

        Any of `TROTH_TLS_CA`, `TROTH_TLS_CERT`, `TROTH_TLS_KEY` set turns TLS on
        with those files; `TROTH_TLS=true` alone turns it on with the system's roots.
        `TROTH_TLS_SERVER_NAME` sets `server_name`.

        Raises:
            ConfigurationError: `TROTH_TLS` is not a yes/no value, or it says no
                while files are named.
        """
        files = {name: environ.get(name) or None for name in (_ENV_CA, _ENV_CERT, _ENV_KEY)}
        flag = environ.get(_ENV_TLS, "").strip().lower()
        if flag not in _TRUE + _FALSE:
            raise ConfigurationError(
                f"{_ENV_TLS}={environ[_ENV_TLS]!r} is not a yes/no value; write true or false"
            )
        named = any(files.values())
        if flag in _FALSE and flag != "" and named:
            raise ConfigurationError(
                f"{_ENV_TLS}={environ[_ENV_TLS]!r} turns TLS off, yet "
                + ", ".join(name for name, value in files.items() if value)
                + " names TLS files; unset one or the other"
            )
        if not named and flag not in _TRUE:
            return None
        return cls(
            ca_file=files[_ENV_CA],
            cert_file=files[_ENV_CERT],
            key_file=files[_ENV_KEY],
            server_name=environ.get(_ENV_SERVER_NAME) or None,
        )


def resolve_tls(
    tls: bool | TlsConfig | None, environ: Mapping[str, str] = os.environ
) -> TlsConfig | None:
    """What `Client(tls=...)` means: the TLS settings to use, or None for plaintext.

    - a `TlsConfig`: exactly that (the environment is not read);
    - `True`: the `TROTH_TLS_*` files if any are set, else the system's roots;
    - `False`: plaintext, whatever the environment says;
    - `None` (the default): whatever `TROTH_TLS*` says (`TlsConfig.from_env`),
      plaintext when they are unset.
    """
    given: object = tls  # checked at run time: callers need not be typed
    if isinstance(given, TlsConfig):
        return given
    if given is False:
        return None
    if given is True:
        return TlsConfig.from_env({**environ, _ENV_TLS: "true"})
    if given is None:
        return TlsConfig.from_env(environ)
    raise ConfigurationError(
        f"tls={given!r} must be True (system roots), False (plaintext), None (from "
        "TROTH_TLS*) or a troth.TlsConfig(ca_file=..., cert_file=..., key_file=...)"
    )


def resolve_token(token: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The bearer token to send: `token`, else `TROTH_TOKEN`, else None; checked.

    Raises:
        ConfigurationError: The token is empty or not one printable word (its
            value is never part of the message).
    """
    source = "token"
    given: object = token
    if given is None:
        given = environ.get(_ENV_TOKEN) or None
        source = _ENV_TOKEN
        if given is None:
            return None
    if not isinstance(given, str):
        raise ConfigurationError(
            f"{source} must be a string (got {type(given).__name__}); pass the bearer token "
            "itself, without 'Bearer '"
        )
    if not given:
        raise ConfigurationError(f"{source} is empty; pass the bearer token, or None to send none")
    if given.lower().startswith("bearer "):
        raise ConfigurationError(
            f"{source} starts with 'Bearer ': pass the token alone, troth adds the scheme"
        )
    if not (given.isascii() and given.isprintable()) or any(c.isspace() for c in given):
        raise ConfigurationError(
            f"{source} holds spaces, line breaks or non-ASCII characters (its value is "
            "not shown); a bearer token is one printable ASCII word: check how it was "
            "read (a token file's trailing newline is stripped for you by --token-file)"
        )
    return given


class _Secret(str):
    """A metadata value that is a secret: its repr never shows it (the value itself
    goes on the wire unchanged). Printing the metadata tuple shows `<redacted>`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<redacted>'"


def bearer_metadata(token: str) -> tuple[str, str]:
    """The `authorization: Bearer <token>` metadata pair (its value redacted in reprs)."""
    return (AUTHORIZATION_METADATA_KEY, _Secret(f"Bearer {token}"))


def is_loopback(address: str) -> bool:
    """Whether every server `address` names is on this machine (loopback or a Unix socket).

    Anything it cannot read (a gRPC target scheme it does not know, a name it
    would have to resolve other than `localhost`) counts as not loopback.
    """
    lowered = address.lower()
    if lowered.startswith(("unix:", "unix-abstract:")):
        return True
    if lowered.startswith(("ipv4:", "ipv6:")):
        entries = address.split(":", 1)[1].split(",")
    elif lowered.startswith("dns:"):
        rest = address[4:]
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:  # a DNS server named: the name is resolved over the network
                return False
        entries = [rest]
    elif lowered.startswith(("vsock:", "xds:")) or "://" in lowered:
        return False
    else:
        entries = [address]
    try:
        hosts = [split_host_port(entry.strip())[0] for entry in entries]
    except ConfigurationError:
        return False
    return all(_is_loopback_host(host) for host in hosts)


def _is_loopback_host(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def check_tls_target(addresses: Sequence[str], tls: TlsConfig | None) -> None:
    """Several replica addresses over TLS need the one name their certificates hold.

    gRPC dials them as one `ipv4:`/`ipv6:` target and checks every replica's
    certificate against a single name, which is none of the hosts listed.

    Raises:
        ConfigurationError: Several addresses, TLS, and no `server_name`.
    """
    if tls is None or tls.server_name is not None or len(addresses) < 2:
        return
    raise ConfigurationError(
        f"several server addresses over TLS ({', '.join(addresses)}) need the name their "
        "certificates are checked against, one for all of them: pass "
        "TlsConfig(server_name='troth.internal') (TROTH_TLS_SERVER_NAME, "
        "--tls-server-name), a name every replica's certificate holds"
    )


def check_token_channel(
    addresses: Sequence[str], *, tls: TlsConfig | None, token: str | None, allowed: bool
) -> None:
    """Refuse to send a bearer token in plaintext to an address off this machine.

    Raises:
        ConfigurationError: A token, no TLS, an address that is not loopback, and
            the caller did not say `allow_plaintext_token=True`.
    """
    if token is None or tls is not None or allowed:
        return
    remote = [address for address in addresses if not is_loopback(address)]
    if not remote:
        return
    raise ConfigurationError(
        f"refusing to send a bearer token in plaintext to {', '.join(remote)}: anyone on "
        "the network path could read it and call as you. Connect with TLS (tls=True for "
        "the system's roots, tls=troth.TlsConfig(ca_file=...), or TROTH_TLS_CA; "
        "--tls-ca for the CLI); or, when something else encrypts the path (a service "
        "mesh sidecar, a tunnel), pass allow_plaintext_token=True"
    )


def _read(name: str, path: str | os.PathLike[str] | None, marker: bytes) -> bytes | None:
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigurationError(f"TlsConfig {name} {os.fspath(path)!r}: no such file") from None
    except OSError as exc:
        raise ConfigurationError(
            f"TlsConfig {name} {os.fspath(path)!r}: cannot be read ({exc.strerror or exc}); "
            "check its permissions"
        ) from None
    if marker not in data:
        raise ConfigurationError(
            f"TlsConfig {name} {os.fspath(path)!r}: not PEM (no {marker.decode()!r} block); "
            "give a PEM file"
        )
    return data
