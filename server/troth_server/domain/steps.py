"""A workflow's steps, by record: who may write them, what they belong to, how they end.

A step is a promise a workflow's task created: its `root_id` (the top-level
workflow root) and `parent_id` (the workflow whose task created it) are
recorded from the writer's fence, never guessed from the id (DESIGN §4.13).
A promise whose id merely starts with `<root>.` belongs to nobody.

The rules (one table, enforced by the create and settle ops of the service):

| write                                       | fence                        | else         |
|---------------------------------------------|------------------------------|--------------|
| create PENDING (latent, timer, child start) | root's task, current counter | STALE_COUNTER|
| create with a finished result (a record)    | root's task, any counter     | STALE_COUNTER|
| settle a `run`/`now`/`random` step          | root's task, any counter     | STALE_COUNTER|
| create of an id `<x>.<n>` (n a number)      | required, and x its workflow | RESERVED_... |
| create in `<root>.<n>...` or with step tags | required                     | RESERVED_... |
| settle a latent step (`ctx.promise`)        | none needed (humans)         |              |
| new PENDING step under a settled root       | -                            | WORKFLOW_... |

RESERVED_... is RESERVED_FOR_WORKFLOW, WORKFLOW_... is WORKFLOW_SETTLED.

An id whose last dot-separated part is a number (`order-42.0`, `order-42.3.1`)
has the form of a numbered step (`is_step_id`), the ids the SDK's engine gives
a workflow's steps: it is created only with the fence of the task holding the
workflow it names (`order-42`, `order-42.3`), before that workflow starts as
after, so that nobody can take the id of a step a workflow will write
(`check_unfenced_create`, `check_step_owner`). Ids a workflow names itself
(`ctx.promise(id=...)`) are of any other form, and keep their rules.

When a workflow root settles in any way, its steps still PENDING are settled
REJECTED_CANCELED with a value saying why (`ended`), and a child workflow's
root being a step of its parent, cancelling a parent ends its children too.
Pure: no I/O, `now` is a parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain import task as tasks
from troth_server.domain.access import Role
from troth_server.domain.errors import DomainError, PromiseAlreadyExists
from troth_server.domain.promise import (
    SETTLE_VERBS,
    TIMEOUT_PRINCIPAL,
    Payload,
    Promise,
    PromiseState,
)
from troth_server.domain.starts import INVOKE_TAG as INVOKE_TAG
from troth_server.domain.task import Task, TaskNotFound

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from troth_server.domain.access import Principal

KIND_TAG = "troth:kind"
"""Which command created a step (`promise`, `run`, `sleep`, `start`, `now`, `random`)."""
CHECKPOINT_KINDS = frozenset(
    {"run", "sleep", "start", "now", "random", "settle_token", "state", "state_set"}
)
"""Step kinds whose value the workflow takes as its own checkpoint: never written
without the fence of the task holding the workflow. A latent `promise` is settled
by anyone allowed to settle it."""

_JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof that the caller holds a workflow's task (proto `TaskFence`)."""

    task_id: str
    counter: int
    worker_id: str
    principal: Principal | None = None
    """Who sent it (authenticated): the task must be leased to it, and its grant must
    name the task's group. None with authentication off."""


class ReservedForWorkflow(DomainError):
    """A write of a workflow's checkpoint without the fence of the task holding it."""

    reason = Reason.RESERVED_FOR_WORKFLOW

    def __init__(self, promise_id: str, why: str, todo: str | None = None) -> None:
        super().__init__(
            f"promise {promise_id!r} {why}: only the worker holding the workflow's task "
            "writes it (with the task's fence); "
            + (
                todo
                or "settle latent promises (ctx.promise) instead, or choose an id outside "
                "the workflow's step namespace"
            ),
            promise_id=promise_id,
        )
        self.promise_id = promise_id


