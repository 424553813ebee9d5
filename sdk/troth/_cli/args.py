"""The `troth` command's shared arguments: the global flags, value types (durations,
JSON, tags, states), leaf commands, and the client the flags describe.

argparse turns an ArgumentTypeError into "argument --flag: <message>" and exit
status 2, so each message names the flag for free and says what to type.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from troth._durations import EXAMPLES, duration_ms, format_duration, unit_hint
from troth._promise import PromiseState
from troth.client import DEFAULT_ADDRESS, Client, TlsConfig
from troth.errors import ConfigurationError

__all__ = [
    "DEFAULT_LIMIT",
    "GLOBAL_VALUE_FLAGS",
    "Handler",
    "Parser",
    "add_leaf",
    "add_state_option",
    "add_tag_option",
    "client_from_args",
    "global_options",
    "parse_duration",
    "parse_json",
    "parse_json_or_word",
    "parse_moment",
    "parse_state",
    "parse_tag",
    "positive_int",
]

DEFAULT_LIMIT = 100
DEFAULT_TIMEOUT = timedelta(seconds=10)

Handler = Callable[[Client, argparse.Namespace, IO[str]], int]
"""A leaf command: runs with the client the flags describe, writes to `out`, returns
the exit status."""

_TLS_AND_TOKEN_FLAGS = (
    ("--tls-ca", "TROTH_TLS_CA", "connect over TLS, trusting the CA certificates in FILE"),
    ("--tls-cert", "TROTH_TLS_CERT", "mTLS: present this client certificate (PEM)"),
    ("--tls-key", "TROTH_TLS_KEY", "the private key of --tls-cert (PEM)"),
    (
        "--tls-server-name",
        "TROTH_TLS_SERVER_NAME",
        "check the server's certificate against NAME (needed with several replicas)",
    ),
    (
        "--token-file",
        "TROTH_TOKEN_FILE",
        "send the bearer token in FILE, read again when it changes (else env TROTH_TOKEN)",
    ),
)

GLOBAL_VALUE_FLAGS = frozenset(
    ["--server", "--principal", "--timeout"] + [flag for flag, _, _ in _TLS_AND_TOKEN_FLAGS]
)
"""The global flags that take a value (the next word, unless written `--flag=value`)."""


# --- argument types ---------------------------------------------------------


def parse_duration(text: str) -> timedelta:
    """Parse `30s`, `5m`, `2h`, `3d`, `250ms`, or a sum such as `1h30m` (`troth._durations`)."""
    ms = duration_ms(text)
    if hint := unit_hint(text):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: {hint}")
    if ms is None or (ms == 0 and text.strip() == "0"):
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit (ms, s, m, h, d), {EXAMPLES}"
        )
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: it must be more than 0")
    return timedelta(milliseconds=ms)


def parse_json(text: str) -> Any:
    """Parse a JSON value given on the command line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON {text!r} ({exc.msg} at character {exc.pos}); quote it for the "
            """shell and write strings in JSON quotes, e.g. '{"ok": true}' or '"text"'"""
        ) from None


def parse_json_or_word(text: str) -> Any:
    """Parse an argument given on the command line: a JSON value (`7`, `true`, `null`,
    `'{"draft": true}'`, `'"quoted"'`), or else the text itself as a string (`hello`);
    but text that opens like JSON and is not (`{bad`) is refused, not taken as a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.lstrip().startswith(_JSON_OPENERS):
            return text
        raise argparse.ArgumentTypeError(
            f"invalid JSON {text!r} ({exc.msg} at character {exc.pos}): a bare word that is "
            "not JSON is a string, but this opens like JSON; fix it, quoted for the shell, "
            """e.g. '{"draft": true}', '[1, 2]' or '"text"'"""
        ) from None


_JSON_OPENERS = ("{", "[", '"')


def parse_moment(text: str) -> datetime:
    """Parse a moment: an ISO 8601 time (`2026-12-06T08:00Z`, `2026-12-06`; UTC when it
    names no zone) or a duration ago (`30m`, `2h`, `3d`: that long before now)."""
    if duration_ms(text) is not None and not unit_hint(text):
        return datetime.now(UTC) - parse_duration(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: give an ISO 8601 time, e.g. 2026-12-06T08:00Z "
            f"(UTC when it names no zone), or a duration ago ({EXAMPLES})"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def parse_tag(text: str) -> tuple[str, str]:
    """Parse a `key=value` tag."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"invalid tag {text!r}: write key=value, e.g. --tag team=billing"
        )
    return key, value


def parse_state(text: str) -> PromiseState:
    """Parse a promise state name, case-insensitively."""
    try:
        return PromiseState(text.strip().upper())
    except ValueError:
        names = ", ".join(state.value for state in PromiseState)
        raise argparse.ArgumentTypeError(f"invalid state {text!r}: use one of {names}") from None


