"""The task state machine: leases, fencing counters, and one active task per root.

A task is a unit of work for a worker group: INVOKE (run a new root promise)
or RESUME (a promise the workflow waits on has settled). Times are integer
milliseconds; `now` is always a parameter. Every function is pure: it returns
the new task (or tasks) or raises a `DomainError`.

Legal moves, the one table of this machine:

| from      | event                          | to        | counter |
|-----------|--------------------------------|-----------|---------|
| (none)    | create (root started / resumed)| PENDING   | 0       |
| PENDING   | claim by worker W              | CLAIMED   | +1      |
| CLAIMED   | heartbeat (same W, counter)    | CLAIMED   | same    |
| CLAIMED   | complete (same counter)        | COMPLETED | same    |
| CLAIMED   | release (same counter)         | PENDING   | same    |
| CLAIMED   | fail (same counter), root open | PENDING** | same    |
| CLAIMED   | fail (same counter), root done | COMPLETED | same    |
| PENDING** | its root is cancelled          | PENDING   | same    |
| CLAIMED   | lease expired (now ≥ lease)*   | PENDING   | same    |
| CLAIMED   | W's stream broke               | PENDING   | same    |
| COMPLETED | anything                       | unchanged, or an error |

(*) and one lease length has passed since the server was last away (started,
frozen, cut off from its store): an outage never takes a lease.

(**) not claimable before its `next_attempt_time`: the workflow's code raised an
exception it did not mean as the workflow's outcome (a bug), so the task is
retried after a jittered exponential backoff (`retry_delay_ms`), its
`failed_attempts`, `last_error` and `last_traceback` recorded for operators.
The root stays PENDING: deploying fixed code resumes it from its checkpoints.

The counter is the fencing token: it changes on every (re)assignment, so a call
carrying an older counter comes from a worker that lost the task
(`StaleCounter`), and it can never complete or corrupt work that moved on.

The counter is not a secret (`SearchTasks` shows it to operators, and a
`StaleCounter` message names it). With authentication on, a claim also records
the authenticated principal the task is leased to (`worker_principal`), and
every call about the task (heartbeat, complete, release, callbacks, a fenced
step write) must come from that principal (`check_leased_to`, before the
counter is compared: `NotTheTasksWorker`) and from one whose grant still names
the task's group (`GroupNotAllowed`). An admin may release another's task (to
free a stuck one), never complete it or write its steps. With authentication
off there is no principal (`None`) and nothing is compared.

Versions. A task carries its root's workflow (name) and the version of the code
the root runs with, which the first worker to take the root records
(`pin`); RESUME tasks copy both from the root. `domain/routing.py` decides
which worker may take which task.

One active task per root (DESIGN §4.9): a settle that should resume a root
whose task is still PENDING or CLAIMED creates no second task; it marks the
active one `resume_pending`, and completing it then yields the next RESUME.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain.access import Role
from troth_server.domain.errors import DomainError

if TYPE_CHECKING:
    from troth_server.domain.access import Principal


class TaskKind(enum.StrEnum):
    INVOKE = "INVOKE"
    RESUME = "RESUME"


class TaskState(enum.StrEnum):
    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    COMPLETED = "COMPLETED"


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    root_promise_id: str
    group: str
    kind: TaskKind
    state: TaskState
    counter: int = 0
    worker_id: str | None = None
    lease_expire_time: int | None = None
    lease_ms: int | None = None
    """The lease length the holder asked for (its latest claim or heartbeat): after an
    outage the lease is taken only once this long has passed since the server was back."""
    preferred_worker_id: str | None = None
    """The worker that suspended the root: it may still hold the generator."""
    resume_pending: bool = False
    """A promise the root waits on settled while this task was active."""
    workflow: str | None = None
    """The root's workflow name (its `troth:func` tag)."""
    workflow_version: str | None = None
    """The version of the workflow's code the root runs with; None until a worker took it."""
    create_time: int | None = None
    """Set by the store (when it was inserted)."""
    complete_time: int | None = None
    """Set by the store (when it completed)."""
    worker_principal: str | None = None
    """The authenticated principal the task is (or, once back to PENDING, was last)
    leased to (revision 0009): only it may heartbeat, complete, release or write steps
    with the task, and record a step's result at a past counter. None with
    authentication off (or for a task claimed before the revision)."""
    failed_attempts: int = 0
    """How many times the workflow's code failed on this task (revision 0010)."""
    last_error: str | None = None
    """The last failure's exception, as `Type: message` (revision 0010)."""
    last_traceback: str | None = None
    """The last failure's traceback, as the worker formatted it (revision 0010)."""
    next_attempt_time: int | None = None
    """A failed task is not claimed before this (epoch ms; revision 0010)."""

    def claimable(self, now: int) -> bool:
        """PENDING, and past its retry backoff if it failed."""
        return self.state is TaskState.PENDING and (
            self.next_attempt_time is None or self.next_attempt_time <= now
        )