class StepRecorded(DomainError):
    """A step result carried in the call that ends a task's hold (`CompleteTask`'s
    `record_step`) for a step recorded already with another result: an earlier holder
    of the task recorded it first, and that record stands (first writer wins)."""

    reason = Reason.STEP_RECORDED

    def __init__(self, step: Promise) -> None:
        super().__init__(
            f"step {step.id!r} was recorded already, {step.state.value}, by an earlier holder "
            "of the task: that record stands and nothing was done; replay the workflow "
            "from its records (the SDK gives the task back for a fresh delivery)",
            promise_id=step.id,
            state=step.state.value,
        )


_STEP_ID_TODO = (
    "ids ending in a dot and a number are reserved for the steps a workflow numbers "
    "itself (`<workflow id>.<n>`), so that nobody can take one before the workflow "
    "writes it: choose another id (e.g. 'order-42-0' or 'order-42.review-0')"
)


class WorkflowSettled(DomainError):
    """A new PENDING step under a workflow root that is already settled."""

    reason = Reason.WORKFLOW_SETTLED

    def __init__(self, promise_id: str, root: Promise) -> None:
        super().__init__(
            f"workflow {root.id!r} is already {SETTLE_VERBS[root.state]} "
            f"({root.state.value}): no new pending step {promise_id!r} is created under it; "
            "the workflow sees Cancelled (it may still record compensation steps)",
            promise_id=promise_id,
            root_id=root.id,
            state=root.state.value,
        )
        self.root = root


class OutsideWorkersGroups(DomainError):
    """A worker reading or settling a promise of no workflow in its groups (DESIGN §7)."""

    reason = Reason.GROUP_NOT_ALLOWED

    def __init__(
        self, principal: Principal, promise_id: str, action: str, why: str, groups: Iterable[str]
    ) -> None:
        names = ", ".join(sorted(principal.groups)) or "none"
        super().__init__(
            f"principal {principal.name!r} (a worker for the groups {names}) may not "
            f"{action} promise {promise_id!r}: {why}. A worker reads and settles only the "
            "promises of workflows in its groups and those it created itself; read or "
            "settle others with a gateway's or operator's credential",
            principal=principal.name,
            promise_id=promise_id,
            groups=", ".join(sorted(groups)),
        )


def is_confined(principal: Principal) -> bool:
    """Whether `principal` is a worker and nothing more, so that it reaches only the
    promises of its groups' workflows (`check_worker_reach`). A principal that also
    holds `gateway`, `operator` or `admin` keeps those roles' reach (authentication
    off: the local developer holds every role)."""
    return Role.WORKER in principal.roles and principal.roles <= {Role.WORKER}


def reach_parent(promise: Promise, reader: Principal) -> str | None:
    """The workflow whose group `check_worker_reach` needs for `reader` to reach
    `promise` (its parent's `troth:invoke`, one point read), if any."""
    return promise.parent_id if is_confined(reader) else None


def groups_of(workflows: Iterable[Promise]) -> dict[str, str]:
    """The task group of each of these promises that is a workflow's root, by id."""
    return {p.id: p.tags[INVOKE_TAG] for p in workflows if INVOKE_TAG in p.tags}


def check_worker_reach(
    reader: Principal, promise: Promise, parent_group: str | None, action: str
) -> None:
    """The one rule of a worker's reach (DESIGN §7: "a worker principal acts only in
    the groups its grant names"): a worker and nothing more reads and settles (`action`)
    a promise only if it belongs to a workflow of one of its groups, by record: a
    workflow's root (its `troth:invoke` group), or a step (its parent workflow's group,
    `parent_group`; a child workflow's root is both). A promise of no workflow only if
    it created it itself. Anyone else: no limit here. Pure."""
    if not is_confined(reader):
        return
    groups = {g for g in (promise.tags.get(INVOKE_TAG), parent_group) if g is not None}
    if any(reader.may_work_for(g) for g in groups):
        return
    if promise.parent_id is None and not groups and promise.started_by == reader.name:
        return  # a standalone promise of its own
    if groups:
        why = f"it belongs to a workflow of the group {', '.join(sorted(groups))}"
    elif promise.parent_id is not None:
        why = f"it is a step of workflow {promise.parent_id!r}, which no group of it runs"
    else:
        why = "it belongs to no workflow, and another principal created it"
    raise OutsideWorkersGroups(reader, promise.id, action, why, groups)