def positive_int(text: str) -> int:
    """Parse a count: 0 or more."""
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: use 0 or more")
    return number


# --- parser pieces ----------------------------------------------------------


def global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The flags every command takes: server, output, principal, timeout, TLS, token."""

    # The same flags sit on the top parser (with real defaults) and on every
    # leaf command (SUPPRESSed, so they only override when given), so both
    # `troth --json promises get X` and `troth promises get X --json` work.
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--server",
        metavar="ADDR",
        default=default(os.environ.get("TROTH_SERVER", DEFAULT_ADDRESS)),
        help="server host:port, or replicas' as host:port,host:port "
        "(env TROTH_SERVER; default %(default)s)"
        if not suppress
        else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="machine output: one JSON object per line" if not suppress else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--principal",
        metavar="NAME",
        default=default(os.environ.get("TROTH_PRINCIPAL")),
        help="who is calling, recorded as settled_by (env TROTH_PRINCIPAL)"
        if not suppress
        else argparse.SUPPRESS,
    )
    parser.add_argument(
        "--timeout",
        metavar="DURATION",
        type=parse_duration,
        default=default(DEFAULT_TIMEOUT),
        help=f"how long each call may take, retries included ({EXAMPLES}; "
        f"default {format_duration(DEFAULT_TIMEOUT)})"
        if not suppress
        else argparse.SUPPRESS,
    )
    # Transport security and credentials (troth._credentials): defaults from the
    # same TROTH_* variables Client reads, so flags override them one by one.
    for flag, env, help_text in _TLS_AND_TOKEN_FLAGS:
        parser.add_argument(
            flag,
            metavar="NAME" if flag == "--tls-server-name" else "FILE",
            default=default(os.environ.get(env) or None),
            help=f"{help_text} (env {env})" if not suppress else argparse.SUPPRESS,
        )
    parser.add_argument(
        "--tls",
        action="store_true",
        default=default(False),
        help="connect over TLS, trusting the system's root certificates (env TROTH_TLS=true)"
        if not suppress
        else argparse.SUPPRESS,
    )


class Parser(argparse.ArgumentParser):
    """The `troth` command's parsers: a leaf command adds the global flags (hidden from
    its help) only when it parses, so building the command line for one command does
    not build them for every other one."""

    leaf = False
    """Set on a leaf command (`add_leaf`): it takes the global flags too."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.leaf:
            self.leaf = False
            global_options(self, suppress=True)
        return super().parse_known_args(args, namespace)


def add_leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """A command that runs `handler`, with the global flags (which may follow it too)."""
    sub = commands.add_parser(name, help=help, description=help)
    if isinstance(sub, Parser):
        sub.leaf = True  # the global flags, added when it parses
    else:
        global_options(sub, suppress=True)
    sub.set_defaults(handler=handler)
    return sub


def add_tag_option(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """`--tag KEY=VALUE`, repeatable, into `args.tags` (a list of pairs)."""
    parser.add_argument(
        "--tag",
        dest="tags",
        action="append",
        type=parse_tag,
        default=[],
        metavar="KEY=VALUE",
        help=help,
    )


def add_state_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--state STATE`, repeatable, into `args.states` (a list of `PromiseState`)."""
    parser.add_argument(
        "--state",
        dest="states",
        action="append",
        type=parse_state,
        default=[],
        metavar="STATE",
        help=help,
    )


# --- the client the flags describe -------------------------------------------


def client_from_args(args: argparse.Namespace) -> Client:
    """A `Client` for one command: the flags' server, timeout, principal, TLS and token."""
    return Client(
        args.server,
        timeout=args.timeout.total_seconds(),
        principal=args.principal,
        tls=_tls_option(args),
        token_file=_token_file(args.token_file),
        multiplex_calls=False,  # a call or two, then exit: no stream to open
    )


def _tls_option(args: argparse.Namespace) -> TlsConfig | None:
    """`Client(tls=...)` from the flags (whose defaults are the TROTH_TLS_* variables)."""
    # As in Client: files (or --tls) turn TLS on; a server name alone does not.
    if args.tls or args.tls_ca or args.tls_cert or args.tls_key:
        return TlsConfig(
            ca_file=args.tls_ca,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
            server_name=args.tls_server_name,
        )
    return None


def _token_file(path: str | None) -> str | None:
    """`--token-file` checked, for Client(token_file=...) to read and re-read (a
    long-lived `troth worker` renews its token when the file changes); None without
    a file, so that Client reads TROTH_TOKEN. A file that cannot be used is named by
    its flag here."""
    if path is None:
        return None
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigurationError(f"--token-file {path}: cannot be read ({why})") from None
    if not token:
        raise ConfigurationError(f"--token-file {path}: is empty; put the bearer token in it")
    return path
