"""Entry points the `troth` command delegates to: `troth serve` and `troth db`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from troth_server.app import serve

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["db", "serve"]


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
