"""`troth approvals`: the inbox of what waits for a human, from a shell.

```
troth approvals list [--mine] [--group G] [--older-than 2h] [--tag k=v ...]
                     [--order oldest|newest|deadline] [--limit N]
troth approvals approve ID [--value JSON] [--key K]
troth approvals reject ID [--reason TEXT | --value JSON] [--key K]
troth approvals watch [--group G] [--tag k=v ...]
```

An approval is a PENDING promise that a workflow created to wait on
(`ctx.promise()`: tag `troth:kind=promise`); `--group G` keeps those of
workflows of group G (tag `troth:group=G`, which the SDK puts on such steps);
`--mine` keeps those the caller (its token's principal) may settle now: the
server checks each one's approver policy (approvers, four-eyes, distinct
quorum), the caller's roles and its id prefixes.

`approve` resolves with `--value`, or with `true` when none is given; `reject`
rejects with `{"reason": TEXT}` for `--reason TEXT`, with `--value`, or with no
value. `--key` makes a repeat of the same command a no-op instead of an
`ALREADY_SETTLED` error. With `--json`: `list` writes one promise per line,
`watch` one `{"type": ..., "promise": {...}}` per event, `approve`/`reject`
`{"applied": bool, "promise": {...}}`.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from troth._cli.args import (
    DEFAULT_LIMIT,
    Handler,
    add_leaf,
    add_tag_option,
    parse_duration,
    parse_json,
    positive_int,
)
from troth._cli.output import (
    align,
    emit_listing,
    emit_result,
    promise_to_json,
    when,
    write_json,
)
from troth._cli.streams import follow
from troth._commands import TAG_GROUP, TAG_KIND, Kind
from troth._durations import format_duration
from troth._promise import PromiseEventType, PromiseOrder, PromiseState
from troth.errors import InvalidArgumentError

if TYPE_CHECKING:
    from troth._promise import Promise, PromiseEvent
    from troth.client import Client

APPROVE_DEFAULT: Any = True
"""What `approve` resolves with when no `--value` is given."""

_ORDERS = {
    "oldest": PromiseOrder.CREATED_ASC,
    "newest": PromiseOrder.CREATED_DESC,
    "deadline": PromiseOrder.EXPIRE_TIME_ASC,
}
_COLUMNS = ("ID", "TITLE", "AGE", "DEADLINE", "REQUESTED BY", "GROUP", "TAGS")
_TITLE_WIDTH = 40
_EVENT_WORDS = {
    PromiseEventType.CREATED: "waiting",
    PromiseEventType.SETTLED: "settled",
    PromiseEventType.TIMED_OUT: "timed out",
}


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `approvals` to the `troth` command line."""
    approvals = commands.add_parser(
        "approvals", help="the inbox: list, approve, reject and watch what waits for a human"
    )
    actions = approvals.add_subparsers(dest="action", metavar="ACTION", required=True)

    def leaf(name: str, help: str, handler: Handler) -> argparse.ArgumentParser:
        return add_leaf(actions, name, help, handler)

    listing = leaf("list", "list pending approvals, oldest first", _cmd_list)
    _filter_options(listing)
    listing.add_argument(
        "--mine",
        action="store_true",
        help="only those you may approve (checked by the server against each approver policy)",
    )
    listing.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="DURATION",
        help="only those waiting longer than this: 30m, 2h, 3d...",
    )
    listing.add_argument(
        "--order",
        choices=sorted(_ORDERS),
        default="oldest",
        help="oldest or newest first, or soonest deadline first (default %(default)s)",
    )
    listing.add_argument(
        "--limit",
        type=positive_int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help="show at most N (default %(default)s; 0 for all)",
    )

    approve = leaf("approve", "resolve an approval (default value: true)", _cmd_approve)
    approve.add_argument("id", metavar="ID")
    approve.add_argument(
        "--value", type=parse_json, metavar="JSON", help="""the decision, e.g. '{"level": 2}'"""
    )
    _key_option(approve)

    reject = leaf("reject", "reject an approval, with a reason", _cmd_reject)
    reject.add_argument("id", metavar="ID")
    why = reject.add_mutually_exclusive_group()
    why.add_argument("--reason", metavar="TEXT", help='rejects with {"reason": TEXT}')
    why.add_argument("--value", type=parse_json, metavar="JSON", help="rejects with this value")
    _key_option(reject)

    watch = leaf("watch", "print approvals as they arrive, settle and time out", _cmd_watch)
    _filter_options(watch)


