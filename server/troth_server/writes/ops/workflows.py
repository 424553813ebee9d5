"""An operator's writes on a workflow as a whole: fail it (`FailWorkflowOp`), move it to
another version of its code (`MoveWorkflowOp`), retry it now (`RetryNowOp`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth_server.domain import promise as domain
from troth_server.domain import task as tasks
from troth_server.domain.errors import NotAWorkflow, PromiseNotFound
from troth_server.domain.promise import PromiseState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.domain.task import Task, TaskState
from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.domain.promise import Payload, Promise
    from troth_server.store import WriteTx


@dataclass(frozen=True, slots=True)
class FailWorkflowOp:
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
class MoveWorkflowOp:
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
class RetryNowOp:
    """An operator retries a paused workflow now: its task, PENDING after its code
    failed, is claimable at the transaction's time instead of after its backoff."""

    root_id: str

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=(self.root_id,), roots=(self.root_id,))

    def apply(self, batch: Batch) -> Task:
        root = batch.get(self.root_id)
        if root is None:
            raise PromiseNotFound(self.root_id)
        if INVOKE_TAG not in root.tags:
            raise NotAWorkflow(root.id)
        active = batch.active_task(root.id)
        if root.is_settled or active is None:
            raise tasks.WorkflowNotPaused(root.id, active, root.state.value)
        hurried = tasks.retry_now(active, batch.now)
        batch.put_task(hurried)
        return hurried