def check_worker_start(reader: Principal, promise_id: str, tags: Mapping[str, str]) -> None:
    """`check_worker_reach` for a create without a fence: what a worker creates must be
    its to reach, so it starts workflows only in its groups (a standalone promise is
    its own). A step's create carries its task's fence, checked by `check_fence`."""
    group = tags.get(INVOKE_TAG)
    if is_confined(reader) and group is not None and not reader.may_work_for(group):
        raise OutsideWorkersGroups(
            reader, promise_id, "start", f"it would be a workflow of the group {group!r}", [group]
        )


def check_worker_early(reader: Principal, promise_id: str) -> None:
    """A settle by a worker of a promise that does not exist yet (`create_if_missing`)
    would create one of no workflow, settled by it: not a worker's to make."""
    if is_confined(reader):
        raise OutsideWorkersGroups(
            reader,
            promise_id,
            "settle",
            "it does not exist, and a worker settles only promises of its workflows, "
            "which exist (it may not settle one early, create_if_missing)",
            [],
        )


def is_workflow(promise: Promise) -> bool:
    return INVOKE_TAG in promise.tags


def is_workflow_start(tags: Mapping[str, str]) -> bool:
    """Whether a create with these tags starts a workflow (its root's INVOKE task)."""
    return INVOKE_TAG in tags


def is_checkpoint(tags: Mapping[str, str]) -> bool:
    """Whether these tags mark a `run`, `sleep`, child start, `now` or `random` step."""
    return tags.get(KIND_TAG) in CHECKPOINT_KINDS


def namespace_roots(promise_id: str) -> list[str]:
    """The ids whose step namespace (`<root>.<n>...`, n a number) `promise_id` is in,
    if they are workflow roots: `wf.3.1` is in `wf`'s and in `wf.3`'s."""
    parts = promise_id.split(".")
    return [
        ".".join(parts[:i])
        for i in range(1, len(parts))
        if parts[i].isdigit() and parts[i].isascii()
    ]


def is_step_id(promise_id: str) -> bool:
    """Whether `promise_id` has the form of a workflow's numbered step, `<x>.<n>` (n
    ASCII digits): created only with the fence of workflow x's task (`order-42.0` of
    `order-42`, `order-42.3.1` of the child `order-42.3`)."""
    head, dot, last = promise_id.rpartition(".")
    return bool(dot and head) and last.isascii() and last.isdigit()


def step_workflow(promise_id: str) -> str | None:
    """The workflow whose numbered step `promise_id` would be (None: not of that form)."""
    return promise_id.rpartition(".")[0] if is_step_id(promise_id) else None


def check_step_owner(promise_id: str, workflow_id: str) -> None:
    """A fenced write that creates `promise_id` for workflow `workflow_id`: a
    numbered step's id only in its own workflow's namespace."""
    owner = step_workflow(promise_id)
    if owner is not None and owner != workflow_id:
        raise ReservedForWorkflow(
            promise_id,
            f"is the id of workflow {owner!r}'s numbered step, not one of workflow "
            f"{workflow_id!r} (whose task's fence came with it)",
            f"workflow {workflow_id!r} creates its numbered steps as "
            f"'{workflow_id}.<n>'; give a step it names another id",
        )


def reserved_by(promise_id: str, loaded: Mapping[str, Promise | None]) -> str | None:
    """The workflow root (among `loaded`) whose step namespace holds `promise_id`."""
    for root_id in namespace_roots(promise_id):
        found = loaded.get(root_id)
        if found is not None and is_workflow(found):
            return root_id
    return None


