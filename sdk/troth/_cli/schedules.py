"""`troth schedules`: workflows started on a cron schedule by the server (an operator's
or admin's commands; docs/schedules.md).

```
troth schedules create NAME --cron "0 9 * * 1-5" --workflow report --args '["sales"]' \\
    --group workers [--timezone Europe/Paris] [--catch-up skip|one|all] [--jitter 5m] \\
    [--ttl 2h] [--paused]
troth schedules update NAME [--cron ...] [--workflow ...] [--args ...] [...]
troth schedules list
troth schedules show NAME
troth schedules pause NAME
troth schedules resume NAME
troth schedules delete NAME
```

With `--json`, one object per schedule, field names as in the proto's `Schedule`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from troth._cli.args import add_leaf, parse_duration
from troth._cli.output import align, iso, payload_to_json, when, write_json
from troth._durations import format_duration

if TYPE_CHECKING:
    from datetime import datetime

    from troth._schedules import ScheduleInfo
    from troth.client import Client

_COLUMNS = ("NAME", "CRON", "TIME ZONE", "WORKFLOW", "GROUP", "CATCH-UP", "NEXT TICK", "LAST RUN")


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"invalid JSON {text!r} ({exc.msg} at character {exc.pos}): give the workflow's "
            """arguments as a JSON list, quoted for the shell, e.g. '["sales", 7]'"""
        ) from exc
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a JSON list: give the arguments as one, e.g. '[\"sales\"]'"
        )
    return value


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `schedules` to the `troth` command line."""
    schedules = commands.add_parser(
        "schedules", help="create, update, list, show, pause, resume or delete schedules"
    )
    actions = schedules.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = add_leaf(
        actions,
        "create",
        "start a workflow at every tick of a cron expression, one run per tick (its id "
        "NAME@<tick in UTC>); needs the operator or admin role",
        cmd_create,
    )
    create.add_argument("name", metavar="NAME", help="the schedule's name, e.g. nightly")
    create.add_argument(
        "--cron",
        required=True,
        help='5 fields: minute hour day-of-month month day-of-week, e.g. "0 9 * * 1-5"',
    )
    create.add_argument("--workflow", required=True, help="the registered workflow's name")
    create.add_argument(
        "--args",
        type=_json_list,
        default=[],
        metavar="JSON",
        help="""its arguments after ctx, as a JSON list, e.g. '["sales", 7]' (default none)""",
    )
    create.add_argument(
        "--group", default="workers", help="the group whose workers run it (default workers)"
    )
    create.add_argument(
        "--timezone", default="UTC", help="the IANA time zone the cron is read in (default UTC)"
    )
    create.add_argument(
        "--catch-up",
        default="skip",
        metavar="POLICY",
        help="after downtime: skip (default) missed ticks, run one for them, or run all "
        "(at most the latest 50)",
    )
    create.add_argument(
        "--jitter", type=parse_duration, help="each tick fires up to this much later, e.g. 5m"
    )
    create.add_argument(
        "--ttl", type=parse_duration, help="each run's lifetime (default: the server's)"
    )
    create.add_argument("--paused", action="store_true", help="create it paused")
    update = add_leaf(
        actions,
        "update",
        "change a schedule's definition (the flags given; the rest is kept): it runs from "
        "the new definition's first tick after now",
        cmd_update,
    )
    update.add_argument("name", metavar="NAME", help="the schedule's name")
    update.add_argument("--cron", help="5 fields: minute hour day-of-month month day-of-week")
    update.add_argument("--workflow", help="the registered workflow's name")
    update.add_argument("--args", type=_json_list, metavar="JSON", help="a JSON list")
    update.add_argument("--group", help="the group whose workers run it")
    update.add_argument("--timezone", help="the IANA time zone the cron is read in")
    update.add_argument("--catch-up", metavar="POLICY", help="skip, one or all")
    update.add_argument("--jitter", type=parse_duration, help="e.g. 5m (0s: none)")
    update.add_argument("--ttl", type=parse_duration, help="each run's lifetime")
    add_leaf(actions, "list", "list the schedules, by name", cmd_list)
    for action, help_text, handler in (
        ("show", "show a schedule: its definition, next tick and last run", cmd_show),
        ("pause", "pause a schedule: no tick fires until it is resumed", cmd_pause),
        ("resume", "resume a schedule from its first tick after now", cmd_resume),
        ("delete", "delete a schedule (its runs are left as they are)", cmd_delete),
    ):
        leaf = add_leaf(actions, action, help_text, handler)
        leaf.add_argument("name", metavar="NAME", help="the schedule's name")