@dataclass(frozen=True, slots=True)
class Callback:
    """When `promise_id` settles, give root `root_promise_id` a RESUME task in `group`."""

    promise_id: str
    root_promise_id: str
    group: str
    worker_id: str | None = None
    """The worker that registered it (and suspended the root): preferred for the resume."""


class TaskNotFound(DomainError):
    reason = Reason.NOT_FOUND

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id!r} does not exist; use the id a Poll stream delivered",
            task_id=task_id,
        )
        self.task_id = task_id


class TaskNotClaimable(DomainError):
    """A claim lost a race for a task: the server's own dispatch, never a client."""

    reason = Reason.TASK_NOT_PENDING

    def __init__(self, task: Task) -> None:
        why = (
            f"is {task.state.value}, not PENDING"
            if task.state is not TaskState.PENDING
            else f"waits out its retry backoff until {task.next_attempt_time} (epoch ms)"
        )
        super().__init__(
            f"task {task.id!r} {why}; it cannot be claimed",
            task_id=task.id,
            state=task.state.value,
        )
        self.task = task


class TaskRunning(DomainError):
    """An operator's move of a workflow whose task a worker holds now."""

    reason = Reason.TASK_NOT_PENDING

    def __init__(self, task: Task) -> None:
        super().__init__(
            f"workflow {task.root_promise_id!r} is running: its task {task.id!r} is "
            f"{task.state.value} by worker {task.worker_id!r}, so it waits for no version; "
            "move it once it waits (`troth workflows show` says what it waits for)",
            task_id=task.id,
            state=task.state.value,
        )
        self.task = task


class WorkflowOver(DomainError):
    """An operator's move of a workflow whose root is settled."""

    reason = Reason.ALREADY_SETTLED

    def __init__(self, root_id: str, state: str) -> None:
        super().__init__(
            f"workflow {root_id!r} is over ({state}): there is nothing left to run, on any version",
            promise_id=root_id,
            state=state,
        )
        self.root_id = root_id


class WorkflowNotPaused(DomainError):
    """An operator's retry-now of a workflow whose task is not waiting out a retry
    backoff after its code failed: there is nothing to hurry."""

    reason = Reason.WORKFLOW_NOT_PAUSED

    def __init__(self, root_id: str, task: Task | None, root_state: str) -> None:
        if root_state != "PENDING":
            why, state = f"is over ({root_state}): nothing is left to run", root_state
        elif task is None:
            why, state = "has no task now: it waits on its steps (no code of it failed)", "WAITING"
        elif task.state is TaskState.CLAIMED:
            why = f"is running: its task {task.id!r} is held by worker {task.worker_id!r}"
            state = task.state.value
        else:
            why = f"is not paused: its task {task.id!r} failed no attempt and waits for a worker"
            state = task.state.value
        super().__init__(
            f"workflow {root_id!r} {why}; retry-now hurries only a paused workflow (its code "
            "failed and its task waits out a retry backoff): `troth workflows show` says what "
            "it is doing",
            promise_id=root_id,
            state=state,
        )
        self.root_id = root_id


class StaleCounter(DomainError):
    """A call from a worker whose lease on the task has ended."""

    reason = Reason.STALE_COUNTER

    def __init__(self, task: Task, counter: int, worker_id: str) -> None:
        holder = f"worker {task.worker_id!r}" if task.worker_id else "no worker"
        super().__init__(
            f"task {task.id!r} is at counter {task.counter} ({task.state.value}, held by "
            f"{holder}); this call from worker {worker_id!r} carried counter {counter}: "
            "its lease ended and the task moved on. Drop the task; do not retry",
            task_id=task.id,
            counter=str(task.counter),
        )
        self.task = task