def _filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", metavar="G", help="only approvals of workflows of group G")
    add_tag_option(parser, "only approvals with this tag (repeat for several)")


def _key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key",
        metavar="K",
        help="idempotency key: repeating the command with it succeeds without changing anything",
    )


def inbox_tags(group: str | None, tags: list[tuple[str, str]]) -> dict[str, str]:
    """The tags every approval listed or watched must carry."""
    wanted = {TAG_KIND: Kind.PROMISE.value, **dict(tags)}
    if group is not None:
        wanted[TAG_GROUP] = group
    return wanted


# --- commands ---------------------------------------------------------------


def _cmd_list(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    limit: int = args.limit
    results = client.search_all(
        states=[PromiseState.PENDING],
        tags=inbox_tags(args.group, args.tags),
        page_size=min(limit, 1000) if limit else None,
        order=_ORDERS[args.order],
        older_than=args.older_than,
        mine=args.mine,
    )
    shown = emit_listing(results, limit, promise_to_json if args.json else None, out)
    if not args.json:
        if shown:
            out.write(format_inbox(shown, datetime.now(UTC)))
        else:
            print("nothing waits for " + ("you" if args.mine else "a human"), file=sys.stderr)
    return 0


def _cmd_approve(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    value = APPROVE_DEFAULT if args.value is None else args.value
    try:
        result = client.resolve(args.id, value, idempotency_key=args.key)
    except InvalidArgumentError as exc:
        if args.value is None and (exc.field or "").startswith("value"):
            print(
                f"troth: the default value {value!r} does not fit this approval; "
                "pass --value JSON (`troth promises get ID` shows what it expects)",
                file=sys.stderr,
            )
        raise
    emit_result(result, args.json, out)
    return 0


def _cmd_reject(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    value = {"reason": args.reason} if args.reason is not None else args.value
    result = client.reject(args.id, value, idempotency_key=args.key)
    emit_result(result, args.json, out)
    return 0


def _cmd_watch(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    def reconnected() -> None:
        print(
            "troth: the watch reconnected; what happened meanwhile was missed: "
            "run `troth approvals list` to catch up",
            file=sys.stderr,
        )

    with client.watch_promises(
        tags=inbox_tags(args.group, args.tags), on_reconnect=reconnected
    ) as events:
        print("watching for approvals (Ctrl-C to stop)...", file=sys.stderr, flush=True)
        for event in follow(events, events.close):  # read on a thread: Ctrl-C ends it at once
            if args.json:
                write_json(
                    {"type": event.type.value, "promise": promise_to_json(event.promise)}, out
                )
            else:
                out.write(format_event(event) + "\n")
            out.flush()
    return 0


# --- output -----------------------------------------------------------------


def format_inbox(promises: list[Promise], now: datetime) -> str:
    """Approvals as an aligned table with a header, ending in a newline."""
    rows = [_COLUMNS] + [
        (
            p.id,
            _cut(p.title or "-", _TITLE_WIDTH),
            format_duration(now - p.create_time),
            "never" if p.expire_time is None else "in " + format_duration(p.expire_time - now),
            p.requested_by or "-",
            p.tags.get(TAG_GROUP, "-"),
            _user_tags(p),
        )
        for p in promises
    ]
    return align(rows)


def format_event(event: PromiseEvent) -> str:
    """One line for one event: when, what happened, the approval, and by whom."""
    p = event.promise
    moment = p.create_time if event.type is PromiseEventType.CREATED else p.settle_time
    line = f"{when(moment)}  {_EVENT_WORDS[event.type]:<9}  {p.id}"
    if p.title:
        line += f"  {_cut(p.title, _TITLE_WIDTH)!r}"
    if event.type is PromiseEventType.SETTLED:
        line += f"  {p.state.value}" + (f" by {p.settled_by}" if p.settled_by else "")
    elif event.type is PromiseEventType.CREATED and p.requested_by:
        line += f"  (requested by {p.requested_by})"
    return line


def _user_tags(promise: Promise) -> str:
    # The `troth:` tags are the SDK's bookkeeping: the same on every approval.
    shown = sorted((k, v) for k, v in promise.tags.items() if not k.startswith("troth:"))
    return ", ".join(f"{k}={v}" for k, v in shown) or "-"


def _cut(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
