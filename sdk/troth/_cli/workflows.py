"""`troth workflows`: list, start, show, cancel, retry, fail and move workflows.

```
troth workflows list [ID_GLOB] [--state S ...] [--group G] [--workflow NAME] [--version V]
                     [--paused] [--waiting-for-human] [--started-after T] [--started-before T]
                     [--limit N | --all] [--oldest-first]
                                   the workflows matching every filter, newest first: state
                                   (PAUSED for a run a bug pauses), group, workflow@version,
                                   started, what it waits on; T an ISO time or a duration ago
troth workflows start NAME [ARGS...] --id ID --group GROUP [--ttl DURATION]
                                   start workflow NAME as `Client.start` does; each ARG
                                   a JSON value, or a bare word taken as a string
troth workflows cancel ID [--reason TEXT]
                                   cancel the workflow: its root, and the steps that wait
troth workflows show ID            the root, its steps, and its task (attempts, last error,
                                   the traceback of a failing one)
troth workflows retry-now ID       a paused run's task, delivered now instead of after its
                                   backoff (to the code you fixed and deployed; operators)
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
promise, "task": task or null}`; `list` one object per workflow `{"id", "state",
"paused", "group", "workflow", "version", "root": promise, "task": task or null,
"waiting_on": [promise, ...]}`, `start` `{"created": bool, "workflow": promise}`,
`cancel` the cancelled root and `retry-now` the task.

`show` reads the steps by their link to the workflow (`Client.workflow_steps`),
so a step with an id of its own, such as a human decision made with
`ctx.promise(id=...)`, is listed with who settled it, when and with what value,
after the run ended too.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, TYPE_CHECKING

from troth._cli.args import (
    DEFAULT_LIMIT,
    add_leaf,
    add_state_option,
    parse_duration,
    parse_json_or_word,
    parse_moment,
)
from troth._cli.output import (
    TASK_KINDS,
    TASK_STATES,
    align,
    emit_promise,
    first_line,
    format_block,
    payload_preview,
    promise_to_json,
    task_info_to_json,
    task_to_json,
    when,
    write_json,
)
from troth._cli.states import add_state_commands
from troth._convert import promise_from_proto
from troth._operators import TaskState
from troth._tags import TAG_INVOKE, TAG_KIND
from troth._tasks import TaskCalls
from troth.client import connection
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from collections.abc import Iterable

    from troth._operators import TaskInfo, WorkflowInfo
    from troth._promise import Promise
    from troth.client import Client

__all__ = [
    "add_commands",
    "cmd_cancel",
    "cmd_fail",
    "cmd_list",
    "cmd_move",
    "cmd_retry_now",
    "cmd_show",
    "cmd_start",
    "format_task",
    "format_workflows",
]

_STEP_COLUMNS = ("STEP", "KIND", "STATE", "CREATED", "SETTLED", "SETTLED BY", "VALUE")
_LIST_COLUMNS = ("ID", "STATE", "GROUP", "WORKFLOW", "STARTED", "WAITING ON")
_WAITING_WIDTH = 80


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `workflows` to the `troth` command line."""
    workflows = commands.add_parser(
        "workflows",
        help="list, start, show, cancel, retry, fail or move workflows, or rewrite their state",
    )
    actions = workflows.add_subparsers(dest="action", metavar="ACTION", required=True)
    _add_list(actions)
    start = add_leaf(
        actions,
        "start",
        "start a workflow by id, once (a repeat of the same start changes nothing; needs "
        "the gateway role)",
        cmd_start,
    )
    start.add_argument("name", metavar="NAME", help="the workflow's registered name")
    start.add_argument(
        "args",
        metavar="ARGS",
        nargs="*",
        type=parse_json_or_word,
        help="""its arguments after ctx: each a JSON value (7, true, '{"draft": true}', """
        """'"text"') or a bare word, taken as a string""",
    )
    start.add_argument(
        "--id", required=True, metavar="ID", help="the workflow's id, e.g. publish-post-7"
    )
    start.add_argument(
        "--group", required=True, metavar="GROUP", help="the group whose workers run it"
    )
    start.add_argument(
        "--ttl",
        type=parse_duration,
        metavar="DURATION",
        help="how long it may take in all: 30m, 2h, 3d... (default: the server's)",
    )
    start.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="a repeat carrying it gets the existing run, whatever its arguments",
    )
    cancel = add_leaf(
        actions,
        "cancel",
        "cancel a workflow: its root and the steps that wait (needs the operator role)",
        cmd_cancel,
    )
    cancel.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
    cancel.add_argument(
        "--reason", metavar="TEXT", help='why: the root is cancelled with {"reason": TEXT}'
    )
    retry = add_leaf(
        actions,
        "retry-now",
        "retry a paused workflow now, not after its backoff: once you deployed fixed code "
        "(needs the operator role)",
        cmd_retry_now,
    )
    retry.add_argument("id", metavar="ID", help="the workflow's id (its root promise)")
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
    add_state_commands(actions)


