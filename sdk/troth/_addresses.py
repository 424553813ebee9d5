"""Server addresses: what users pass to `Client`, checked, and the gRPC target made of it.

A client talks to one server address or to several replicas of one server:

- one address is handed to gRPC as it is, so any gRPC target works
  (`host:port`, `dns:///host:port`, `unix:/path`, ...);
- several are `host:port` entries, given as a sequence or as one
  comma-separated string (what `--server` and `TROTH_SERVER` carry). They
  become one static gRPC target, `ipv4:` or `ipv6:` followed by every IP
  address, host names resolved once, here.

Failover then lives in gRPC: the channel's `pick_first` policy connects to the
first address that answers and stays there; when that server goes away
(killed, stopped, unreachable) the channel goes idle and the next call
connects to the first address that answers again, which skips the dead one in
milliseconds because the connection is refused. Calls that failed in the
moment are retried by `troth._transport`'s retry loop and land on the
survivor; the worker's stream and heartbeats reconnect the same way.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence

from troth.errors import ConfigurationError

__all__ = ["Resolver", "channel_target", "parse_addresses", "split_host_port"]

Resolver = Callable[[str, int], Sequence[str]]
"""Host name and port to IP addresses (replaced in tests)."""

_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")
"""gRPC target schemes: a string starting with one is a single target, commas and all."""

_EXAMPLE = "e.g. '10.0.0.1:7070,10.0.0.2:7070'"
DEFAULT_PORT = 7070
"""The port of an address given without one (`troth serve` listens on 7070 by default)."""


def parse_addresses(address: str | Sequence[str]) -> tuple[str, ...]:
    """The server addresses in `address`, checked.

    Args:
        address: One address (`host:port` or any gRPC target); several as a
            sequence of `host:port` strings; or several as one string of
            `host:port` entries separated by commas (spaces around the
            commas are allowed).

    Returns:
        One address as given, or several `host:port` entries in order.

    Raises:
        ConfigurationError: Naming the bad entry and what to write instead.
    """
    given: object = address  # checked at run time: callers need not be typed
    if isinstance(given, str):
        if "," not in given or given.lower().startswith(_SCHEMES):
            return (_single(given),)
        source = repr(given)
        entries: list[object] = [entry.strip() for entry in given.split(",")]
    elif isinstance(given, Iterable) and not isinstance(given, bytes | bytearray):
        entries = list(given)
        source = repr(entries)
        if not entries:
            raise ConfigurationError(
                f"no server address given (an empty list); pass host:port, {_EXAMPLE}"
            )
        if len(entries) == 1 and isinstance(entries[0], str):
            return (_single(entries[0]),)
    else:
        raise ConfigurationError(
            f"server address {given!r} must be a 'host:port' string or a list of them, {_EXAMPLE}"
        )
    seen: set[str] = set()
    checked: list[str] = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, str):
            raise ConfigurationError(
                f"server address {entry!r} (entry {number} of {source}) is not a string; "
                "write each as 'host:port'"
            )
        if not entry or entry != entry.strip():
            raise ConfigurationError(
                f"server address {entry!r} (entry {number} of {source}) is empty or has "
                f"surrounding spaces; list host:port entries, {_EXAMPLE}"
            )
        entry = with_default_port(entry)
        split_host_port(entry)
        if entry in seen:
            raise ConfigurationError(
                f"server address {entry!r} is listed twice in {source}; list each replica once"
            )
        seen.add(entry)
        checked.append(entry)
    return tuple(checked)


def split_host_port(entry: str) -> tuple[str, int]:
    """`host:port` (or `[ipv6]:port`) as its host, without brackets, and port.

    Raises:
        ConfigurationError: A scheme, no port, a bad port, or a bare IPv6 address.
    """
    if entry.lower().startswith(_SCHEMES):
        raise ConfigurationError(
            f"server address {entry!r} is a gRPC target with a scheme, which cannot be "
            f"listed with others; list the replicas as host:port entries, {_EXAMPLE}"
        )
    if entry.startswith("["):
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise ConfigurationError(
                f"server address {entry!r} is not [ipv6]:port, e.g. '[::1]:7070'"
            )
        port = rest[1:]
    else:
        host, colon, port = entry.rpartition(":")
        if not colon or not host:
            raise ConfigurationError(
                f"server address {entry!r} is not host:port; add the port, e.g. '{entry}:7070'"
                if ":" not in entry
                else f"server address {entry!r} is not host:port, e.g. '10.0.0.1:7070'"
            )
        if ":" in host:
            raise ConfigurationError(
                f"server address {entry!r} looks like a bare IPv6 address; put it in "
                "brackets, e.g. '[::1]:7070'"
            )
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ConfigurationError(
            f"server address {entry!r} needs a host and a port from 1 to 65535, "
            "e.g. '10.0.0.1:7070'"
        )
    return host, int(port)


def channel_target(addresses: Sequence[str], *, resolve: Resolver | None = None) -> str:
    """The gRPC target for `addresses` (from `parse_addresses`).

    One address is its own target. Several become a static `ipv4:` list, or
    an `ipv6:` list when any address is IPv6 (IPv4 ones then written
    IPv4-mapped, which gRPC connects to over IPv4), in the order given, every
    IP address of a host name in the order the resolver returned them.

    Raises:
        ConfigurationError: A host name does not resolve.
    """
    if len(addresses) == 1:
        return addresses[0]
    resolve = resolve or _getaddrinfo
    ips: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]] = []
    for entry in addresses:
        host, port = split_host_port(entry)
        for ip in _resolve(entry, host, port, resolve):
            if (ip, port) not in ips:
                ips.append((ip, port))
    if all(ip.version == 4 for ip, _ in ips):
        return "ipv4:" + ",".join(f"{ip}:{port}" for ip, port in ips)
    return "ipv6:" + ",".join(
        f"[{ip if ip.version == 6 else f'::ffff:{ip}'}]:{port}" for ip, port in ips
    )


def _resolve(
    entry: str, host: str, port: int, resolve: Resolver
) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass  # a host name, not an IP literal
    try:
        found = [ipaddress.ip_address(ip) for ip in resolve(host, port)]
    except OSError as exc:
        raise ConfigurationError(
            f"cannot resolve the host of server address {entry!r} "
            f"({exc.strerror or exc}); check the name, or list IP addresses"
        ) from exc
    if not found:
        raise ConfigurationError(
            f"the host of server address {entry!r} resolves to no address; "
            "check the name, or list IP addresses"
        )
    return found


def _single(address: str) -> str:
    if not address or address != address.strip():
        raise ConfigurationError(
            f"server address {address!r} is empty or has surrounding spaces; "
            "pass host:port, e.g. '127.0.0.1:7070'"
        )
    return with_default_port(address)


def with_default_port(address: str) -> str:
    """`address` with `DEFAULT_PORT` added when it names a host without a port
    (`127.0.0.1`, `troth.internal`, `[::1]`); gRPC would otherwise take 443. A target
    with a scheme, a path, or a bare IPv6 address is left as it is."""
    if address.lower().startswith(_SCHEMES) or "/" in address:
        return address
    if address.startswith("["):
        return f"{address}:{DEFAULT_PORT}" if address.endswith("]") else address
    return address if ":" in address else f"{address}:{DEFAULT_PORT}"


def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # Link-local IPv6 results carry a %scope that the target syntax cannot: skip those.
    return [str(info[4][0]) for info in infos if "%" not in str(info[4][0])]
