"""Use cases of workers' tasks: claim, heartbeat, complete, release, register callbacks.

Each is one write op through the group committer, so a task's completion and
its root's settlement, or a settle and the RESUME task it causes, commit in
one transaction. The gRPC `TaskService` and the dispatcher that pushes
claimed tasks down workers' Poll streams build on these (issue 3).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from troth_server.checks import SchemaChecks
from troth_server.domain import promise as domain
from troth_server.domain import steps
from troth_server.domain import task as tasks
from troth_server.domain.errors import NotAWorkflow, PromiseNotFound
from troth_server.domain.promise import PromiseState
from troth_server.domain.routing import ANY, Route
from troth_server.domain.steps import INVOKE_TAG
from troth_server.domain.task import Callback, Task, TaskKind, TaskNotFound, TaskState
from troth_server.writes.batch import Batch, Keys, claim_in

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Payload, Promise, SettleRequest
    from troth_server.store import Store, WriteTx
    from troth_server.writes.group_commit import GroupCommitter


@dataclass(frozen=True, slots=True)
class Claimed:
    task: Task
    root: Promise | None


def _held(batch: Batch, task_id: str) -> Task:
    task = batch.task(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    return task


def _claimed_keys(tx: WriteTx, worker_id: str, group: str | None = None) -> Keys:
    """A worker's CLAIMED tasks (of one group), locked in the one lock order (after
    promises)."""
    if tx.row_locks:
        return Keys(unlocked=tx.claimed_tasks(worker_id, group, lock=False))
    return Keys(tasks=tx.claimed_tasks(worker_id, group))


@dataclass(frozen=True, slots=True)
class _ClaimOp:
    group: str
    worker_id: str
    limit: int
    lease_ms: int
    route: Route = ANY
    principal: str | None = None
    """The authenticated principal of the worker's stream, recorded on each task."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        candidates = tx.pending_tasks(self.group, self.worker_id, self.limit, self.route, now)
        return Keys(promises=[t.root_promise_id for t in candidates], tasks=candidates)

    def apply(self, batch: Batch) -> list[Claimed]:
        claimed = []
        for candidate in batch.pending_in(self.group, self.limit, self.route):
            task, root = claim_in(
                batch, candidate, self.worker_id, self.lease_ms, self.principal, self.route
            )
            claimed.append(Claimed(task, root))
        return claimed


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat's answer: the tasks the worker still holds, and the `now` (epoch ms)
    their leases were extended from (sent as `HeartbeatResponse.server_time`)."""

    tasks: list[Task]
    now: int


@dataclass(frozen=True, slots=True)
class _HeartbeatOp:
    worker_id: str
    lease_ms: int
    principal: Principal | None = None
    """The caller: only the tasks leased to it are extended (None: auth off, all)."""
    group: str | None = None
    """Only the tasks of this group (None: of every group)."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return _claimed_keys(tx, self.worker_id, self.group)

    def apply(self, batch: Batch) -> Heartbeat:
        extended = []
        foreign = None
        # Another group's worker under the same id heartbeats the worker's others.
        for task in batch.claimed_by(self.worker_id, self.group):
            if not tasks.leased_to(task, self.principal):
                # Another principal's stream used this worker id: its tasks are not
                # this caller's to keep alive (nor to refuse this caller's own for).
                foreign = task
                continue
            renewed = tasks.heartbeat(
                task, self.worker_id, task.counter, batch.now, self.lease_ms, self.principal
            )
            batch.put_task(renewed)
            extended.append(renewed)
        if foreign is not None and not extended:
            tasks.check_leased_to(foreign, self.principal)  # raises: not the caller's
        return Heartbeat(extended, batch.now)