def _add_list(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = add_leaf(
        actions,
        "list",
        "list workflows, newest first: those matching every filter given",
        cmd_list,
    )
    listing.add_argument(
        "id", metavar="ID_GLOB", nargs="?", help="only ids matching; `*` matches any run"
    )
    add_state_option(
        listing,
        "only this state of the root (repeat for several): PENDING while it runs or waits",
    )
    listing.add_argument("--group", metavar="GROUP", help="only this worker group's")
    listing.add_argument("--workflow", metavar="NAME", help="only workflows of this name")
    listing.add_argument(
        "--version", metavar="V", help="only those recorded at this version of their code"
    )
    listing.add_argument(
        "--paused", action="store_true", help="only those a bug pauses (their code failed)"
    )
    listing.add_argument(
        "--waiting-for-human",
        action="store_true",
        help="only those waiting on a decision no worker makes",
    )
    for edge, word in (("after", "at or after"), ("before", "before")):
        listing.add_argument(
            f"--started-{edge}",
            type=parse_moment,
            metavar="TIME",
            help=f"only those started {word} TIME: an ISO time (2026-12-06T08:00Z) "
            "or a duration ago (2h, 3d)",
        )
    how_many = listing.add_mutually_exclusive_group()
    how_many.add_argument(
        "--limit",
        type=_at_least_one,
        default=DEFAULT_LIMIT,
        metavar="N",
        help="show at most N (default %(default)s)",
    )
    how_many.add_argument("--all", action="store_true", help="every one, page after page")
    listing.add_argument("--oldest-first", action="store_true", help="the oldest first")


def _at_least_one(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"invalid limit {text!r}: use 1 or more, or --all")
    return number


def cmd_list(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    filters = {
        "id": args.id,
        "states": args.states,
        "group": args.group,
        "workflow": args.workflow,
        "version": args.version,
        "paused": args.paused,
        "waiting_for_human": args.waiting_for_human,
        "created_after": args.started_after,
        "created_before": args.started_before,
        "newest_first": not args.oldest_first,
    }
    found: Iterable[WorkflowInfo]
    if args.all:
        found = client.iter_workflows(**filters)
    else:
        found = client.search_workflows(**filters, limit=args.limit + 1)  # one more: are there?
    shown: list[WorkflowInfo] = []
    for workflow in found:
        if not args.all and len(shown) == args.limit:
            print(f"showing the first {args.limit}; pass --limit N or --all", file=sys.stderr)
            break
        if args.json:
            write_json(workflow_to_json(workflow), out)
        shown.append(workflow)
    if not args.json:
        if shown:
            out.write(format_workflows(shown))
        else:
            print("no workflows match", file=sys.stderr)
    return 0


def workflow_to_json(workflow: WorkflowInfo) -> dict[str, object]:
    """A workflow as `list --json` writes it."""
    return {
        "id": workflow.id,
        "state": workflow.state.value,
        "paused": workflow.paused,
        "group": workflow.group,
        "workflow": workflow.workflow,
        "version": workflow.version,
        "root": promise_to_json(workflow.root),
        "task": task_info_to_json(workflow.task) if workflow.task is not None else None,
        "waiting_on": [promise_to_json(step) for step in workflow.waiting_on],
    }


def format_workflows(found: list[WorkflowInfo]) -> str:
    """Workflows as an aligned table with a header, ending in a newline."""
    rows = [_LIST_COLUMNS] + [
        (
            workflow.id,
            _state(workflow),
            workflow.group,
            workflow.workflow + (f"@{workflow.version}" if workflow.version else ""),
            when(workflow.root.create_time),
            _waiting_on(workflow),
        )
        for workflow in found
    ]
    return align(rows)


def _state(workflow: WorkflowInfo) -> str:
    if workflow.paused and workflow.task is not None:
        attempts = workflow.task.failed_attempts
        return f"PAUSED ({attempts} failed {'attempt' if attempts == 1 else 'attempts'})"
    return workflow.state.value


def _waiting_on(workflow: WorkflowInfo) -> str:
    """`-` once over; else a human decision's id, or what its task does or waits for."""
    if workflow.root.is_settled:
        return "-"  # a task left behind ends when its worker hears of it
    if workflow.waiting_on:
        return ", ".join(step.id for step in workflow.waiting_on)
    task = workflow.task
    if task is None:
        return "its steps"
    if task.state is TaskState.CLAIMED:
        return f"running on {task.worker_id}"
    if workflow.paused and task.last_error:
        retry = when(task.next_attempt_time)
        return first_line(f"retry at {retry}: {task.last_error}", _WAITING_WIDTH)
    return first_line(task.waiting_for or "a worker", _WAITING_WIDTH)


def cmd_retry_now(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    task = client.retry_workflow_now(args.id)
    if args.json:
        write_json(task_info_to_json(task), out)
        return 0
    out.write(
        f"workflow {args.id} is retried now: its task goes to a worker of group {task.group} "
        f"at once ({_failures(task)}); `troth workflows show {args.id}` follows it\n"
    )
    return 0


def _failures(task: TaskInfo) -> str:
    times = "once" if task.failed_attempts == 1 else f"{task.failed_attempts} times"
    return f"its code failed {times}, last: {task.last_error or '-'}"


def cmd_start(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    handle = client.start(
        args.name,
        *args.args,
        id=args.id,
        group=args.group,
        ttl=args.ttl,
        idempotency_key=args.idempotency_key,
    )
    root = client.get(handle.id)
    if args.json:
        write_json({"created": handle.created, "workflow": promise_to_json(root)}, out)
        return 0
    if handle.created:
        out.write(
            f"started {root.id}: workflow {args.name} on group {args.group}; "
            f"`troth workflows show {root.id}` follows it\n\n"
        )
    else:
        out.write(f"{root.id} already existed; this start was a repeat and changed nothing\n\n")
    out.write(format_block(root))
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    root = client.get(args.id)
    if TAG_INVOKE not in root.tags:
        return _not_a_workflow(root, f"`troth promises cancel {root.id}` cancels a promise")
    value = {"reason": args.reason} if args.reason is not None else None
    cancelled = client.cancel(root.id, value).promise
    if args.json:
        emit_promise(cancelled, True, out)
    else:
        out.write(f"workflow {root.id} cancelled: its root is now {cancelled.state}\n\n")
        out.write(format_block(cancelled))
    return 0


def _not_a_workflow(root: Promise, instead: str) -> int:
    print(
        f"troth: error: promise {root.id!r} is not a workflow (it has no troth:invoke "
        f"tag); {instead}",
        file=sys.stderr,
    )
    return 1


def cmd_show(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    root = client.get(args.id)
    group = root.tags.get(TAG_INVOKE)
    if group is None:
        return _not_a_workflow(root, f"`troth promises get {root.id}` shows it")
    # By their parent link, as the console reads them: named steps too, after the end.
    steps = client.workflow_steps(root.id)
    found = TaskCalls(connection(client)).search(group, 1, root.id)
    task = found[0] if found else None
    if args.json:
        write_json(
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
        write_json(promise_to_json(root), out)
    else:
        out.write(f"workflow {root.id} failed: its root is now {root.state}\n\n")
        out.write(format_block(root))
    return 0


def cmd_move(client: Client, args: argparse.Namespace, out: IO[str]) -> int:
    moved = TaskCalls(connection(client)).move_workflow(args.id, args.to_version)
    root = promise_from_proto(moved.root)
    task = moved.task if moved.HasField("task") else None
    if args.json:
        write_json(
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
            when(step.create_time),
            when(step.settle_time),
            step.settled_by or "-",
            payload_preview(step.value),
        )
        for step in ordered
    ]
    return align(rows)


def format_task(task: tasks_pb2.Task | None, root: Promise) -> str:
    """What the workflow's task is doing, and why it does not move if it failed."""
    if task is None:
        if root.is_settled:
            return "task: none (the workflow is over)\n"
        return "task: none now (the workflow waits on its steps)\n"
    state = TASK_STATES.get(task.state, "?")
    lines = [f"task:      {TASK_KINDS.get(task.kind, '?')} {state} ({task.id})"]
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
            retry = when(task.next_attempt_time.ToDatetime().replace(tzinfo=None))
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