def cmd_create(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    schedule = client.schedules.create(
        args.name,
        args.workflow,
        *args.args,
        cron=args.cron,
        group=args.group,
        timezone=args.timezone,
        catch_up=args.catch_up,
        jitter=args.jitter,
        ttl=args.ttl,
        paused=args.paused,
    )
    return _emit(schedule, args, out, f"schedule {schedule.name} created")


def cmd_update(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    schedule = client.schedules.update(
        args.name,
        cron=args.cron,
        workflow=args.workflow,
        args=args.args,
        group=args.group,
        timezone=args.timezone,
        catch_up=args.catch_up,
        jitter=args.jitter,
        ttl=args.ttl,
    )
    return _emit(schedule, args, out, f"schedule {schedule.name} updated")


def cmd_list(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    found = client.schedules.list()
    if args.json:
        for schedule in found:
            write_json(schedule_to_json(schedule), out)
    elif found:
        out.write(format_schedules(found))
    else:
        print("no schedule; `troth schedules create` makes one", file=sys.stderr)
    return 0


def cmd_show(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    return _emit(client.schedules.get(args.name), args, out, None)


def cmd_pause(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    return _emit(client.schedules.pause(args.name), args, out, f"schedule {args.name} paused")


def cmd_resume(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    schedule = client.schedules.resume(args.name)
    return _emit(schedule, args, out, f"schedule {args.name} resumed")


def cmd_delete(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    schedule = client.schedules.delete(args.name)
    return _emit(schedule, args, out, f"schedule {args.name} deleted")


def _emit(schedule: ScheduleInfo, args: argparse.Namespace, out: IO[str], said: str | None) -> int:
    if args.json:
        write_json(schedule_to_json(schedule), out)
        return 0
    if said:
        out.write(said + "\n\n")
    out.write(format_block(schedule))
    return 0


def schedule_to_json(schedule: ScheduleInfo) -> dict[str, Any]:
    """A schedule as a JSON-ready dict, field names as in the proto."""
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "workflow": schedule.workflow,
        "group": schedule.group,
        "args": payload_to_json(schedule.args),
        "catch_up": schedule.catch_up,
        "jitter": format_duration(schedule.jitter),
        "ttl": None if schedule.ttl is None else format_duration(schedule.ttl),
        "paused": schedule.paused,
        "next_tick_time": iso(schedule.next_tick_time),
        "next_fire_time": iso(schedule.next_fire_time),
        "last_tick_time": iso(schedule.last_tick_time),
        "last_run_id": schedule.last_run_id,
        "skipped": schedule.skipped,
        "created_by": schedule.created_by,
        "create_time": iso(schedule.create_time),
        "update_time": iso(schedule.update_time),
    }


def format_block(schedule: ScheduleInfo) -> str:
    """One schedule, a field per line."""
    rows = [
        ("name", schedule.name),
        ("cron", f"{schedule.cron} ({schedule.timezone})"),
        ("workflow", f"{schedule.workflow} on group {schedule.group}"),
        ("args", json.dumps(payload_to_json(schedule.args))),
        ("catch-up", schedule.catch_up),
        ("jitter", format_duration(schedule.jitter) if schedule.jitter else "none"),
        ("ttl", format_duration(schedule.ttl) if schedule.ttl else "the server's default"),
        ("state", "paused" if schedule.paused else "active"),
        ("next tick", _local(schedule.next_tick_time, schedule.timezone)),
        ("fires at", when(schedule.next_fire_time)),
        ("last run", schedule.last_run_id or "-"),
        ("skipped", str(schedule.skipped)),
        ("created by", schedule.created_by or "-"),
    ]
    return align(rows)


def _local(moment: datetime | None, timezone: str) -> str:
    """`2026-12-07 01:00:00Z (02:00 Europe/Paris)`: the tick, and in its time zone."""
    if moment is None or timezone == "UTC":
        return when(moment)
    try:
        local = moment.astimezone(ZoneInfo(timezone))
    except (ZoneInfoNotFoundError, ValueError):
        return when(moment)
    return f"{when(moment)} ({local:%H:%M} {timezone})"


def format_schedules(found: list[ScheduleInfo]) -> str:
    rows = [_COLUMNS] + [
        (
            s.name,
            s.cron,
            s.timezone,
            s.workflow,
            s.group,
            s.catch_up,
            "paused" if s.paused else when(s.next_tick_time),
            s.last_run_id or "-",
        )
        for s in found
    ]
    return align(rows)


__all__ = ["add_commands", "format_schedules", "schedule_to_json"]