@dataclass(frozen=True, slots=True)
class _CompleteOp:
    task_id: str
    counter: int
    worker_id: str
    root_outcome: SettleRequest | None
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        # Settling the root ends its pending steps in the same transaction (§4.11).
        return Keys(task_ids=(self.task_id,), steps_of_task_roots=self.root_outcome is not None)

    def apply(self, batch: Batch) -> tuple[Task, Promise | None]:
        task = _held(batch, self.task_id)
        done, again = tasks.complete(task, self.worker_id, self.counter, batch.now, self.principal)
        root = batch.get(task.root_promise_id)
        # A root settled meanwhile (cancelled by a gateway, say) keeps that outcome:
        # the workflow saw it as `Cancelled` and finishes without overriding it.
        if self.root_outcome is not None and (root is None or not root.is_settled):
            outcome = replace(self.root_outcome, id=task.root_promise_id)
            settled, applied = domain.settle(root, outcome, batch.now)
            if applied:
                assert root is not None
                batch.settle(root, settled)
            root = settled
        batch.put_task(done)
        if again and (root is None or not root.is_settled):
            batch.put_task(
                tasks.create(
                    batch.new_task_id(), task.root_promise_id, task.group, TaskKind.RESUME,
                    preferred=self.worker_id, workflow=task.workflow,
                    workflow_version=task.workflow_version,
                )
            )  # fmt: skip
        return done, root


@dataclass(frozen=True, slots=True)
class _SuspendOp:
    """RegisterCallbacks and CompleteTask in one transaction, unless a promise the
    workflow waits on has settled meanwhile (then nothing changes)."""

    task_id: str
    counter: int
    worker_id: str
    promise_ids: tuple[str, ...]
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=self.promise_ids, task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> tuple[Task, list[Promise]]:
        task = _held(batch, self.task_id)
        tasks.check_leased_to(task, self.principal)
        if tasks.completed_by(task, self.worker_id, self.counter):
            return task, []  # a retry: this worker's suspension already committed
        settled = _RegisterCallbacksOp(
            self.task_id, self.counter, self.worker_id, self.promise_ids, self.principal
        ).apply(batch)
        if settled:
            return _held(batch, self.task_id), settled
        done, _ = _CompleteOp(
            self.task_id, self.counter, self.worker_id, None, self.principal
        ).apply(batch)
        return done, []


@dataclass(frozen=True, slots=True)
class _ReleaseOp:
    task_id: str
    counter: int
    worker_id: str
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> Task:
        task = _held(batch, self.task_id)
        released = tasks.release(task, self.worker_id, self.counter, self.principal)
        batch.put_task(released)
        return released


@dataclass(frozen=True, slots=True)
class _FailOp:
    """The workflow's code raised on this task (a bug): the task goes back to the group
    after a backoff with the failure recorded, and the root stays PENDING. A root
    settled meanwhile (failed by an operator, timed out) ends the task instead."""

    task_id: str
    counter: int
    worker_id: str
    error: str
    traceback: str
    draw: float
    """Uniform in [0, 1): the backoff's jitter (drawn by the caller, the op is pure)."""
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> tuple[Task, Promise | None]:
        task = _held(batch, self.task_id)
        failed = tasks.fail(
            task, self.worker_id, self.counter, batch.now, self.error, self.traceback,
            self.draw, self.principal,
        )  # fmt: skip
        root = batch.get(task.root_promise_id)
        if root is None or root.is_settled:
            failed = tasks.finish(failed, batch.now)
        batch.put_task(failed)
        return failed, root


@dataclass(frozen=True, slots=True)
class _FailWorkflowOp:
    """An operator fails a workflow: its root is rejected with the reason (its pending
    steps cancelled with it), and its task, if one waits, is ended."""

    root_id: str
    value: Payload
    principal: str | None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=(self.root_id,), roots=(self.root_id,), steps_of=(self.root_id,))

    def apply(self, batch: Batch) -> tuple[Promise, bool]:
        root = batch.get(self.root_id)
        if root is None:
            raise PromiseNotFound(self.root_id)
        if INVOKE_TAG not in root.tags:
            raise NotAWorkflow(root.id)
        request = domain.SettleRequest(
            id=root.id, state=PromiseState.REJECTED, value=self.value, principal=self.principal
        )
        settled, applied = domain.settle(root, request, batch.now)
        if applied:
            batch.settle(root, settled)
        active = batch.active_task(root.id)
        if active is not None and active.state is TaskState.PENDING:
            # A CLAIMED one ends when its worker reports (it finds the root settled).
            batch.put_task(tasks.finish(active, batch.now))
        return settled, applied