class NotTheTasksWorker(DomainError):
    """A call about a task from a principal the task is not leased to."""

    reason = Reason.NOT_THE_TASKS_WORKER

    def __init__(self, task: Task, principal: str) -> None:
        # Neither the counter nor the holder is named: the caller is not the holder.
        super().__init__(
            f"task {task.id!r} was leased to another principal, not to {principal!r}: "
            "only the worker principal a task was leased to may heartbeat, complete, "
            "release it or write its workflow's steps",
            task_id=task.id,
            principal=principal,
        )
        self.task = task


class GroupNotAllowed(DomainError):
    """A task call (or fenced step write) for a group the caller's grant does not name."""

    reason = Reason.GROUP_NOT_ALLOWED

    def __init__(self, task: Task, principal: Principal) -> None:
        names = ", ".join(sorted(principal.groups)) or "none"
        super().__init__(
            f"principal {principal.name!r} may not work for task group {task.group!r} "
            f"(task {task.id!r}): its grant names the groups {names}",
            task_id=task.id,
            principal=principal.name,
            group=task.group,
        )
        self.task = task


def create(
    task_id: str,
    root_promise_id: str,
    group: str,
    kind: TaskKind,
    *,
    preferred: str | None = None,
    workflow: str | None = None,
    workflow_version: str | None = None,
) -> Task:
    return Task(
        id=task_id,
        root_promise_id=root_promise_id,
        group=group,
        kind=kind,
        state=TaskState.PENDING,
        preferred_worker_id=preferred,
        workflow=workflow or None,
        workflow_version=workflow_version or None,
    )


def claim(
    task: Task, worker_id: str, now: int, lease_ms: int, principal: str | None = None
) -> Task:
    """Lease the task to `worker_id`, run by the authenticated `principal` (None with
    authentication off). A task that failed is claimable only once its backoff is over."""
    if not task.claimable(now):
        raise TaskNotClaimable(task)
    return replace(
        task,
        state=TaskState.CLAIMED,
        counter=task.counter + 1,
        worker_id=worker_id,
        lease_expire_time=now + lease_ms,
        lease_ms=lease_ms,
        worker_principal=principal,
        next_attempt_time=None,  # its backoff is over; failures and the last error stay
    )


def first_run(task: Task) -> bool:
    """A workflow's INVOKE task in its first lease: the workflow has no steps yet, for a
    step is created only under the fence of its workflow's task lease (a promise gets a
    `parent_id` only so), and this is the first lease of the workflow's first task. Its
    delivery needs no read of the workflow's history."""
    return task.kind is TaskKind.INVOKE and task.counter == 1


def pin(task: Task, version: str) -> Task:
    """Record the code version the root runs with on a task that has none yet.
    A version once recorded never changes: the root's steps were made by that code."""
    if task.workflow_version is not None or not version:
        return task
    return replace(task, workflow_version=version)


def move(task: Task, version: str | None) -> Task:
    """A waiting task moved to another version of its workflow's code (None: the newest
    connected, recorded by the worker that takes it), offered at once even if it was
    waiting out a retry backoff. The history replays on that code: if it does not fit,
    the replay fails the task (a `NonDeterminismError`), as any mismatch does."""
    assert task.state is TaskState.PENDING
    return replace(task, workflow_version=version or None, next_attempt_time=None,
                   preferred_worker_id=None)  # fmt: skip


def leased_to(task: Task, principal: Principal | None) -> bool:
    """Whether `principal` is the one the task is leased to (always, with auth off)."""
    return principal is None or task.worker_principal == principal.name


def check_leased_to(task: Task, principal: Principal | None, *, release: bool = False) -> None:
    """Refuse a call about the task from anyone but the principal it is leased to, or
    from one whose grant no longer names its group. `principal` None: authentication
    is off, nothing to compare. An admin may `release` any task, nothing more.
    Comparisons only: this runs on the writer, where the counter is checked."""
    if principal is None:
        return
    if release and Role.ADMIN in principal.roles:
        return
    if task.worker_principal != principal.name:
        raise NotTheTasksWorker(task, principal.name)
    if not principal.may_work_for(task.group):
        raise GroupNotAllowed(task, principal)


def check_holder(
    task: Task, worker_id: str, counter: int, principal: Principal | None = None
) -> None:
    """Refuse a call unless this worker (run by `principal`) holds the task at this
    counter; the principal first, so that its refusal says nothing of the lease."""
    check_leased_to(task, principal)
    if (
        task.state is not TaskState.CLAIMED
        or task.counter != counter
        or task.worker_id != worker_id
    ):
        raise StaleCounter(task, counter, worker_id)


