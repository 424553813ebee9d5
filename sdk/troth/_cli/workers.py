"""`troth workers list [--group G]`: the workers connected to the server, what they run,
the tasks they hold, when they last heartbeat.

```
troth workers list [--group workers]
```

By group, then worker id. Each server knows the workers connected to it: with
several replicas, `--server` one of them at a time. With `--json`, one object
per worker, field names as in the proto's `Worker`.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from troth._cli.args import add_leaf
from troth._cli.output import align, iso, write_json
from troth._durations import format_duration

if TYPE_CHECKING:
    import argparse

    from troth._operators import WorkerInfo
    from troth.client import Client

_COLUMNS = ("GROUP", "WORKER", "WORKFLOWS", "HELD", "TASKS", "CONNECTED", "LAST HEARTBEAT")
_MOST_TASKS_SHOWN = 3


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `workers list` to the `troth` command line."""
    workers = commands.add_parser("workers", help="list the workers connected to the server")
    actions = workers.add_subparsers(dest="action", metavar="ACTION", required=True)
    description = (
        "list the workers connected to the server: their workflow versions, the tasks "
        "they hold, their last heartbeat"
    )
    listing = add_leaf(actions, "list", description, cmd_list)
    listing.add_argument("--group", metavar="GROUP", help="only this group's workers")


def cmd_list(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    found = client.list_workers(args.group)
    if args.json:
        for worker in found:
            write_json(worker_to_json(worker), out)
    elif found:
        out.write(format_workers(found, datetime.now(UTC)))
    else:
        where = f"of group {args.group!r} " if args.group else ""
        print(f"no worker {where}is connected to this server", file=sys.stderr)
    return 0


def worker_to_json(worker: WorkerInfo) -> dict[str, Any]:
    """A worker as a JSON-ready dict, field names as in the proto."""
    return {
        "worker_id": worker.worker_id,
        "group": worker.group,
        "principal": worker.principal,
        "workflows": [{"name": n, "version": v} for n, v in worker.workflows],
        "capacity": worker.capacity,
        "task_ids": list(worker.task_ids),
        "connect_time": iso(worker.connect_time),
        "last_heartbeat_time": iso(worker.last_heartbeat_time),
        "streams": worker.streams,
        "stalled": worker.stalled,
    }


def _ago(moment: datetime | None, now: datetime) -> str:
    return "-" if moment is None else f"{format_duration(now - moment)} ago"


def _tasks(task_ids: tuple[str, ...]) -> str:
    if not task_ids:
        return "-"
    shown = ",".join(task_ids[:_MOST_TASKS_SHOWN])
    more = len(task_ids) - _MOST_TASKS_SHOWN
    return shown + (f" (+{more})" if more > 0 else "")


def format_workers(found: list[WorkerInfo], now: datetime) -> str:
    """Workers as an aligned table with a header, ending in a newline."""
    rows = [_COLUMNS] + [
        (
            worker.group,
            worker.worker_id + (f" ({worker.principal})" if worker.principal else ""),
            ",".join(f"{n}@{v}" for n, v in worker.workflows) or "any",
            f"{len(worker.task_ids)}/{worker.capacity}",
            _tasks(worker.task_ids),
            _ago(worker.connect_time, now),
            _ago(worker.last_heartbeat_time, now) + (" (stalled)" if worker.stalled else ""),
        )
        for worker in found
    ]
    return align(rows)


__all__ = ["add_commands", "cmd_list", "format_workers", "worker_to_json"]
