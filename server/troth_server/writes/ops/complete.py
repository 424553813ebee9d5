"""A worker ends its hold of a task: completes it (`CompleteOp`, settling its root), parks
its workflow on promises (`RegisterCallbacksOp`, `SuspendOp`), or fails it on a bug
(`FailOp`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth_server.domain import promise as domain
from troth_server.domain import task as tasks
from troth_server.domain.errors import PromiseNotFound
from troth_server.domain.task import Callback, Task, TaskKind
from troth_server.writes.batch import Batch, Keys
from troth_server.writes.ops._tasks import held

if TYPE_CHECKING:
    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.store import WriteTx


@dataclass(frozen=True, slots=True)
class CompleteOp:
    task_id: str
    counter: int
    worker_id: str
    root_outcome: SettleRequest | None
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        # Settling the root ends its pending steps in the same transaction (§4.11).
        return Keys(task_ids=(self.task_id,), steps_of_task_roots=self.root_outcome is not None)

    def apply(self, batch: Batch) -> tuple[Task, Promise | None]:
        task = held(batch, self.task_id)
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
class SuspendOp:
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
        task = held(batch, self.task_id)
        tasks.check_leased_to(task, self.principal)
        if tasks.completed_by(task, self.worker_id, self.counter):
            return task, []  # a retry: this worker's suspension already committed
        settled = RegisterCallbacksOp(
            self.task_id, self.counter, self.worker_id, self.promise_ids, self.principal
        ).apply(batch)
        if settled:
            return held(batch, self.task_id), settled
        done, _ = CompleteOp(
            self.task_id, self.counter, self.worker_id, None, self.principal
        ).apply(batch)
        return done, []


@dataclass(frozen=True, slots=True)
class FailOp:
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
        task = held(batch, self.task_id)
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
class RegisterCallbacksOp:
    task_id: str
    counter: int
    worker_id: str
    promise_ids: tuple[str, ...]
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=self.promise_ids, task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> list[Promise]:
        task = held(batch, self.task_id)
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
