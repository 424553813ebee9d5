"""`troth promises`: list, inspect, create, settle, watch and prune promises.

```
troth promises get ID
troth promises search [ID_GLOB] [--state S ...] [--tag k=v ...] [--limit N]
troth promises create ID [--param JSON] [--tag k=v ...] [--ttl 30s|5m|2h|3d] [--never-expires]
                         [--idempotency-key K] [--strict]
troth promises resolve|reject ID [--value JSON] [--idempotency-key K] [--strict]
                                 [--create-if-missing]
troth promises cancel ID [--value JSON] [--idempotency-key K] [--strict]
troth promises watch ID [--max-wait DURATION]
troth promises prune --older-than DURATION [--dry-run]
```

With `--json`, one JSON object per line: a promise, or for create and settles
`{"created"|"applied": bool, "promise": {...}}`.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from troth._cli.args import (
    DEFAULT_LIMIT,
    Handler,
    add_leaf,
    add_state_option,
    add_tag_option,
    parse_duration,
    parse_json,
    positive_int,
)
from troth._cli.output import (
    emit_listing,
    emit_promise,
    emit_result,
    format_table,
    promise_to_json,
    write_json,
)
from troth._promise import PromiseState

if TYPE_CHECKING:
    from datetime import timedelta

    from troth.client import Client

__all__ = ["add_commands"]

_PRUNE_TIMEOUT_S = 3600.0
"""A backlog of millions is pruned in many small transactions: give it time."""


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `promises` to the `troth` command line."""
    promises = commands.add_parser("promises", help="list, inspect, create and settle promises")
    actions = promises.add_subparsers(dest="action", metavar="ACTION", required=True)

    def leaf(name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        return add_leaf(actions, name, help, handler)

    get = leaf("get", "show one promise", _cmd_get)
    get.add_argument("id", metavar="ID")

    search = leaf("search", "list promises, newest last, following pages", _cmd_search)
    search.add_argument("id", metavar="ID_GLOB", nargs="?", default="*", help="`*` matches any run")
    add_state_option(
        search,
        "only this state (repeat for several): " + ", ".join(state.value for state in PromiseState),
    )
    add_tag_option(search)
    search.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help="show at most N promises (default %(default)s; 0 for all)",
    )

    create = leaf(
        "create", "create a pending promise (a repeat returns the existing one)", _cmd_create
    )
    create.add_argument("id", metavar="ID")
    create.add_argument("--param", type=parse_json, metavar="JSON", help="""e.g. '{"post": 7}'""")
    add_tag_option(create)
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl", type=parse_duration, metavar="DURATION", help="time out after 30s, 5m, 2h, 3d..."
    )
    expiry.add_argument("--never-expires", action="store_true", help="stay pending until settled")
    create.add_argument("--idempotency-key", metavar="KEY")
    create.add_argument(
        "--strict", action="store_true", help="a repeat succeeds only while the promise is pending"
    )

    for name, verb in (("resolve", "resolve"), ("reject", "reject"), ("cancel", "cancel")):
        settle = leaf(name, f"{verb} a pending promise", _settle_command(name))
        settle.add_argument("id", metavar="ID")
        settle.add_argument(
            "--value", type=parse_json, metavar="JSON", help="""e.g. '{"ok": true}'"""
        )
        settle.add_argument("--idempotency-key", metavar="KEY")
        settle.add_argument(
            "--strict",
            action="store_true",
            help="a repeat succeeds only if it asks for the state the promise was settled in",
        )
        if name != "cancel":
            settle.add_argument(
                "--create-if-missing",
                action="store_true",
                help="settle before the wait exists: an unknown id is created already settled",
            )

    watch = leaf("watch", "show a promise now, then again once it settles", _cmd_watch)
    watch.add_argument("id", metavar="ID")
    watch.add_argument(
        "--max-wait", type=parse_duration, metavar="DURATION", help="give up after this long"
    )

    prune = leaf(
        "prune",
        "delete settled promises older than a duration: finished workflows whole, and "
        "standalone promises (what the server's --retention does by itself)",
        _cmd_prune,
    )
    prune.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        metavar="DURATION",
        help="prune what settled longer ago than this, e.g. 30d",
    )
    prune.add_argument("--dry-run", action="store_true", help="count them; delete nothing")


# --- commands ---------------------------------------------------------------


def _cmd_get(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    promise = client.get(args.id)
    emit_promise(promise, args.json, out)
    return 0


def _cmd_search(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    limit: int = args.limit
    # Ask for no more than needed; the server caps large page sizes itself.
    page_size = min(limit, 1000) if limit else None
    results = client.search_all(
        args.id, states=args.states, tags=dict(args.tags), page_size=page_size
    )
    shown = emit_listing(results, limit, promise_to_json if args.json else None, out)
    if not args.json:
        if shown:
            out.write(format_table(shown))
        else:
            print("no promises match", file=sys.stderr)
    return 0


def _cmd_prune(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    from troth._convert import timedelta_to_proto
    from troth.client import connection
    from troth.v1 import promises_pb2

    calls = connection(client)
    request = promises_pb2.PrunePromisesRequest(
        older_than=timedelta_to_proto(args.older_than), dry_run=args.dry_run
    )
    answer = calls.call(calls.transport.promises.PrunePromises, request, timeout=_PRUNE_TIMEOUT_S)
    counts = {
        "pruned": answer.pruned,
        "workflows": answer.workflows,
        "standalone": answer.standalone,
        "dry_run": answer.dry_run,
    }
    if args.json:
        write_json(counts, out)
        return 0
    verb = "would prune" if answer.dry_run else "pruned"
    out.write(
        f"{verb} {answer.pruned} promises: {answer.workflows} finished workflows "
        f"(with their steps) and {answer.standalone} standalone promises\n"
    )
    return 0


def _cmd_create(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    result = client.create(
        args.id,
        args.param,
        tags=dict(args.tags),
        ttl=args.ttl,
        never_expires=args.never_expires,
        idempotency_key=args.idempotency_key,
        strict=args.strict,
    )
    emit_result(result, args.json, out)
    return 0


def _settle_command(action: str) -> Handler:
    def run(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
        if action == "cancel":
            result = client.cancel(
                args.id, args.value, idempotency_key=args.idempotency_key, strict=args.strict
            )
        else:
            settle = client.resolve if action == "resolve" else client.reject
            # An unknown id's NOT_FOUND names --create-if-missing itself (the server's
            # words, the same for every client).
            result = settle(
                args.id,
                args.value,
                idempotency_key=args.idempotency_key,
                strict=args.strict,
                create_if_missing=args.create_if_missing,
            )
        emit_result(result, args.json, out)
        return 0

    return run


def _cmd_watch(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    from troth._cli.streams import follow

    max_wait: timedelta | None = args.max_wait
    timeout = max_wait.total_seconds() if max_wait is not None else None
    # Read on a thread; Ctrl-C closes the client's channel, which ends the watch.
    promises = follow(client.watch(args.id, timeout=timeout), client.close)
    for count, promise in enumerate(promises):
        if count and not args.json:
            out.write("\n")
        emit_promise(promise, args.json, out)
        out.flush()
        if not promise.is_settled and not args.json:
            print(f"waiting for {promise.id} to settle (Ctrl-C to stop)...", file=sys.stderr)
    return 0
