"""What the console's pages show, from the SDK's `Promise`s: pure (the clock is an argument).

The step tags are the SDK's own (`troth._commands`, their one home): the console is a
client of the API and reads steps as any client may.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from troth import PromiseState, TaskState
from troth._commands import TAG_FUNC, TAG_GROUP, TAG_INVOKE, TAG_KIND
from troth._durations import format_duration
from troth.errors import Reason

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from troth import Payload, Promise, TaskInfo, WorkerInfo, WorkflowInfo, WorkflowState
    from troth.errors import RpcError

    Decode = Callable[[Payload], Any]

__all__ = [
    "TAG_FUNC",
    "TAG_GROUP",
    "TAG_INVOKE",
    "TAG_KIND",
    "InboxRow",
    "Pause",
    "Step",
    "TaskRow",
    "VersionWait",
    "Who",
    "WorkerRow",
    "WorkflowRow",
    "error_words",
    "inbox_rows",
    "pause",
    "pretty",
    "settler",
    "task_rows",
    "timeline",
    "version_wait",
    "worker_rows",
    "workflow_rows",
]

APPROVAL = "promise"
"""`troth:kind` of a step a workflow waits on for a human (`ctx.promise()`)."""

_WAITING_KINDS = {"promise": "a decision", "sleep": "a timer", "start": "a child workflow"}


def _deadline(expire: datetime | None, now: datetime) -> str:
    if expire is None:
        return "none"
    if expire <= now:
        return "expired"
    return f"in {format_duration(expire - now)}"


def _stamp(when: datetime | None) -> str:
    return when.strftime("%Y-%m-%d %H:%M:%S UTC") if when is not None else ""


@dataclass(frozen=True, slots=True)
class InboxRow:
    id: str
    title: str
    message: str
    age: str
    deadline: str
    requested_by: str
    group: str
    root_id: str


def inbox_rows(promises: Iterable[Promise], now: datetime) -> list[InboxRow]:
    """The inbox's rows: pending promises, oldest first as listed."""
    return [
        InboxRow(
            id=p.id,
            title=p.title or p.id,
            message=p.message,
            age=format_duration(now - p.create_time),
            deadline=_deadline(p.expire_time, now),
            requested_by=p.requested_by,
            group=p.tags.get(TAG_GROUP, ""),
            root_id=p.root_id if p.root_id and p.root_id != p.id else "",
        )
        for p in promises
        if p.state is PromiseState.PENDING
    ]


@dataclass(frozen=True, slots=True)
class Step:
    """One line of a workflow's timeline."""

    id: str
    kind: str
    name: str
    state: str
    created: str
    settled: str
    settled_by: str
    """As recorded: `bob`, or `bob via settle-token k1:…`."""
    who: str
    """Who settled it (`bob`)."""
    via: str
    """Through what, if not directly (`settle-token k1:…`), else ""."""
    title: str
    waiting: str
    """For the point the workflow waits at: what it waits for; else ""."""
    value: str


def _value_text(promise: Promise, decode: Decode) -> str:
    if promise.state is PromiseState.PENDING:
        return ""
    try:
        value = decode(promise.value)
    except Exception:  # any codec's failure: show the size of the bytes instead
        return f"({len(promise.value.data)} bytes the console cannot decode)"
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:199] + "…"


def timeline(root: Promise, steps: Iterable[Promise], decode: Decode) -> list[Step]:
    """The root, then its steps in creation order; pending steps it waits on marked."""
    ordered = sorted(steps, key=lambda p: (p.create_time, p.id))
    lines = [_step(root, "workflow", root.tags.get(TAG_FUNC, ""), decode)]
    for step in ordered:
        kind = step.tags.get(TAG_KIND, "")
        lines.append(_step(step, kind or "promise", step.tags.get(TAG_FUNC, ""), decode))
    return lines


def _step(promise: Promise, kind: str, name: str, decode: Decode) -> Step:
    pending = promise.state is PromiseState.PENDING
    waiting = _WAITING_KINDS.get(kind, "") if pending else ""
    who = settler(promise.settled_by)
    return Step(
        id=promise.id,
        kind=kind,
        name=name,
        state=promise.state.value,
        created=_stamp(promise.create_time),
        settled=_stamp(promise.settle_time),
        settled_by=promise.settled_by,
        who=who.name,
        via=who.via,
        title=promise.title,
        waiting=waiting,
        value=_value_text(promise, decode),
    )