def heartbeat(
    task: Task,
    worker_id: str,
    counter: int,
    now: int,
    lease_ms: int,
    principal: Principal | None = None,
) -> Task:
    """Extend the lease of a task this worker holds at this counter."""
    check_holder(task, worker_id, counter, principal)
    return replace(task, lease_expire_time=now + lease_ms, lease_ms=lease_ms)


def completed_by(task: Task, worker_id: str, counter: int) -> bool:
    """Whether this worker already completed the task at this counter: a repeated
    CompleteTask whose first reply was lost (say, with the replica that sent it)."""
    return (
        task.state is TaskState.COMPLETED
        and task.counter == counter
        and task.worker_id == worker_id
    )


def complete(
    task: Task, worker_id: str, counter: int, now: int, principal: Principal | None = None
) -> tuple[Task, bool]:
    """Complete the task at `now`; the flag says whether the root must be resumed again.
    Completing it again, as the same worker at the same counter, changes nothing."""
    check_leased_to(task, principal)
    if completed_by(task, worker_id, counter):
        return task, False
    check_holder(task, worker_id, counter)
    done = replace(task, state=TaskState.COMPLETED, lease_expire_time=None, complete_time=now)
    return done, task.resume_pending


def release(task: Task, worker_id: str, counter: int, principal: Principal | None = None) -> Task:
    """The worker gives the task back (graceful shutdown): others may claim it at once.
    An admin may give back any task (one stuck with a frozen worker), at its counter."""
    check_leased_to(task, principal, release=True)
    if principal is not None and Role.ADMIN in principal.roles:
        if task.state is not TaskState.CLAIMED or task.counter != counter:
            raise StaleCounter(task, counter, worker_id)
        return _back_to_pending(task)
    check_holder(task, worker_id, counter)
    return _back_to_pending(task)


RETRY_FIRST_MS = 1_000
"""The backoff after a task's first failure."""
RETRY_MAX_MS = 300_000
"""The longest backoff between two attempts of a failing task (5 minutes)."""
MAX_ERROR_CHARS = 2_000
"""The longest `last_error` (`Type: message`) a FailTask may carry."""
MAX_TRACEBACK_CHARS = 32_000
"""The longest `last_traceback` a FailTask may carry (the SDK keeps the innermost part)."""


def retry_delay_ms(failures: int, draw: float) -> int:
    """How long a task that has failed `failures` times waits before its next attempt.

    Exponential from `RETRY_FIRST_MS`, doubling per failure, capped at
    `RETRY_MAX_MS`; jittered by `draw` (uniform in [0, 1)) over the upper half,
    so the delay is in [base/2, base): workers failing on the same bug spread out.
    """
    if failures < 1:
        return 0
    base = RETRY_MAX_MS if failures > 30 else min(RETRY_MAX_MS, RETRY_FIRST_MS << (failures - 1))
    jitter = min(max(draw, 0.0), 1.0)
    return max(1, int(base / 2 + jitter * (base / 2)))


def fail(
    task: Task,
    worker_id: str,
    counter: int,
    now: int,
    error: str,
    traceback: str,
    draw: float,
    principal: Principal | None = None,
) -> Task:
    """The workflow's code raised on this task (a bug, not its outcome): back to PENDING,
    claimable again after `retry_delay_ms`, with the failure recorded. Fenced like a
    completion: only the holder at this counter may fail it."""
    check_holder(task, worker_id, counter, principal)
    failures = task.failed_attempts + 1
    return replace(
        _back_to_pending(task),
        failed_attempts=failures,
        last_error=error,
        last_traceback=traceback,
        next_attempt_time=now + retry_delay_ms(failures, draw),
    )


def cancelled(task: Task, now: int) -> Task:
    """Its workflow's root was cancelled. A task whose workflow never ran (its INVOKE,
    PENDING, never claimed) ends now: no code of it ran, so there is nothing to hear
    or compensate, and no worker need come for it. Any other hears of it at once
    (`hurry`): the workflow sees `Cancelled` at its next yield (DESIGN §4.10)."""
    if task.kind is TaskKind.INVOKE and task.state is TaskState.PENDING and task.counter == 0:
        return finish(task, now)
    return hurry(task)