@dataclass(frozen=True, slots=True)
class _MoveWorkflowOp:
    """An operator moves a workflow to another version of its code (None: whichever is
    newest when a worker next takes it): its root's recorded version and its waiting
    task's change, and a task waiting out a retry backoff is offered at once. A task a
    worker holds is refused: the run is not waiting."""

    root_id: str
    version: str | None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=(self.root_id,), roots=(self.root_id,))

    def apply(self, batch: Batch) -> tuple[Promise, Task | None]:
        root = batch.get(self.root_id)
        if root is None:
            raise PromiseNotFound(self.root_id)
        if INVOKE_TAG not in root.tags:
            raise NotAWorkflow(root.id)
        if root.is_settled:
            raise tasks.WorkflowOver(root.id, root.state.value)
        active = batch.active_task(root.id)
        if active is not None and active.state is not TaskState.PENDING:
            raise tasks.TaskRunning(active)
        moved = replace(root, workflow_version=self.version)
        batch.rewrite(moved)
        if active is None:
            return moved, None
        task = tasks.move(active, self.version)
        batch.put_task(task)
        return moved, task


@dataclass(frozen=True, slots=True)
class _RegisterCallbacksOp:
    task_id: str
    counter: int
    worker_id: str
    promise_ids: tuple[str, ...]
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=self.promise_ids, task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> list[Promise]:
        task = _held(batch, self.task_id)
        tasks.check_holder(task, self.worker_id, self.counter, self.principal)
        settled = []
        for promise_id in self.promise_ids:
            promise = batch.get(promise_id)
            if promise is None:
                raise PromiseNotFound(promise_id)
            if promise.is_settled:
                settled.append(promise)
        if settled:
            # The worker continues with these instead of suspending: no callbacks.
            return settled
        for promise_id in self.promise_ids:
            batch.add_callback(
                Callback(promise_id, task.root_promise_id, task.group, self.worker_id)
            )
        return []