def check_unfenced_create(
    promise_id: str, tags: Mapping[str, str], loaded: Mapping[str, Promise | None]
) -> None:
    """Refuse a create without a fence that would write a workflow's checkpoint, or
    take the id of a workflow's numbered step (whether the workflow exists yet or not)."""
    if is_checkpoint(tags):
        raise ReservedForWorkflow(promise_id, f"is tagged as a workflow's {tags[KIND_TAG]!r} step")
    _check_unfenced_id(promise_id, loaded)


def _check_unfenced_id(promise_id: str, loaded: Mapping[str, Promise | None]) -> None:
    owner = step_workflow(promise_id)
    if owner is not None:
        raise ReservedForWorkflow(
            promise_id, f"has the form of workflow {owner!r}'s numbered step", _STEP_ID_TODO
        )
    owner = reserved_by(promise_id, loaded)
    if owner is not None:
        raise ReservedForWorkflow(promise_id, f"is in workflow {owner!r}'s step namespace")


def check_unfenced_settle(
    promise_id: str, existing: Promise | None, loaded: Mapping[str, Promise | None]
) -> None:
    """Refuse a settle without a fence of a workflow's checkpoint step, or one that
    would create (`create_if_missing`) a promise in a workflow's step namespace."""
    if existing is None:
        _check_unfenced_id(promise_id, loaded)
        return
    if existing.parent_id is not None and is_checkpoint(existing.tags):
        raise ReservedForWorkflow(
            promise_id,
            f"is workflow {existing.parent_id!r}'s {existing.tags[KIND_TAG]!r} step",
        )


def check_fence(task: Task | None, fence: Fence, *, pending: bool) -> Task:
    """The task the fence names, if the fence may write: a pending step needs the
    current holder; a finished result is accepted at any counter the task has had
    (first writer wins by id, so a worker that lost its lease in an outage still
    records what it computed). Either way, with authentication on, only the principal
    the task is (or was last) leased to writes with it (`NotTheTasksWorker`)."""
    if task is None:
        raise TaskNotFound(fence.task_id)
    if pending:
        tasks.check_holder(task, fence.worker_id, fence.counter, fence.principal)
        return task
    tasks.check_leased_to(task, fence.principal)
    if not 1 <= fence.counter <= task.counter:
        raise tasks.StaleCounter(task, fence.counter, fence.worker_id)
    return task


def links_under(workflow: Promise) -> tuple[str, str]:
    """(root_id, parent_id) of a step that `workflow`'s task creates."""
    return workflow.root_id or workflow.id, workflow.id


def check_owner(existing: Promise, workflow: Promise, *, latent: bool, early: bool) -> None:
    """A fenced create of an id that exists: only the workflow's own step is a
    repeat, and a settled-early promise is adopted only by a latent wait."""
    if existing.parent_id == workflow.id or (early and latent and existing.parent_id is None):
        return
    owner = (
        f"workflow {existing.parent_id!r}'s step"
        if existing.parent_id is not None
        else "a promise that belongs to no workflow"
        if not early
        else "an answer given early, which only a latent wait (ctx.promise) adopts"
    )
    raise PromiseAlreadyExists(
        existing.id,
        f"the id is taken by a promise that is not this workflow's step ({owner}), "
        f"so workflow {workflow.id!r} cannot use it; give the step another id",
    )


def ended(step: Promise, root: Promise, now: int) -> Promise:
    """`step`, still PENDING, as its workflow `root` settling leaves it: cancelled,
    with a value saying why, so that no human waits on it any more."""
    if root.state is PromiseState.REJECTED_CANCELED:
        reason = "workflow cancelled"
    elif root.state is PromiseState.REJECTED_TIMEDOUT:
        reason = "workflow timed out"
    else:
        reason = "workflow ended"
    value = {"reason": reason, "workflow": root.id, "workflow_state": root.state.value}
    by = root.settled_by if root.settled_by != TIMEOUT_PRINCIPAL else "troth:workflow"
    return replace(
        step,
        state=PromiseState.REJECTED_CANCELED,
        value=Payload(_JSON, json.dumps(value).encode()),
        settle_time=now,
        idempotency_key_for_settle=None,
        settled_by=by,
    )
