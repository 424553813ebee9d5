"""`troth console`'s flags: where it listens, which troth server it is a client of."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from troth import TlsConfig
from troth._durations import EXAMPLES, duration_ms, unit_hint
from troth.client import DEFAULT_ADDRESS

__all__ = ["DEFAULT_LISTEN", "ConsoleSettings", "settings_from"]

DEFAULT_LISTEN = "127.0.0.1:7080"


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """What the console serves on and what it talks to."""

    server: str = DEFAULT_ADDRESS
    """The troth server (host:port, or replicas comma-separated)."""
    listen: str = DEFAULT_LISTEN
    tls: TlsConfig | None = None
    """TLS to the troth server; None for plaintext."""
    timeout: float = 10.0
    """Seconds each call to the server may take."""
    secure_cookies: bool = False
    """Mark cookies `Secure` (when a TLS-terminating proxy fronts the console)."""
    port_file: str | None = None
    """Write the port bound here once serving (for scripts and tests; with port 0)."""

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


def _listen(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT; e.g. 127.0.0.1:7080 (port 0 picks a free one)"
        )
    return text


def _seconds(text: str) -> float:
    """A call timeout in the one duration syntax (`10s`, `1m30s`), as seconds."""
    ms = duration_ms(text)
    if ms is None:
        how = unit_hint(text) or f"write it like {EXAMPLES}"
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; {how}")
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0, e.g. 10s")
    return ms / 1000


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="troth console",
        description="Serve a web console (approvals inbox, workflows and their timelines, tasks, "
        "workers) that is a client of a troth server. Each person signs in with their own "
        "bearer token, and their decisions are made with it, so the server's approver "
        "policy applies; against a server run with --no-auth, signing in is optional.",
    )
    env = os.environ.get
    parser.add_argument(
        "--listen",
        type=_listen,
        default=env("TROTH_CONSOLE_LISTEN", DEFAULT_LISTEN),
        metavar="HOST:PORT",
        help="where the console serves HTTP (env TROTH_CONSOLE_LISTEN; default %(default)s)",
    )
    parser.add_argument(
        "--server",
        default=env("TROTH_SERVER", DEFAULT_ADDRESS),
        metavar="ADDR",
        help="the troth server, host:port or replicas' host:port,host:port "
        "(env TROTH_SERVER; default %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=10.0,
        metavar="DURATION",
        help="how long each call to the server may take, e.g. 10s or 1m (default 10s)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=env("TROTH_TLS", "").lower() == "true",
        help="connect over TLS, trusting the system's root certificates (env TROTH_TLS=true)",
    )
    for flag, variable, text in (
        ("--tls-ca", "TROTH_TLS_CA", "connect over TLS, trusting the CA certificates in FILE"),
        ("--tls-cert", "TROTH_TLS_CERT", "mTLS: present this client certificate (PEM)"),
        ("--tls-key", "TROTH_TLS_KEY", "the private key of --tls-cert (PEM)"),
        (
            "--tls-server-name",
            "TROTH_TLS_SERVER_NAME",
            "check the server's certificate against NAME (needed with several replicas)",
        ),
    ):
        parser.add_argument(
            flag,
            default=env(variable) or None,
            metavar="NAME" if flag == "--tls-server-name" else "FILE",
            help=f"{text} (env {variable})",
        )
    parser.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the sign-in cookies Secure (serve the console behind HTTPS then)",
    )
    parser.add_argument(
        "--port-file",
        metavar="FILE",
        help="write the bound port to FILE once serving (useful with --listen HOST:0)",
    )
    return parser


def settings_from(argv: list[str]) -> ConsoleSettings:
    args = parser().parse_args(argv)
    tls = None
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key:
        tls = TlsConfig(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            server_name=args.tls_server_name,
        )
    return ConsoleSettings(
        server=args.server,
        listen=args.listen,
        tls=tls,
        timeout=args.timeout,
        secure_cookies=args.secure_cookies,
        port_file=args.port_file,
    )
