"""What a client proves and checks on the wire: TLS settings and the bearer token.

- `TlsConfig`: the CA that signed the server's certificate (or the system's
  roots), and for mTLS the client's own certificate and key; read from
  `Client(tls=...)` or from `TROTH_TLS`, `TROTH_TLS_CA`, `TROTH_TLS_CERT`,
  `TROTH_TLS_KEY`.
- the bearer token, sent as `authorization: Bearer <token>` metadata on every
  call: `TokenSource`, fixed (`Client(token="...")`, `TROTH_TOKEN`), from a
  callable (`Client(token=fn)`), or from a file it re-reads when it changes
  (`Client(token_file=...)`, `TROTH_TOKEN_FILE`), so that a long-lived process
  renews its token (a JWT before its `exp`) without restarting. The token is a
  secret: it never appears in a repr, a log line or an error message (a
  `_Secret` keeps it out of reprs of the metadata that carries it).
- the one rule joining them: a token is never sent in plaintext to an address
  that is not loopback (`check_token_channel`), where anyone on the path could
  read and replay it.

Plaintext to a loopback address stays the default for a local developer server.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from troth._addresses import split_host_port
from troth._grpc_args import SSL_TARGET_NAME_OVERRIDE_ARG
from troth.errors import ConfigurationError

__all__ = [
    "AUTHORIZATION_METADATA_KEY",
    "TOKEN_CHECK_S",
    "TlsConfig",
    "TokenSource",
    "TokenSupplier",
    "bearer_metadata",
    "check_tls_target",
    "check_token_channel",
    "is_loopback",
    "resolve_tls",
    "resolve_token",
    "token_source",
]

_log = logging.getLogger("troth.client")

AUTHORIZATION_METADATA_KEY = "authorization"
"""gRPC metadata key carrying `Bearer <token>`."""

_ENV_TLS = "TROTH_TLS"
_ENV_CA = "TROTH_TLS_CA"
_ENV_CERT = "TROTH_TLS_CERT"
_ENV_KEY = "TROTH_TLS_KEY"
_ENV_SERVER_NAME = "TROTH_TLS_SERVER_NAME"
_ENV_TOKEN = "TROTH_TOKEN"
_ENV_TOKEN_FILE = "TROTH_TOKEN_FILE"

TokenSupplier = Callable[[], str]
"""A callable that returns the bearer token to send now (`Client(token=fn)`)."""

TOKEN_CHECK_S = 1.0
"""How often, at most, a token supplier is asked again (or a token file looked at):
the token a call sends is at most this old, unless the server refuses it, when the
supplier is asked at once."""

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
        return ((SSL_TARGET_NAME_OVERRIDE_ARG, self.server_name),)

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
    """The fixed bearer token to send: `token`, else `TROTH_TOKEN`, else None; checked.

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
    return _checked(source, given)


def _checked(source: str, given: object) -> str:
    """`given` if it is a usable bearer token; else a `ConfigurationError` naming
    `source` (where it came from), never the value."""
    if not isinstance(given, str):
        raise ConfigurationError(
            f"{source} must be a string (got {type(given).__name__}); pass the bearer token "
            "itself, without 'Bearer ', or a callable returning it"
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
            "read (a token file's surrounding whitespace is stripped for you)"
        )
    return given


def token_source(
    token: str | TokenSupplier | None,
    token_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] = os.environ,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> TokenSource | None:
    """What `Client(token=..., token_file=...)` means: where the bearer token comes
    from, or None to send none.

    - `token` a string: that token, always;
    - `token` a callable: whatever it returns (`TokenSource` says when it is asked);
    - `token_file`: the file's content, re-read when it changes;
    - neither: the file `TROTH_TOKEN_FILE` names, else `TROTH_TOKEN`, else none.

    The first token is read (and checked) here.

    Raises:
        ConfigurationError: Both arguments given; the token unusable; the file
            missing, unreadable or empty; the callable raised.
    """
    if token is not None and token_file is not None:
        raise ConfigurationError(
            "token and token_file are both given: pass the token, a callable returning it, "
            "or the file holding it, one of them"
        )
    if callable(token):
        return TokenSource(_Supplier(token), "the token supplier (token=)", clock=clock)
    if token is None and token_file is None:
        token_file = environ.get(_ENV_TOKEN_FILE) or None
        label = _ENV_TOKEN_FILE
    else:
        label = "token_file"
    if token_file is not None:
        path = os.fspath(token_file)
        return TokenSource(_TokenFile(path), f"{label} {path!r}", clock=clock)
    fixed = resolve_token(token, environ)
    return None if fixed is None else TokenSource.fixed(fixed)


