"""Use cases of workers' tasks: claim, heartbeat, complete, release, register callbacks.

Each is one write op through the group committer, so a task's completion and
its root's settlement, or a settle and the RESUME task it causes, commit in
one transaction. The gRPC `TaskService` and the dispatcher that pushes
claimed tasks down workers' Poll streams build on these (issue 3).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, TypeVar

from troth_server.checks import SchemaChecks
from troth_server.domain import steps
from troth_server.domain import task as tasks
from troth_server.domain.routing import ANY, Route
from troth_server.domain.steps import INVOKE_TAG
from troth_server.writes.ops.carried import RecordThenOp
from troth_server.writes.ops.complete import CompleteOp, FailOp, RegisterCallbacksOp, SuspendOp
from troth_server.writes.ops.create import CreateOp
from troth_server.writes.ops.leases import (
    Claimed,
    ClaimOp,
    Heartbeat,
    HeartbeatOp,
    ReclaimOp,
    ReleaseOp,
)
from troth_server.writes.ops.workflows import FailWorkflowOp, MoveWorkflowOp

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from troth_server.domain.access import Principal
    from troth_server.domain.promise import CreateRequest, Payload, Promise, SettleRequest
    from troth_server.domain.steps import Fence
    from troth_server.domain.task import Task
    from troth_server.store import Store
    from troth_server.writes.group_commit import GroupCommitter, WriteOp

    StepRecord = tuple[CreateRequest, str | None, SettleRequest, Fence]
    """A step a worker records with the call that ends its task's hold: its create,
    its creator, its result and its task's fence (`api.promises.create_args`)."""

R = TypeVar("R")


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
        return self._committer.submit(ClaimOp(group, worker_id, limit, lease_ms, route, principal))

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

    async def suspend_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> tuple[Task, list[Promise]]:
        """Register callbacks and complete, or answer the promises already settled."""
        done = await self.record_then_suspend_async(
            None, task_id, counter, worker_id, promise_ids, principal
        )
        return done[1]

    async def record_then_suspend_async(
        self,
        step: StepRecord | None,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> tuple[Promise | None, tuple[Task, list[Promise]]]:
        """`suspend_async`, recording the task's last step (`step`, a fenced create
        settled with its result) in the same transaction (`RecordThenOp`): the step as
        recorded, and what `suspend_async` answers. No `step`: `suspend_async` alone."""
        op = SuspendOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return await self._recording(step, op)

    async def _recording(
        self, step: StepRecord | None, then: WriteOp[R]
    ) -> tuple[Promise | None, R]:
        if step is None:
            return None, await self._committer.submit_async(then)
        return await self._committer.submit_async(RecordThenOp(CreateOp(*step), then))

    def release(
        self, task_id: str, counter: int, worker_id: str, principal: Principal | None = None
    ) -> Task:
        return self._committer.submit(ReleaseOp(task_id, counter, worker_id, principal))

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
        op = FailOp(task_id, counter, worker_id, error, traceback, random.random(), principal)
        return await self._committer.submit_async(op)

    async def fail_workflow_async(
        self, root_id: str, value: Payload, principal: str | None
    ) -> tuple[Promise, bool]:
        """Reject workflow root `root_id` with `value` (an operator's decision), ending
        its waiting task; returns the root and whether this call settled it."""
        return await self._committer.submit_async(FailWorkflowOp(root_id, value, principal))

    async def move_workflow_async(
        self, root_id: str, version: str | None
    ) -> tuple[Promise, Task | None]:
        """Move workflow `root_id` to `version` of its code (None: the newest connected
        when a worker next takes it); returns its root and its waiting task, if any."""
        return await self._committer.submit_async(MoveWorkflowOp(root_id, version))

    def active_task(self, root_id: str) -> Task | None:
        """Workflow `root_id`'s PENDING or CLAIMED task, if it has one (two point reads:
        the root for its group, then the task by the one-active-task index)."""
        root = self._store.get_promise(root_id)
        group = None if root is None else root.tags.get(INVOKE_TAG)
        if group is None:
            return None
        found = self._store.search_tasks(group, 1, root_id)
        return found[0] if found else None

    async def complete_async(
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
        done = await self.record_then_complete_async(
            None, task_id, counter, worker_id, root_outcome, principal
        )
        return done[1]

    async def record_then_complete_async(
        self,
        step: StepRecord | None,
        task_id: str,
        counter: int,
        worker_id: str,
        root_outcome: SettleRequest | None,
        principal: Principal | None = None,
    ) -> tuple[Promise | None, tuple[Task, Promise | None]]:
        """`complete_async`, recording the task's last step (`step`) in the same
        transaction (`RecordThenOp`). No `step`: `complete_async` alone."""

        async def write(
            checked: SettleRequest | None,
        ) -> tuple[Promise | None, tuple[Task, Promise | None]]:
            return await self._recording(
                step, CompleteOp(task_id, counter, worker_id, checked, principal)
            )

        if root_outcome is None:
            return await write(None)
        return await self._checks.settle_checked_async(root_outcome, write)

    async def heartbeat_async(
        self,
        worker_id: str,
        lease_ms: int,
        principal: Principal | None = None,
        group: str | None = None,
    ) -> Heartbeat:
        """Extend every lease the worker holds (in `group`, if given; leased to
        `principal`); returns the tasks it still holds."""
        op = HeartbeatOp(worker_id, lease_ms, principal, group)
        return await self._committer.submit_async(op)

    async def release_async(
        self, task_id: str, counter: int, worker_id: str, principal: Principal | None = None
    ) -> Task:
        op = ReleaseOp(task_id, counter, worker_id, principal)
        return await self._committer.submit_async(op)

    async def register_callbacks_async(
        self,
        task_id: str,
        counter: int,
        worker_id: str,
        promise_ids: Sequence[str],
        principal: Principal | None = None,
    ) -> list[Promise]:
        """Callbacks for the promises the root waits on, or those already settled."""
        op = RegisterCallbacksOp(task_id, counter, worker_id, tuple(promise_ids), principal)
        return await self._committer.submit_async(op)

    def worker_gone(self, worker_id: str, group: str, principal: str | None = None) -> list[Task]:
        """The worker's last stream of `group` broke: its tasks of that group (leased to
        `principal`) go back. Its tasks of other groups stay with their own streams."""
        return self._committer.submit(
            ReclaimOp(worker_id, None, 0, principal=principal, group=group)
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


__all__ = ["TaskService"]
