"""The `troth` command's entry point: parse the command line, build the client, run
the command.

Only the command group named on the command line is imported and added to the
parser (`troth promises get` never imports the worker, the replay engine or the
approvals inbox); `troth --help`, or a word that is no command, builds them all.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from troth._cli.args import (
    GLOBAL_VALUE_FLAGS,
    Handler,
    Parser,
    client_from_args,
    global_options,
)
from troth._cli.server import FORWARDED
from troth._cli.server import add_commands as add_server_commands
from troth._cli.server import run as run_server_command
from troth._cli.streams import INTERRUPTED, Interrupts
from troth.errors import Reason, TrothError, UnauthenticatedError

__all__ = ["build_parser", "main", "version_text"]

if TYPE_CHECKING:
    from typing import TypeAlias

    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def _promises(commands: Commands) -> None:
    from troth._cli.promises import add_commands

    add_commands(commands)


def _replay(commands: Commands) -> None:
    from troth._cli.replay import add_commands

    add_commands(commands)


def _approvals(commands: Commands) -> None:
    from troth._cli.approvals import add_commands

    add_commands(commands)


def _tasks(commands: Commands) -> None:
    from troth._cli.tasks import add_commands

    add_commands(commands)


def _workflows(commands: Commands) -> None:
    from troth._cli.workflows import add_commands

    add_commands(commands)


def _workers(commands: Commands) -> None:
    from troth._cli.workers import add_commands

    add_commands(commands)


def _schedules(commands: Commands) -> None:
    from troth._cli.schedules import add_commands

    add_commands(commands)


def _worker(commands: Commands) -> None:
    from troth._cli.worker import add_commands

    add_commands(commands)


def _mcp(commands: Commands) -> None:
    from troth._cli.mcp import add_commands

    add_commands(commands)


_GROUPS: tuple[tuple[tuple[str, ...], Callable[[Commands], None]], ...] = (
    (("promises",), _promises),
    (("export", "replay"), _replay),
    (("approvals",), _approvals),
    (("tasks",), _tasks),
    (("workflows",), _workflows),
    (("workers",), _workers),
    (("schedules",), _schedules),
    (("worker",), _worker),
    (("mcp",), _mcp),
    (FORWARDED, add_server_commands),  # a small module: imported always
)
"""Each command group, in the order `troth --help` lists them: its command words, and
the function that adds them to the parser (importing its module)."""

_TOP_FLAGS = GLOBAL_VALUE_FLAGS | {"--json", "--tls", "--version", "--help"}


def version_text() -> str:
    """`troth --version`: the SDK's version, and troth-server's when it is installed."""
    from importlib import metadata

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    server = version("troth-server")
    return f"troth {version('troth') or 'unknown'}\n" + (
        f"troth-server {server}"
        if server
        else "troth-server not installed (pip install troth-server)"
    )


class _VersionAction(argparse._VersionAction):
    """`--version`, whose text (read from the installed packages' metadata) is looked
    up only when asked for."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        self.version = version_text()
        super().__call__(parser, namespace, values, option_string)


def command_word(argv: Sequence[str]) -> str | None:
    """The command named in `argv` (its first word that is no global flag nor a flag's
    value), or None. Flags are matched as argparse matches them, abbreviations too."""
    takes_value = False
    for word in argv:
        if takes_value:
            takes_value = False
            continue
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
        if word.startswith("--") and "=" not in word:
            matches = (
                [word] if word in _TOP_FLAGS else [f for f in _TOP_FLAGS if f.startswith(word)]
            )
            takes_value = len(matches) == 1 and matches[0] in GLOBAL_VALUE_FLAGS
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line of `troth`: with `argv`, only the group of the command it names
    (when it names one), else every group."""
    parser = Parser(
        prog="troth",
        description="Operate a troth durable-promise server.",
        epilog="Run `troth promises -h` for the promise commands.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # --version's two lines
    )
    parser.add_argument("--version", action=_VersionAction)
    global_options(parser, suppress=False)
    # Every parser below is a Parser too (argparse makes subparsers of the parent's class).
    commands = cast(
        "Commands", parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    )
    word = command_word(argv) if argv is not None else None
    named = [add for words, add in _GROUPS if word in words]
    for add in named or [add for _, add in _GROUPS]:
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `troth` command; return its exit status."""
    args_list = sys.argv[1:] if argv is None else list(argv)
    if args_list[:1] and args_list[0] in FORWARDED:
        return run_server_command(args_list[0], args_list[1:])
    parser = build_parser(args_list)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.command in FORWARDED:
        return run_server_command(args.command, list(getattr(args, f"{args.command}_args")))
    handler: Handler = args.handler
    out = sys.stdout
    try:
        with client_from_args(args) as client:
            if threading.current_thread() is not threading.main_thread():
                return handler(client, args, out)
            interrupts = Interrupts()  # Ctrl-C ends the command promptly (streams)
            interrupts.install()
            try:
                return handler(client, args, out)
            finally:
                interrupts.uninstall()
    except UnauthenticatedError as exc:
        print(f"troth: error: {not_authenticated(exc, args)}", file=sys.stderr)
        return 1
    except TrothError as exc:
        print(f"troth: error: {exc}", file=sys.stderr)
        for hint in getattr(exc, "__notes__", ()):  # what a command adds: what to do
            print(hint, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly. Point stdout at
        # devnull so the interpreter's final flush does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return 1


def not_authenticated(exc: UnauthenticatedError, args: argparse.Namespace) -> str:
    """The server refused the credentials: said with the command's ways to give a
    token (the server's own message speaks of any client's request metadata)."""
    if exc.reason == Reason.CREDENTIALS_MISSING:
        return (
            "not authenticated: this server wants a bearer token and none was sent: pass "
            "--token-file FILE, or set TROTH_TOKEN_FILE to the file or TROTH_TOKEN to the "
            f"token (an admin mints one with `troth tokens new`) [{exc.reason}]"
        )
    if args.token_file:
        source = f"the one in {args.token_file} (--token-file or TROTH_TOKEN_FILE)"
    elif os.environ.get("TROTH_TOKEN"):
        source = "the one in TROTH_TOKEN"
    else:
        return str(exc)
    return (
        f"{exc}; the token sent was {source}: check it, or ask an admin for a new one "
        "(`troth tokens new`)"
    )
