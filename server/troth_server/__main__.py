"""`python -m troth_server serve|db|tokens|console ...`: the same as `troth serve ...` etc."""

from __future__ import annotations

import sys

from troth_server.cli import console, db, serve, tokens


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["db"]:
        return db(args[1:])
    if args[:1] == ["tokens"]:
        return tokens(args[1:])
    if args[:1] == ["console"]:
        return console(args[1:])
    if args[:1] == ["serve"]:
        args = args[1:]
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