@dataclass(frozen=True, slots=True)
class _ReclaimOp:
    """Tasks whose lease ran out, or whose worker's stream broke, back to the group."""

    worker_id: str | None
    now: int | None
    """None: the transaction's time (the store's clock), as in production."""
    limit: int
    came_back: Callable[[int], int] | None = None
    """When this server last came back from being away (`tasks.lease_expired`), asked
    at the transaction's time: a freeze just before it cannot slip past the check."""
    since: list[int | None] = field(default_factory=lambda: [None])
    principal: str | None = None
    """For a broken stream: its authenticated principal (only its tasks go back)."""
    group: str = ""
    """For a broken stream: its group (only that group's tasks go back)."""
    on_expired: Callable[[list[Task]], None] | None = None
    """Told of the tasks whose lease ran out, on the writer, before the commit that makes
    them PENDING wakes anyone: their streams are stalled before they could take them back."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        if self.worker_id is not None:
            return _claimed_keys(tx, self.worker_id, self.group)
        at = now if self.now is None else self.now
        self.since[0] = None if self.came_back is None else self.came_back(at)
        return Keys(tasks=tx.lease_expired_tasks(at, self.limit, self.since[0]))

    def apply(self, batch: Batch) -> list[Task]:
        at = batch.now if self.now is None else self.now
        returned = []
        for task in batch.claimed_by(self.worker_id, self.group or None):
            back = (
                tasks.worker_gone(task, self.worker_id, self.group, self.principal)
                if self.worker_id is not None
                else tasks.expire_lease(task, at, self.since[0])
            )
            if back is not task:
                batch.put_task(back)
                returned.append(back)
        if returned and self.worker_id is None and self.on_expired is not None:
            self.on_expired(returned)
        return returned


class TaskService:
    def __init__(
        self,
        store: Store,
        committer: GroupCommitter,
        clock: Callable[[], int],
        checks: SchemaChecks | None = None,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._checks = checks or SchemaChecks()
        """A root with a schema: its result is checked off the writer (`checks`)."""

    def claim(
        self,
        group: str,
        worker_id: str,
        limit: int,
        lease_ms: int,
        route: Route = ANY,
        principal: str | None = None,
    ) -> list[Claimed]:
        """Lease up to `limit` PENDING tasks of `group` that `route` accepts to the
        worker (its resumes first), recording its version on roots that had none,
        and on each task the authenticated `principal` it is leased to."""
        return self._committer.submit(_ClaimOp(group, worker_id, limit, lease_ms, route, principal))

    def check_reach(self, promises: Sequence[Promise], reader: Principal, action: str) -> None:
        """Refuse `reader` an answer with a promise outside its reach (a worker's: its
        groups' workflows, `domain.steps.check_worker_reach`): the awaited promises a
        RegisterCallbacks or a suspending CompleteTask answers with."""
        parents = {p for p in (steps.reach_parent(x, reader) for x in promises) if p}
        groups = steps.groups_of(self._store.get_promises(parents)) if parents else {}
        for promise in promises:
            group = None if promise.parent_id is None else groups.get(promise.parent_id)
            steps.check_worker_reach(reader, promise, group, action)

    def search(self, group: str, limit: int, root_id: str | None = None) -> list[Task]:
        """The group's tasks that are not completed, oldest first (a read); with
        `root_id`, only that root's active task."""
        return self._store.search_tasks(group, limit, root_id)

    def heartbeat(
        self,
        worker_id: str,
        lease_ms: int,
        principal: Principal | None = None,
        group: str | None = None,
    ) -> Heartbeat:
        """Extend every lease the worker holds (in `group`, if given; leased to
        `principal`); returns the tasks it still holds."""
        return self._committer.submit(_HeartbeatOp(worker_id, lease_ms, principal, group))

    def complete(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        root_outcome: SettleRequest | None,
        principal: Principal | None = None,
    ) -> tuple[Task, Promise | None]:
        """Complete the task, settling its root in the same transaction when given
        (the outcome's id is ignored: it is always the task's root). `principal`: the
        caller, who must be the one the task is leased to (None: auth off)."""
        if root_outcome is None:
            return self._committer.submit(_CompleteOp(task_id, counter, worker_id, None, principal))
        # Roots rarely have a schema: the writer says when this one does, and the
        # value is checked here and sent again (never checked on the writer).
        return self._checks.settle_checked(
            root_outcome,
            lambda checked: self._committer.submit(
                _CompleteOp(task_id, counter, worker_id, checked, principal)
            ),
        )

    def suspend(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> tuple[Task, list[Promise]]:
        """Register callbacks and complete, or answer the promises already settled."""
        op = _SuspendOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return self._committer.submit(op)

    async def suspend_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> tuple[Task, list[Promise]]:
        op = _SuspendOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return await self._committer.submit_async(op)

    def release(
        self, task_id: str, counter: int, worker_id: str, principal: Principal | None = None
    ) -> Task:
        return self._committer.submit(_ReleaseOp(task_id, counter, worker_id, principal))

    def fail(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        error: str,
        traceback: str,
        principal: Principal | None = None,
    ) -> tuple[Task, Promise | None]:
        """As `fail_async`, blocking."""
        op = _FailOp(task_id, counter, worker_id, error, traceback, random.random(), principal)
        return self._committer.submit(op)

    async def fail_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        error: str,
        traceback: str,
        principal: Principal | None = None,
    ) -> tuple[Task, Promise | None]:
        """Fail the task (the workflow's code raised): back to PENDING after a backoff,
        or COMPLETED if its root is settled; returns the task and its root."""
        op = _FailOp(task_id, counter, worker_id, error, traceback, random.random(), principal)
        return await self._committer.submit_async(op)

    async def fail_workflow_async(
        self, root_id: str, value: Payload, principal: str | None
    ) -> tuple[Promise, bool]:
        """Reject workflow root `root_id` with `value` (an operator's decision), ending
        its waiting task; returns the root and whether this call settled it."""
        return await self._committer.submit_async(_FailWorkflowOp(root_id, value, principal))

    async def move_workflow_async(
        self, root_id: str, version: str | None
    ) -> tuple[Promise, Task | None]:
        """Move workflow `root_id` to `version` of its code (None: the newest connected
        when a worker next takes it); returns its root and its waiting task, if any."""
        return await self._committer.submit_async(_MoveWorkflowOp(root_id, version))

    def active_task(self, root_id: str) -> Task | None:
        """Workflow `root_id`'s PENDING or CLAIMED task, if it has one (two point reads:
        the root for its group, then the task by the one-active-task index)."""
        root = self._store.get_promise(root_id)
        group = None if root is None else root.tags.get(INVOKE_TAG)
        if group is None:
            return None
        found = self._store.search_tasks(group, 1, root_id)
        return found[0] if found else None

    def register_callbacks(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> list[Promise]:
        """Callbacks for the promises the root waits on, or those already settled."""
        op = _RegisterCallbacksOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return self._committer.submit(op)

    async def complete_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        root_outcome: SettleRequest | None,
        principal: Principal | None = None,
    ) -> tuple[Task, Promise | None]:
        if root_outcome is None:
            return await self._committer.submit_async(
                _CompleteOp(task_id, counter, worker_id, None, principal)
            )

        async def write(checked: SettleRequest) -> tuple[Task, Promise | None]:
            return await self._committer.submit_async(
                _CompleteOp(task_id, counter, worker_id, checked, principal)
            )

        return await self._checks.settle_checked_async(root_outcome, write)

    async def heartbeat_async(
        self,
        worker_id: str,
        lease_ms: int,
        principal: Principal | None = None,
        group: str | None = None,
    ) -> Heartbeat:
        op = _HeartbeatOp(worker_id, lease_ms, principal, group)
        return await self._committer.submit_async(op)

    async def release_async(
        self, task_id: str, counter: int, worker_id: str, principal: Principal | None = None
    ) -> Task:
        op = _ReleaseOp(task_id, counter, worker_id, principal)
        return await self._committer.submit_async(op)

    async def register_callbacks_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> list[Promise]:
        op = _RegisterCallbacksOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return await self._committer.submit_async(op)

    def worker_gone(self, worker_id: str, group: str, principal: str | None = None) -> list[Task]:
        """The worker's last stream of `group` broke: its tasks of that group (leased to
        `principal`) go back. Its tasks of other groups stay with their own streams."""
        return self._committer.submit(
            _ReclaimOp(worker_id, None, 0, principal=principal, group=group)
        )

    def expire_leases(
        self,
        limit: int,
        now: int | None = None,
        *,
        came_back: Callable[[int], int] | None = None,
        on_expired: Callable[[list[Task]], None] | None = None,
    ) -> list[Task]:
        """Give back up to `limit` tasks whose lease ran out at `now` (default: the
        store's clock, read inside the transaction), but none within one lease length
        of `came_back(now)`: when this server last came back from being away.
        `on_expired` hears of them on the writer, before the commit wakes anyone."""
        return self._committer.submit(
            _ReclaimOp(None, now, limit, came_back, on_expired=on_expired)
        )

    def forget_completed(self, limit: int, kept_ms: int = tasks.COMPLETED_KEPT_MS) -> int:
        """Delete up to `limit` tasks completed more than `kept_ms` ago (by the store's
        clock), in one transaction; returns how many. Nothing reads a completed task
        but a repeated CompleteTask, which comes well within `kept_ms`."""
        before = self._clock() - kept_ms
        return self._store.write(lambda tx: tx.delete_completed_tasks(before, limit))

    def now(self) -> int:
        """The store's clock now (`troth_server.clock`): what leases are measured by."""
        return self._clock()


__all__ = ["Claimed", "TaskService", "TaskState"]