_WORDS: dict[str, str] = {
    Reason.NOT_AN_APPROVER: "You are not one of the approvers of this promise",
    Reason.ALREADY_SETTLED: "Someone settled this promise already",
    Reason.TIMED_OUT: "This promise timed out before your decision arrived",
    Reason.NOT_FOUND: "There is no such promise (any more)",
    Reason.INVALID_ARGUMENT: "The server refused the value",
    Reason.PERMISSION_DENIED: "You may not do this",
    Reason.ROLE_NOT_ALLOWED: "Your roles do not allow this",
    Reason.OUTSIDE_PREFIXES: "This promise is outside the ids you may touch",
    Reason.GRANT_CHANGED: "Your roles or task groups changed; reload the page",
    Reason.GROUP_NOT_ALLOWED: "Your grant does not name this workflow's task group",
    Reason.UNAUTHENTICATED: "The server did not accept your token",
    Reason.TOKEN_UNKNOWN: "The server does not know your token",
    Reason.TOKEN_INVALID: "Your token is not valid",
    Reason.TOKEN_EXPIRED: "Your token has expired; sign in again",
    Reason.OVERLOADED: "The server is overloaded; try again in a moment",
}


_CODE_WORDS: dict[str, str] = {
    "UNAUTHENTICATED": _WORDS[Reason.UNAUTHENTICATED],
    "PERMISSION_DENIED": _WORDS[Reason.PERMISSION_DENIED],
    "UNAVAILABLE": "The troth server cannot be reached now; try again in a moment",
    "DEADLINE_EXCEEDED": "The troth server did not answer in time; try again",
}


def error_words(error: RpcError) -> str:
    """A refusal in words for the human, with the server's own message after it."""
    lead = _WORDS.get(error.reason) or _CODE_WORDS.get(error.code.name, "The server refused")
    detail = error.message or str(error)
    return f"{lead}: {detail} ({error.reason or error.code.name})"


def pretty(value: Any) -> str:
    """A decoded value as indented JSON, for reading."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One line of the tasks page."""

    id: str
    root_id: str
    kind: str
    state: str
    workflow: str
    version: str
    age: str
    worker: str
    """Who holds it (a claimed task), or why it waits (a pending one)."""


def task_rows(tasks: Iterable[TaskInfo], now: datetime) -> list[TaskRow]:
    """The tasks page's rows, in the server's order (oldest first)."""
    return [
        TaskRow(
            id=task.id,
            root_id=task.root_id,
            kind=task.kind.value.lower(),
            state=task.state.value.lower(),
            workflow=task.workflow or "",
            version=task.workflow_version or "",
            age=format_duration(now - task.create_time) if task.create_time else "",
            worker=(task.worker_id if task.state is TaskState.CLAIMED else task.waiting_for) or "",
        )
        for task in tasks
    ]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One line of the workers page."""

    worker_id: str
    group: str
    principal: str
    workflows: str
    """`name version` pairs it runs, or "any" (every task of its group)."""
    held: str
    """Tasks held of its capacity, e.g. "2 / 16"."""
    connected: str
    heartbeat: str
    stalled: bool


def _ago(when: datetime | None, now: datetime) -> str:
    return f"{format_duration(max(now - when, timedelta(0)))} ago" if when else ""


def worker_rows(workers: Iterable[WorkerInfo], now: datetime) -> list[WorkerRow]:
    """The workers page's rows, in the server's order (by group, then worker id)."""
    return [
        WorkerRow(
            worker_id=worker.worker_id,
            group=worker.group,
            principal=worker.principal or "",
            workflows=", ".join(f"{name} {version}" for name, version in worker.workflows) or "any",
            held=f"{len(worker.task_ids)} / {worker.capacity}",
            connected=_ago(worker.connect_time, now),
            heartbeat=_ago(worker.last_heartbeat_time, now),
            stalled=worker.stalled,
        )
        for worker in workers
    ]


@dataclass(frozen=True, slots=True)
class VersionWait:
    """A workflow that waits for a worker of the version of its code it recorded."""

    words: str
    """The server's words: "waiting for a worker of ... version X (none connected since ...)"."""
    movable: bool
    """The person may read tasks (an operator): offer to move it to the newest code."""


def version_wait(task: TaskInfo | None, note: str) -> VersionWait | None:
    """What the workflow page says of a run waiting for a version: from its task (read
    by an operator), else from what the server answered the settle just made."""
    if task is not None and task.version_absent_since is not None and task.waiting_for:
        return VersionWait(task.waiting_for, movable=True)
    if note:
        return VersionWait(note, movable=False)
    return None


@dataclass(frozen=True, slots=True)
class Pause:
    """A workflow paused by its code: it failed on a worker (a bug) and waits out its
    retry backoff, or a worker is trying it again now."""

    attempts: int
    error: str
    traceback: str
    next_retry: str
    """When it is delivered again ("2026-05-28 20:26:40 UTC, in 4m"), or "" (retrying now)."""
    retrying: bool
    """A worker holds it now: the next attempt is under way."""


