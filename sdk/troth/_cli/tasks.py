"""`troth tasks list --group G`: a group's tasks not completed yet, and what each waits for.

```
troth tasks list --group workers [--limit N]
```

Oldest first. For a PENDING task, WAITING FOR says why no worker has it: e.g.
it needs a worker running the workflow version its root was started with and
none is connected (a rolling upgrade in progress), or every worker that could
run it is busy. A task whose workflow code raised (a bug: the root stays
PENDING and the task is retried with backoff) shows its failed ATTEMPTS, the
LAST ERROR and when it is retried; `troth workflows show ID` prints the whole
traceback. With `--json`, one object per task, field names as in the proto's
`Task`.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from troth._cli.args import DEFAULT_LIMIT, add_leaf
from troth._cli.output import (
    TASK_KINDS,
    TASK_STATES,
    align,
    first_line,
    task_time,
    task_to_json,
    write_json,
)
from troth._tasks import TaskCalls
from troth.client import connection
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth.client import Client

_MAX_LIMIT = 1000

_COLUMNS = ("ROOT", "KIND", "STATE", "WORKFLOW", "VERSION", "CREATED", "WORKER / WAITING FOR")
_FAILURE_COLUMNS = ("ATTEMPTS", "LAST ERROR")
"""Shown when a task failed: how often its workflow code raised, and the last error."""
_ERROR_WIDTH = 60


def _limit(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= _MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"invalid limit {text!r}: use a number from 1 to {_MAX_LIMIT}"
        )
    return number


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `tasks list` to the `troth` command line."""
    tasks = commands.add_parser("tasks", help="list a worker group's tasks and what they wait for")
    actions = tasks.add_subparsers(dest="action", metavar="ACTION", required=True)
    description = (
        "list a group's tasks that are not completed, oldest first, "
        "with what each pending one waits for"
    )
    listing = add_leaf(actions, "list", description, cmd_list)
    listing.add_argument("--group", required=True, metavar="GROUP", help="the worker group")
    listing.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N tasks (default %(default)s; at most {_MAX_LIMIT})",
    )


def cmd_list(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    found = TaskCalls(connection(client)).search(args.group, args.limit)
    if args.json:
        for task in found:
            write_json(task_to_json(task), out)
    elif found:
        out.write(format_tasks(found))
    else:
        print(f"group {args.group!r} has no task waiting or running", file=sys.stderr)
    if len(found) == args.limit:
        print(f"showing the oldest {args.limit}; pass --limit for more", file=sys.stderr)
    return 0


def format_tasks(found: list[tasks_pb2.Task]) -> str:
    """Tasks as an aligned table with a header, ending in a newline; with the failure
    columns when one of them failed."""
    failures = any(task.failed_attempts for task in found)
    rows = [_COLUMNS + (_FAILURE_COLUMNS if failures else ())] + [
        (
            task.root_promise_id,
            TASK_KINDS.get(task.kind, "?"),
            TASK_STATES.get(task.state, "?"),
            task.workflow or "-",
            task.workflow_version or "-",
            (task_time(task, "create_time") or "-").replace("T", " "),
            _doing(task),
        )
        + (
            (str(task.failed_attempts or "-"), first_line(task.last_error, _ERROR_WIDTH) or "-")
            if failures
            else ()
        )
        for task in found
    ]
    return align(rows)


def _doing(task: tasks_pb2.Task) -> str:
    """Who runs it, or what it waits for (a retry backoff first: nobody gets it before)."""
    if task.state == tasks_pb2.TASK_STATE_CLAIMED:
        return task.worker_id
    retry = task_time(task, "next_attempt_time")
    if retry is not None:
        return f"retry at {retry.replace('T', ' ')}"
    return task.waiting_for or "-"


__all__ = ["add_commands", "cmd_list", "format_tasks", "task_to_json"]
