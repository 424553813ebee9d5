"""What one write batch touches (`Batch`), and the claims and leases made in it.

The group committer (`group_commit`) loads a batch's rows once, lets every op
of the batch read and stage changes through a `Batch`, and writes what it
staged. Ops say what they need loaded as `Keys`. A claim (`claim_in`) leases a
task inside the batch, pinning the root's code version; with a `Lessor` (the
dispatcher), the tasks a batch creates are leased as it commits (`lease_new`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from troth_server.domain import promise as domain
from troth_server.domain import steps
from troth_server.domain import task as tasks
from troth_server.domain.routing import ANY, Route, workflow_name
from troth_server.domain.states import WorkflowState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.domain.task import Callback, Task, TaskKind, TaskState

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from troth_server.domain.promise import Promise, PromiseState


@dataclass(frozen=True, slots=True)
class StateChange:
    promise: Promise
    old_state: PromiseState | None
    principal: str | None


@dataclass(frozen=True, slots=True)
class Keys:
    """What one op needs loaded before it applies."""

    promises: Collection[str] = ()
    roots: Collection[str] = ()
    """Roots whose active (PENDING or CLAIMED) task the op reads."""
    task_ids: Collection[str] = ()
    """Tasks to load by id (with one query for the whole batch), and their roots."""
    tasks: Collection[Task] = ()
    """Tasks the op already read inside this transaction (e.g. a claim's candidates)."""
    unlocked: Collection[Task] = ()
    """Tasks the op read without a lock, to be locked and re-read after the promises."""
    steps_of: Collection[str] = ()
    """Workflow roots the op may settle: their PENDING steps are loaded (and locked,
    after the roots) so that the settle ends them in the same transaction."""
    steps_of_task_roots: bool = False
    """The same for the roots of `task_ids` (a completion settles its root)."""
    parents_of: Collection[str] = ()
    """Promises (of `promises`) whose parent workflow's active task the op reads: a
    human's settle says whether the workflow it resumes waits for a worker."""
    states: Collection[tuple[str, str]] = ()
    """Workflow state slots (root id, name) the op reads or writes (their roots must be
    among `promises` or the roots of `task_ids`: a slot is read after its root is locked)."""


@dataclass(frozen=True, slots=True)
class Lessee:
    """A connected worker's stream that can take a task now (`Lessor.reserve`)."""

    stream: object
    """The lessor's own handle of the stream, given back in `Leased`."""
    worker_id: str
    lease_ms: int
    principal: str | None
    route: Route


@dataclass(frozen=True, slots=True)
class Leased:
    """A task created and leased in one transaction: what its delivery needs."""

    task: Task
    lessee: Lessee
    root: Promise | None


class Lessor(Protocol):
    """Leases tasks as the transaction that creates them commits (claim on commit), so
    that a delivery costs no second write: the dispatcher, which knows the streams."""

    def reserve(self, task: Task, freed: Collection[str]) -> Lessee | None:
        """A stream of this server to lease the new PENDING `task` to, its slot held
        until `leased` or `unreserve`; None: leave the task PENDING. `freed`: tasks
        this transaction completes (their slots are free once it commits)."""

    def leased(self, leases: list[Leased]) -> None:
        """After the commit: deliver these."""

    def unreserve(self, lessees: list[tuple[Lessee, str]]) -> None:
        """The transaction did not commit (or was retried): free these slots
        (stream, task id)."""


class Batch:
    """What one batch touches, as a reader at the batch's `now` sees it.

    Promises, tasks and callbacks live in one working set, so that a settle
    turns the callbacks on that promise into RESUME tasks in the same
    transaction, and two requests of one batch see each other's changes.
    """

    def __init__(
        self,
        loaded: dict[str, Promise],
        now: int,
        callbacks: Collection[Callback] = (),
        tasks: Collection[Task] = (),
        root_workflows: Mapping[str, tuple[str | None, str | None]] | None = None,
        states: Mapping[tuple[str, str], WorkflowState] | None = None,
        active_read: Collection[str] = (),
    ) -> None:
        self.now = now
        self._active_read = active_read
        """The roots whose active task (if any) this batch read: `knows_active_task`."""
        self._states = dict(states or {})
        self.state_writes: dict[tuple[str, str], WorkflowState] = {}
        """Workflow state slots written in this batch, by (root id, name)."""
        self._root_workflows = root_workflows or {}
        """(workflow, version) of the roots of `callbacks` that are not loaded."""
        self._current = loaded
        self.inserts: dict[str, Promise] = {}
        self.updates: dict[str, Promise] = {}
        self.changes: list[StateChange] = []
        self._callbacks: dict[str, list[Callback]] = {}
        for callback in callbacks:
            self._callbacks.setdefault(callback.promise_id, []).append(callback)
        self._tasks: dict[str, Task] = {t.id: t for t in tasks}
        self._active: dict[str, str] = {
            t.root_promise_id: t.id for t in tasks if t.state is not TaskState.COMPLETED
        }
        self.task_inserts: dict[str, Task] = {}
        self.task_updates: dict[str, Task] = {}
        self.new_callbacks: list[Callback] = []
        self.fired: set[str] = set()
        """Promises whose callbacks fired (and are dropped)."""
        self.finished_roots: set[str] = set()
        """Roots that settled: their remaining callbacks are dropped."""
        self._children: dict[str, list[str]] | None = None
        """Loaded promises by parent_id, built when a workflow root first settles."""

    # -- promises ---------------------------------------------------------------------

    def get(self, promise_id: str) -> Promise | None:
        found = self._current.get(promise_id)
        if found is not None and domain.is_expired(found, self.now):
            # Persist the timeout now rather than waiting for the sweeper, so
            # watchers hear of it and the row matches what we answer.
            self.settle(found, domain.expire(found))
            found = self._current[promise_id]
        return found

    def expire_if_due(self, promise_id: str, now: int) -> bool:
        found = self._current.get(promise_id)
        if found is None or not domain.is_expired(found, now):
            return False
        self.settle(found, domain.expire(found))
        return True

    def add(self, promise: Promise, principal: str | None = None) -> None:
        self._current[promise.id] = promise
        self.inserts[promise.id] = promise
        if self._children is not None and promise.parent_id is not None:
            self._children.setdefault(promise.parent_id, []).append(promise.id)
        self.changes.append(StateChange(promise, None, principal))
        group = promise.tags.get(INVOKE_TAG)
        if group:
            # Starting a workflow is creating its root: its INVOKE task comes with it.
            invoke = tasks.create(
                _task_id(), promise.id, group, TaskKind.INVOKE, workflow=workflow_name(promise.tags)
            )
            self.put_task(invoke)

    def settle(self, old: Promise, new: Promise) -> None:
        self._current[new.id] = new
        if new.id in self.inserts:
            self.inserts[new.id] = new
        else:
            self.updates[new.id] = new
        self.changes.append(StateChange(new, old.state, new.settled_by))
        if INVOKE_TAG in new.tags:
            self.finished_roots.add(new.id)
        for callback in self._callbacks.pop(new.id, ()):
            self.fired.add(new.id)
            self._resume(callback)
        if INVOKE_TAG in new.tags and new.is_settled and not old.is_settled:
            self._end_steps(new)
            if new.state is domain.PromiseState.REJECTED_CANCELED:
                self._cancel_task(new.id)

    def _cancel_task(self, root_id: str) -> None:
        """A cancelled workflow's task (loaded by `Keys.roots`): ended if the workflow
        never ran, else claimable at once even if it waited out a retry backoff, so
        that the workflow hears of it now (`tasks.cancelled`)."""
        active = self.active_task(root_id)
        if active is not None:
            changed = tasks.cancelled(active, self.now)
            if changed is not active:
                self.put_task(changed)

    def _end_steps(self, root: Promise) -> None:
        """A workflow root settled: its steps still PENDING (loaded by `Keys.steps_of`)
        are cancelled with it, a child workflow's root and so its steps too (§4.11)."""
        if self._children is None:
            self._children = {}
            for promise in self._current.values():
                if promise.parent_id is not None:
                    self._children.setdefault(promise.parent_id, []).append(promise.id)
        for step_id in self._children.get(root.id, ()):
            step = self.get(step_id)
            if step is not None and not step.is_settled:
                self.settle(step, steps.ended(step, root, self.now))

    def rewrite(self, promise: Promise) -> None:
        """Store a change that is not a settlement (no watcher or callback hears of it)."""
        self._current[promise.id] = promise
        if promise.id in self.inserts:
            self.inserts[promise.id] = promise
        else:
            self.updates[promise.id] = promise

    # -- workflow state slots ---------------------------------------------------------

    def state(self, root_id: str, name: str) -> WorkflowState:
        """The slot as this batch sees it (version 0: never written); loaded by `Keys.states`."""
        return self._states.get((root_id, name)) or WorkflowState(root_id, name)

    def put_state(self, state: WorkflowState) -> None:
        key = (state.workflow_id, state.name)
        self._states[key] = state
        self.state_writes[key] = state

    # -- tasks ------------------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def knows_active_task(self, root_id: str) -> bool:
        """Whether `active_task(root_id)` is the root's whole story: its active task
        was read (`Keys.roots`, `Keys.parents_of`, callbacks), or written here."""
        return root_id in self._active_read or root_id in self._active

    def active_task(self, root_id: str) -> Task | None:
        task_id = self._active.get(root_id)
        return None if task_id is None else self._tasks[task_id]

    def put_task(self, task: Task) -> None:
        known = task.id in self._tasks and task.id not in self.task_inserts
        self._tasks[task.id] = task
        (self.task_updates if known else self.task_inserts)[task.id] = task
        if task.state is TaskState.COMPLETED:
            if self._active.get(task.root_promise_id) == task.id:
                del self._active[task.root_promise_id]
        else:
            self._active[task.root_promise_id] = task.id

    def pending_in(self, group: str, limit: int, route: Route = ANY) -> list[Task]:
        """Loaded PENDING tasks of `group` that `route` accepts and that are past any
        retry backoff, in the order they were read (preferred first)."""
        found = [t for t in self._tasks.values() if t.group == group]
        return [
            t
            for t in found
            if t.claimable(self.now) and route.accepts(t.workflow, t.workflow_version)
        ][:limit]

    def workflow_of(self, root_id: str) -> tuple[str | None, str | None]:
        """The root's workflow name and recorded version (None for what it lacks)."""
        root = self._current.get(root_id)
        if root is None:
            return self._root_workflows.get(root_id, (None, None))
        return workflow_name(root.tags), root.workflow_version or None

    def claimed_by(self, worker_id: str | None, group: str | None = None) -> list[Task]:
        """Loaded CLAIMED tasks of the worker (of anyone, for None), of `group` if given:
        the batch may hold others its other operations loaded."""
        return [
            t
            for t in self._tasks.values()
            if t.state is TaskState.CLAIMED
            and (worker_id is None or t.worker_id == worker_id)
            and (group is None or t.group == group)
        ]

    def new_task_id(self) -> str:
        return _task_id()

    def add_callback(self, callback: Callback) -> None:
        self._callbacks.setdefault(callback.promise_id, []).append(callback)
        self.new_callbacks.append(callback)

    def _resume(self, callback: Callback) -> None:
        active = self.active_task(callback.root_promise_id)
        workflow, version = self.workflow_of(callback.root_promise_id)
        updated, created = tasks.resume(
            active, _task_id(), callback.root_promise_id, callback.group, callback.worker_id,
            workflow=workflow, workflow_version=version,
        )  # fmt: skip
        if updated is not None and updated is not active:
            self.put_task(updated)
        if created is not None:
            self.put_task(created)


def _task_id() -> str:
    return uuid.uuid4().hex


def claim_in(
    batch: Batch,
    task: Task,
    worker_id: str,
    lease_ms: int,
    principal: str | None,
    route: Route,
) -> tuple[Task, Promise | None]:
    """Lease the task to the worker in this batch, and return it with its root.

    The first worker to take a root records its code version on the root and
    the task, in the claim's transaction: from then on only that code (or code
    declared compatible with it) gets the root's tasks."""
    batch.put_task(tasks.claim(task, worker_id, batch.now, lease_ms, principal))
    root = batch.get(task.root_promise_id)
    # Re-read: reading the root may have expired it, and its settle touched tasks.
    claimed = batch.task(task.id)
    assert claimed is not None
    pinned, root = _pin(batch, claimed, root, route)
    batch.put_task(pinned)
    return pinned, root


def _pin(
    batch: Batch, task: Task, root: Promise | None, route: Route
) -> tuple[Task, Promise | None]:
    if task.workflow_version is not None:
        return task, root
    if root is not None and root.workflow_version:
        # Tasks copy their root's version when created; should one lack it, the
        # root's record still wins (a worker not running it gives the task back).
        return tasks.pin(task, root.workflow_version), root
    version = route.version_for(task.workflow)
    if version is None:
        return task, root  # a worker from before versions, or one not running it
    if root is not None and not root.is_settled:
        root = replace(root, workflow_version=version)
        batch.rewrite(root)
    return tasks.pin(task, version), root


def lease_new(
    batch: Batch, lessor: Lessor, reserved: list[tuple[Lessee, str]] | None
) -> list[Leased]:
    """Lease the tasks this batch creates PENDING to streams the lessor picks
    (appending each slot it holds to `reserved`)."""
    leases: list[Leased] = []
    reserved = [] if reserved is None else reserved
    freed = [t.id for t in batch.task_updates.values() if t.state is TaskState.COMPLETED]
    for task in list(batch.task_inserts.values()):
        if not task.claimable(batch.now):
            continue
        lessee = lessor.reserve(task, freed)
        if lessee is None:
            continue
        reserved.append((lessee, task.id))
        claimed, root = claim_in(
            batch, task, lessee.worker_id, lessee.lease_ms, lessee.principal, lessee.route
        )
        leases.append(Leased(claimed, lessee, root))
    return leases