def hurry(task: Task) -> Task:
    """A PENDING task waiting out a retry backoff, claimable at once: its root was
    cancelled, and the workflow must hear of it (`Cancelled`, and compensate) now,
    not after the backoff. Any other task is returned unchanged."""
    if task.state is TaskState.PENDING and task.next_attempt_time is not None:
        return replace(task, next_attempt_time=None)
    return task


def is_paused(task: Task) -> bool:
    """Whether the task's workflow is paused by a bug: its code failed on it, and it is
    not completed (waiting out its retry backoff, or being retried)."""
    return task.failed_attempts > 0 and task.state is not TaskState.COMPLETED


def retry_now(task: Task, now: int) -> Task:
    """A paused workflow's task (PENDING after its code failed) offered at once: its
    next attempt is `now`, not at the end of its backoff; its failures stay recorded
    until an attempt succeeds. Refuses any other task (`WorkflowNotPaused`)."""
    if task.state is not TaskState.PENDING or task.failed_attempts == 0:
        raise WorkflowNotPaused(task.root_promise_id, task, "PENDING")
    return replace(task, next_attempt_time=now)


def finish(task: Task, now: int) -> Task:
    """End a task whose root settled without it (a failing workflow an operator
    failed, or one that timed out while its task waited out a backoff)."""
    if task.state is TaskState.COMPLETED:
        return task
    return replace(
        task,
        state=TaskState.COMPLETED,
        lease_expire_time=None,
        complete_time=now,
        next_attempt_time=None,
    )


COMPLETED_KEPT_MS = 600_000
"""How long a completed task is kept before the sweeper deletes it: so that a
CompleteTask repeated because its reply was lost (within the worker's call
deadline, 10 s by default, a failover included) is answered as the first one was.
Nothing else reads a completed task."""

UNKNOWN_LEASE_MS = 600_000
"""The lease assumed for a task claimed before leases were recorded (the default
longest lease a worker may ask for)."""


def lease_expired(task: Task, now: int, back_since: int | None = None) -> bool:
    """Whether the task's lease has run out at `now`.

    `back_since` is when this server last came back from being away (started,
    frozen, cut off from its store): its workers could not heartbeat meanwhile,
    so an outage never takes a lease: not before one lease length has passed
    since then.
    """
    if (
        task.state is not TaskState.CLAIMED
        or task.lease_expire_time is None
        or now < task.lease_expire_time
    ):
        return False
    lease = UNKNOWN_LEASE_MS if task.lease_ms is None else task.lease_ms
    return back_since is None or now >= back_since + lease


def expire_lease(task: Task, now: int, back_since: int | None = None) -> Task:
    """The task as it is once its lease ran out (unchanged if it has not)."""
    return _back_to_pending(task) if lease_expired(task, now, back_since) else task


def worker_gone(task: Task, worker_id: str, group: str, principal: str | None = None) -> Task:
    """The worker's last stream of `group` broke: its claimed tasks of that group go
    back to it at once (with authentication on, only those leased to the stream's
    `principal`: another principal's stream naming the same worker id cannot take
    them). A worker process polls each of its groups on a stream of its own: one
    closing leaves the tasks the others hold where they are."""
    if (
        task.state is TaskState.CLAIMED
        and task.worker_id == worker_id
        and task.group == group
        and (principal is None or task.worker_principal == principal)
    ):
        return _back_to_pending(task)
    return task


def _back_to_pending(task: Task) -> Task:
    # The worker that lost it is no better placed than any other to resume.
    return replace(
        task,
        state=TaskState.PENDING,
        worker_id=None,
        lease_expire_time=None,
        lease_ms=None,
        preferred_worker_id=None,
    )


def resume(active: Task | None, new_task_id: str, root_promise_id: str, group: str,
           preferred: str | None, *, workflow: str | None = None,
           workflow_version: str | None = None) -> tuple[Task | None, Task | None]:  # fmt: skip
    """A promise the root waits on settled. Returns (updated active task, new task).

    With an active (PENDING or CLAIMED) task for the root, no task is created:
    a PENDING one will replay the new history anyway; a CLAIMED one is marked
    so that completing it asks for the next resume. A new RESUME carries the
    root's workflow and version, so that only that code resumes it.
    """
    if active is not None and active.state is not TaskState.COMPLETED:
        if active.state is TaskState.PENDING:
            return active, None
        return replace(active, resume_pending=True), None
    created = create(
        new_task_id, root_promise_id, group, TaskKind.RESUME, preferred=preferred,
        workflow=workflow, workflow_version=workflow_version,
    )  # fmt: skip
    return None, created
