"""`troth serve`, `troth db`, `troth tokens` and `troth console`: forwarded to
troth_server.cli, which implements them (they need troth-server)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import cast

from troth._install import INSTALL_SERVER

__all__ = ["FORWARDED", "add_commands", "run"]

FORWARDED = ("serve", "db", "tokens", "console")
"""The commands troth_server.cli runs: `main` forwards them before parsing."""

_SERVER_MISSING = "troth {command} needs the server, troth-server, which is not installed: "


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """List the forwarded commands, for `troth --help` only."""
    commands.add_parser(
        "serve", help="start a troth server (needs troth-server; see `troth serve --help`)"
    ).add_argument("serve_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "db",
        help="migrate the server's database or show its schema revision "
        "(needs troth-server; see `troth db --help`)",
    ).add_argument("db_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "tokens",
        help="mint bearer tokens for the server's token file "
        "(needs troth-server; see `troth tokens new --help`)",
    ).add_argument("tokens_args", nargs=argparse.REMAINDER)
    commands.add_parser(
        "console",
        help="serve the web console: approvals inbox, workflow timelines, tasks, workers "
        "(needs the console's dependencies: pip install './server[console]'; "
        "or serve it from the server: troth serve --console-listen 127.0.0.1:7080)",
    ).add_argument("console_args", nargs=argparse.REMAINDER)


def run(command: str, argv: list[str]) -> int:
    """`troth serve`, `troth db`, ...: troth_server.cli's function of that name."""
    # Imported by name, lazily: the SDK must not depend on troth_server (it
    # brings SQLAlchemy), and a static import would put it in troth's import graph.
    try:
        module = importlib.import_module("troth_server.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("troth_server", "troth_server.cli"):
            raise  # troth-server is installed but broken: show the real problem
        print(_SERVER_MISSING.format(command=command) + INSTALL_SERVER, file=sys.stderr)
        return 1
    entry = cast("Callable[[list[str]], int]", getattr(module, command))
    return entry(argv)
