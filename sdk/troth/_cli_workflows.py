"""`troth workflows show ID` and `troth workflows fail ID --reason TEXT`.

```
troth workflows show ID            the root, its steps, and its task (attempts, last error,
                                   the traceback of a failing one)
troth workflows fail ID --reason TEXT
                                   reject the workflow's root with the reason (operators)
troth workflows move ID --to-current | --to-version V
                                   run it on other code: the newest version connected,
                                   or version V (operators)
```

A bug pauses a workflow, it does not lose it: an unexpected exception in its
code fails the *task*, which is retried with backoff while the root stays
PENDING. `show` says so (attempts, the last error and its traceback, when it
is retried); deploy fixed code to resume it from its checkpoints, or `fail`
it on purpose.

A run whose recorded version no connected worker runs waits, its decisions
recorded: `show` says "waiting for a worker of ... version X (none connected
since ...)". Start a worker of that version, or `move` the run to the code
deployed now: it replays its history there, and pauses with a
`NonDeterminismError` (shown by `show`) if that code does not fit it. With
`--json`, `show` writes one object `{"workflow": promise, "steps": [promise,
...], "task": task or null}`, `fail` the rejected root and `move` `{"workflow":
promise, "task": task or null}`.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from troth._cli import (
    _align,
    _when,
    _write_json,
    add_leaf,
    format_block,
    payload_preview,
    promise_to_json,
)
from troth._cli_tasks import _KINDS, _STATES, task_to_json
from troth._commands import TAG_INVOKE, TAG_KIND
from troth._convert import promise_from_proto
from troth._tasks import TaskCalls
from troth.client import connection
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth._promise import Promise
    from troth.client import Client

__all__ = ["add_commands", "cmd_fail", "cmd_move", "cmd_show", "format_task"]

_STEP_COLUMNS = ("STEP", "KIND", "STATE", "CREATED", "SETTLED", "SETTLED BY", "VALUE")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `workflows show` and `workflows fail` to the `troth` command line."""
    workflows = commands.add_parser(
        "workflows", help="show a workflow (its steps, its task, why it is stuck) or fail it"
    )
    actions = workflows.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = add_leaf(
        actions,
        "show",
        "show a workflow: its root, steps, and task (with the traceback of a failing one)",
        cmd_show,
    )
    show.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    fail = add_leaf(
        actions,
        "fail",
        "fail a workflow for good: reject its root with a reason (needs the operator role)",
        cmd_fail,
    )
    fail.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    fail.add_argument("--reason", required=True, metavar="TEXT", help="why it fails")
    move = add_leaf(
        actions,
        "move",
        "run a waiting workflow on other code: the newest version connected, or a given "
        "one (it replays there; needs the operator role)",
        cmd_move,
    )
    move.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    to = move.add_mutually_exclusive_group(required=True)
    to.add_argument(
        "--to-current",
        action="store_true",
        help="the newest version connected takes it (and records its own)",
    )
    to.add_argument("--to-version", metavar="V", help="the version to run it with")


def cmd_show(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    root = client.get(args.id)
    group = root.tags.get(TAG_INVOKE)
    if group is None:
        print(
            f"troth: error: promise {root.id!r} is not a workflow (it has no troth:invoke "
            f"tag); `troth promises get {root.id}` shows it",
            file=sys.stderr,
        )
        return 1
    # By their parent link, as the console reads them: named steps too, after the end.
    steps = client.workflow_steps(root.id)
    found = TaskCalls(connection(client)).search(group, 1, root.id)
    task = found[0] if found else None
    if args.json:
        _write_json(
            {
                "workflow": promise_to_json(root),
                "steps": [promise_to_json(step) for step in steps],
                "task": task_to_json(task) if task is not None else None,
            },
            out,
        )
        return 0
    out.write(format_block(root))
    out.write("\n")
    out.write(format_steps(steps) if steps else "no steps yet\n")
    out.write("\n")
    out.write(format_task(task, root))
    return 0


def cmd_fail(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    root = TaskCalls(connection(client)).fail_workflow(args.id, args.reason)
    if args.json:
        _write_json(promise_to_json(root), out)
    else:
        out.write(f"workflow {root.id} failed: its root is now {root.state}\n\n")
        out.write(format_block(root))
    return 0


def cmd_move(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    moved = TaskCalls(connection(client)).move_workflow(args.id, args.to_version)
    root = promise_from_proto(moved.root)
    task = moved.task if moved.HasField("task") else None
    if args.json:
        _write_json(
            {
                "workflow": promise_to_json(root),
                "task": task_to_json(task) if task is not None else None,
            },
            out,
        )
        return 0
    where = (
        f"version {args.to_version!r}"
        if args.to_version
        else ("the newest version connected (recorded when a worker takes it)")
    )
    out.write(f"workflow {root.id} moved to {where}: it replays its history there\n\n")
    out.write(format_task(task, root))
    return 0


def format_steps(steps: list[Promise]) -> str:
    """A workflow's steps as an aligned table, in creation order."""
    ordered = sorted(steps, key=lambda p: (p.create_time, p.id))
    rows = [_STEP_COLUMNS] + [
        (
            step.id,
            step.tags.get(TAG_KIND, "-"),
            step.state.value,
            _when(step.create_time),
            _when(step.settle_time),
            step.settled_by or "-",
            payload_preview(step.value),
        )
        for step in ordered
    ]
    return _align(rows)


def format_task(task: tasks_pb2.Task | None, root: Promise) -> str:
    """What the workflow's task is doing, and why it does not move if it failed."""
    if task is None:
        if root.is_settled:
            return "task: none (the workflow is over)\n"
        return "task: none now (the workflow waits on its steps)\n"
    state = _STATES.get(task.state, "?")
    lines = [f"task:      {_KINDS.get(task.kind, '?')} {state} ({task.id})"]
    if task.state == tasks_pb2.TASK_STATE_CLAIMED:
        lines.append(f"worker:    {task.worker_id}")
    elif task.waiting_for:
        lines.append(f"waiting:   {task.waiting_for}")
        if task.HasField("version_absent_since"):
            lines.append(
                "Its decisions are recorded; it resumes when a worker of version "
                f"{task.workflow_version!r} connects, or run `troth workflows move {root.id} "
                "--to-current` (or `--to-version V`) to replay it on other code, or "
                f"`troth workflows fail {root.id} --reason TEXT`."
            )
    if task.failed_attempts:
        lines.append(f"attempts:  {task.failed_attempts} failed")
        if task.HasField("next_attempt_time"):
            retry = _when(task.next_attempt_time.ToDatetime().replace(tzinfo=None))
            lines.append(f"retry at:  {retry}")
        lines.append(f"error:     {task.last_error}")
        lines.append(
            "The workflow stays pending: deploy fixed code to resume it from its "
            f"checkpoints, or run `troth workflows fail {root.id} --reason TEXT`."
        )
        if task.last_traceback:
            lines.append("traceback:")
            lines += [f"  {line}" for line in task.last_traceback.rstrip().splitlines()]
    return "\n".join(lines) + "\n"