def pause(task: TaskInfo | None, now: datetime) -> Pause | None:
    """The pause of a workflow whose task failed, or None (never failed, or no task)."""
    if task is None or task.failed_attempts <= 0:
        return None
    retrying = task.state is TaskState.CLAIMED
    when = task.next_attempt_time
    next_retry = ""
    if not retrying and when is not None:
        soon = "now" if when - now < timedelta(seconds=1) else f"in {format_duration(when - now)}"
        next_retry = f"{_stamp(when)}, {soon}"
    return Pause(
        attempts=task.failed_attempts,
        # The server withholds the error from those who may not read tasks.
        error=task.last_error or "(the error is shown to operators: troth workflows show)",
        traceback=task.last_traceback or "",
        next_retry=next_retry,
        retrying=retrying,
    )


@dataclass(frozen=True, slots=True)
class Who:
    """Who settled a promise, and through what (a settle token, a gateway...)."""

    name: str
    via: str


def settler(settled_by: str) -> Who:
    """`settled_by` split at its first " via ": `bob via settle-token k1:…` -> bob, and
    `settle-token k1:…`; a plain name has no via."""
    name, _, via = settled_by.partition(" via ")
    return Who(name.strip(), via.strip())


@dataclass(frozen=True, slots=True)
class Waits:
    """A human decision a workflow waits on: its id and what the person reads."""

    id: str
    title: str


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """One line of the Workflows page."""

    id: str
    state: str
    """The root's state in lower case ("pending", "resolved"...)."""
    paused: bool
    attempts: int
    """For a paused run: how many attempts its code failed."""
    error: str
    group: str
    name: str
    """`workflow@version`, or the name alone before a worker first took it."""
    started: str
    age: str
    decisions: tuple[Waits, ...]
    """The human decisions it waits on."""
    waits: str
    """Else what it waits on, in words ("" when it is over)."""


def _waits_in_words(info: WorkflowInfo, now: datetime) -> str:
    task = info.task
    if info.state is not PromiseState.PENDING:
        return ""
    if info.paused and task is not None:
        if task.state is TaskState.CLAIMED:
            return "a worker retrying it now"
        when = task.next_attempt_time
        if when is not None and when - now >= timedelta(seconds=1):
            return f"its retry in {format_duration(when - now)}"
        return "its retry, due now"
    if task is not None and task.state is TaskState.CLAIMED:
        return f"worker {task.worker_id}" if task.worker_id else "a worker"
    if task is not None:
        return task.waiting_for or "a worker of its group"
    return "its steps (a timer, a child workflow or a step of its own)"


def workflow_rows(infos: Iterable[WorkflowInfo], now: datetime) -> list[WorkflowRow]:
    """The Workflows page's rows, in the server's order (newest first)."""
    rows = []
    for info in infos:
        task = info.task
        version = f"@{info.version}" if info.version else ""
        rows.append(
            WorkflowRow(
                id=info.id,
                state=info.state.value.lower(),
                paused=info.paused and info.state is PromiseState.PENDING,
                attempts=task.failed_attempts if task is not None else 0,
                error=(task.last_error or "") if task is not None else "",
                group=info.group,
                name=f"{info.workflow or '?'}{version}",
                started=_stamp(info.root.create_time),
                age=format_duration(max(now - info.root.create_time, timedelta(0))),
                decisions=tuple(Waits(p.id, p.title or p.id) for p in info.waiting_on),
                waits=_waits_in_words(info, now),
            )
        )
    return rows


STATE_KINDS = frozenset({"state", "state_set"})
"""The `troth:kind` of the steps that read or write a workflow's state slot."""
STATES_LIMIT = 20
"""Most state slots a workflow page reads."""


def state_names(steps: Iterable[Promise]) -> list[str]:
    """The state slots a workflow's steps read or wrote (by name, at most `STATES_LIMIT`)."""
    names = {s.tags.get(TAG_FUNC, "") for s in steps if s.tags.get(TAG_KIND) in STATE_KINDS}
    return sorted(names - {""})[:STATES_LIMIT]


@dataclass(frozen=True, slots=True)
class StateRow:
    """One state slot on a workflow's page."""

    name: str
    version: int
    written: str
    by: str
    value: str


def state_rows(states: Iterable[WorkflowState]) -> list[StateRow]:
    return [
        StateRow(s.name, s.version, _stamp(s.update_time), s.updated_by, pretty(s.value))
        for s in states
    ]