class _Unusable(Exception):
    """A token source could not give a token now: why (never the token itself)."""


class _Supplier:
    """A user's callable, asked for the token."""

    def __init__(self, supplier: TokenSupplier) -> None:
        self._supplier = supplier

    def __call__(self, *, force: bool) -> str:
        try:
            return self._supplier()
        except Exception as exc:
            # The exception is the caller's own; its message is theirs (the SDK never
            # gave the callable a token to put in it).
            raise _Unusable(f"raised {type(exc).__name__}: {exc}") from exc


class _TokenFile:
    """A file holding the token (surrounding whitespace stripped), read again when
    its size, modification time or inode change (a Kubernetes secret volume swaps a
    symlink), or when `force`d."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._seen: tuple[int, int, int] | None = None
        self._token = ""

    def __call__(self, *, force: bool) -> str:
        try:
            stat = os.stat(self._path)
            seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            if seen == self._seen and not force:
                return self._token
            token = Path(self._path).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise _Unusable("no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise _Unusable(f"cannot be read ({why}); check its permissions") from None
        if not token:
            raise _Unusable("is empty; put the bearer token in it")
        self._seen, self._token = seen, token
        return token


class TokenSource:
    """Where the bearer token comes from, and the `authorization` metadata to send now.

    A fixed token never changes. A callable is asked, and a file looked at, at most
    once per `TOKEN_CHECK_S` (by the first call after that, on its own thread; the
    calls meanwhile take the token it last gave), and at once by `refresh()`, which
    the SDK calls when the server refuses a token. The first token is read in the
    constructor: a source that cannot give one is a `ConfigurationError` there.
    Later, one that cannot (the file gone or empty, the callable raising or
    returning something unusable) keeps the last good token and logs a warning
    (once, until it gives a token again); a new token is logged at INFO. Neither
    log line, nor any message, shows a token.

    Thread-safe. `current()` costs a clock read and an attribute lookup while the
    token has not changed, and returns the same metadata pair object until it does.
    """

    def __init__(
        self,
        read: Callable[..., str],
        label: str,
        *,
        check_every: float = TOKEN_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.label = label
        """Where the token comes from, for messages (never the token)."""
        self._every, self._clock = check_every, clock
        self._lock = threading.Lock()
        self._problem: str | None = None
        try:
            token = _checked(label, read(force=True))
        except _Unusable as exc:
            raise ConfigurationError(f"{label}: {exc}") from exc.__cause__
        self._token = token
        self.pair: tuple[str, str] = bearer_metadata(token)
        """The `authorization` metadata pair of the current token."""
        self._next = clock() + check_every

    @classmethod
    def fixed(cls, token: str) -> TokenSource:
        """A token that never changes (already checked)."""
        return cls(lambda *, force: token, "token", check_every=math.inf)

    @property
    def renewable(self) -> bool:
        """Whether it may give another token later (a callable, a file), not a fixed one."""
        return not math.isinf(self._every)

    def current(self) -> tuple[str, str]:
        """The metadata pair to send now (asking the source again if it is time)."""
        if self._clock() < self._next:
            return self.pair
        return self._check(force=False)

    def refresh(self) -> tuple[str, str]:
        """Ask the source now (the server refused the token sent); the pair to send."""
        return self._check(force=True)

    def _check(self, *, force: bool) -> tuple[str, str]:
        # A routine check by one thread at a time; the others send the token they have.
        if not self._lock.acquire(blocking=force):
            return self.pair
        try:
            self._next = self._clock() + self._every
            try:
                token = _checked(self.label, self._read(force=force))
            except (_Unusable, ConfigurationError) as exc:
                why = str(exc).removeprefix(f"{self.label}: ").removeprefix(self.label + " ")
                if why != self._problem:
                    self._problem = why
                    _log.warning("%s: %s; still sending the last token it gave", self.label, why)
                return self.pair
            if self._problem is not None:
                self._problem = None
                _log.info("%s gives a usable token again", self.label)
            if token != self._token:
                self._token = token
                self.pair = bearer_metadata(token)
                _log.info("%s gave a new token; the next calls send it", self.label)
            return self.pair
        finally:
            self._lock.release()

    def __repr__(self) -> str:
        return f"TokenSource({self.label})"


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
    addresses: Sequence[str], *, tls: TlsConfig | None, token: object | None, allowed: bool
) -> None:
    """Refuse to send a bearer token in plaintext to an address off this machine.

    Decided once, for every token a source will ever give (`token` is the token or
    its `TokenSource`): the channel is what carries them all.

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
