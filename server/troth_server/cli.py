"""Entry points the `troth` command delegates to: `troth serve`, `troth db`, `troth tokens`,
`troth console`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from troth_server.app import serve
from troth_server.console import missing_dependency

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["console", "db", "serve", "tokens"]


def db(argv: Sequence[str]) -> int:
    """`troth db upgrade|current`: migrate a database, or say where its schema stands."""
    parser = argparse.ArgumentParser(
        prog="troth db",
        description="Manage the troth database schema. A PostgreSQL database shared by "
        "replicas is migrated by an operator, once, before new servers start; the "
        "embedded SQLite default migrates itself on start.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        default=os.environ.get("TROTH_DB", "sqlite:///troth.db"),
        help="database URL (env TROTH_DB; default %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "upgrade", parents=[common], help="migrate the schema to this troth-server's revision"
    )
    current = commands.add_parser(
        "current", parents=[common], help="print the schema's revision and this troth-server's"
    )
    current.add_argument(
        "--check", action="store_true", help="exit with status 3 when the schema is not at head"
    )
    args = parser.parse_args(list(argv))

    from troth_server.store import StoreError
    from troth_server.store._migrate import schema_status, upgrade_database

    try:
        if args.command == "upgrade":
            before, after = upgrade_database(args.db)
            if before == after:
                print(f"already at revision {after} (head); nothing to do")
            else:
                print(f"upgraded from {before or 'an empty database'} to {after} (head)")
            return 0
        revision, head = schema_status(args.db)
        state = "at head" if revision == head else "behind: run `troth db upgrade`"
        print(f"database revision: {revision or '(empty)'}\nserver head:       {head}\n{state}")
        return 3 if args.check and revision != head else 0
    except StoreError as exc:
        print(f"troth db: {exc}", file=sys.stderr)
        return 1


def tokens(argv: Sequence[str]) -> int:
    """`troth tokens new`: mint a token-file entry (printed on stdout, hash only) and
    its token (printed once, on stderr, so that `>> tokens.toml` keeps it out of the file)."""
    parser = argparse.ArgumentParser(
        prog="troth tokens",
        description="Mint bearer tokens for a troth server's token file (--auth-tokens).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    new = commands.add_parser(
        "new",
        help="print a [[principal]] entry (the secret's scrypt hash only) and, once, its token",
        description="Print a new [[principal]] entry for the token file on stdout, and its "
        "token, once, on stderr: append the entry to the file, send SIGHUP to the server, "
        "and hand the token to its user (it is not stored anywhere).",
    )
    new.add_argument("--name", required=True, help="the principal's name (settled_by, logs)")
    new.add_argument(
        "--roles", required=True, help="comma-separated: worker, gateway, operator, admin"
    )
    new.add_argument(
        "--groups", default="", help="comma-separated task groups a worker may poll ('*': all)"
    )
    new.add_argument(
        "--prefixes", default="", help="comma-separated id prefixes it may see and touch"
    )
    new.add_argument(
        "--permissions",
        default="",
        help="comma-separated permission names approver policies may list (e.g. payouts:approve)",
    )
    new.add_argument(
        "--token-out",
        metavar="FILE",
        help="write the token to this new file (mode 0600) instead of printing it on stderr",
    )
    args = parser.parse_args(list(argv))

    from troth_server.auth import mint

    def split(text: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]

    try:
        minted = mint(
            args.name,
            split(args.roles),
            split(args.groups),
            split(args.prefixes),
            split(args.permissions),
        )
    except ValueError as exc:
        print(f"troth tokens: error: {exc}", file=sys.stderr)
        return 2
    if args.token_out:
        try:
            fd = os.open(args.token_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            print(f"troth tokens: error: {args.token_out}: {exc.strerror}", file=sys.stderr)
            return 1
        with os.fdopen(fd, "w") as out:
            out.write(minted.token + "\n")
    sys.stdout.write(minted.entry)
    sys.stdout.flush()
    if not args.token_out:
        print("# the token, shown once (the file keeps only its hash):", file=sys.stderr)
        print(minted.token, file=sys.stderr)
    return 0


def console(argv: Sequence[str]) -> int:
    """`troth console`: the web console, a client of a troth server (its web
    dependencies come with the `console` extra: Starlette, Jinja2, uvicorn)."""
    try:
        from troth_server.console._app import main
    except ModuleNotFoundError as exc:
        words = missing_dependency(exc)
        if words is None:
            raise
        print(f"troth console: error: {words}", file=sys.stderr)
        return 1
    return main(list(argv))
