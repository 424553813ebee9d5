"""A workflow's state slots: the run's own read or write, recorded as its step
(`StateStepOp`), and an operator's rewrite by compare-and-swap while the run is
parked (`ReplaceStateOp`). Each is one write transaction: the slot, the task's
state and the root are read where the write is made."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from troth_server.domain import promise as domain
from troth_server.domain import settle_tokens, states, steps
from troth_server.domain.errors import NotAWorkflow, PromiseNotFound
from troth_server.domain.promise import PromiseState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.writes.batch import Batch, Keys
from troth_server.writes.ops.create import CreateOp

if TYPE_CHECKING:
    from troth_server.domain.promise import CreateRequest, Payload, Promise
    from troth_server.domain.states import Lost, WorkflowState
    from troth_server.domain.steps import Fence
    from troth_server.store import WriteTx


@dataclass(frozen=True, slots=True)
class StateStepOp:
    """The run reads (`value` None) or writes its slot `name`, recorded as step
    `request.id`, resolved with the slot's value and tagged with its version, in one
    transaction: a replay gets what the run saw. Only the worker holding the task now
    (current counter) may: a worker that lost its lease reads or writes nothing. A
    repeat of a recorded step answers it as recorded (nothing read or written again)."""

    request: CreateRequest
    principal: str | None
    fence: Fence
    name: str
    value: Payload | None = None
    instance: int = field(default_factory=lambda: 1 + secrets.randbelow(settle_tokens.MAX_INSTANCE))

    def keys(self, tx: WriteTx, now: int) -> Keys:
        # The slot's root is the task's: learned unlocked (it never changes), locked
        # with the task as the batch loads it.
        peeked = tx.get_tasks((self.fence.task_id,), lock=False).get(self.fence.task_id)
        slots = () if peeked is None else ((peeked.root_promise_id, self.name),)
        return Keys(promises=(self.request.id,), task_ids=(self.fence.task_id,), states=slots)

    def apply(self, batch: Batch) -> tuple[Promise, bool]:
        task = steps.check_fence(batch.task(self.fence.task_id), self.fence, pending=True)
        root = batch.get(task.root_promise_id)
        if root is None:
            raise PromiseNotFound(task.root_promise_id)
        existing = batch.get(self.request.id)
        if existing is not None and existing.parent_id == root.id:
            return existing, False  # recorded already (a retry after a lost reply)
        slot = batch.state(root.id, self.name)
        written = None if self.value is None else states.written_by_run(slot, self.value, batch.now)
        seen = slot if written is None else written
        tags = {
            **self.request.tags,
            states.STATE_TAG: self.name,
            states.VERSION_TAG: str(seen.version),
        }
        settled_with = domain.SettleRequest(
            id=self.request.id,
            state=PromiseState.RESOLVED,
            value=seen.value,
            idempotency_key=self.request.idempotency_key,
            principal=self.principal,
        )
        create = CreateOp(
            replace(self.request, tags=tags),
            self.principal,
            settled_with,
            self.fence,
            self.instance,
        )
        promise, created = create.apply(batch)
        if written is not None and created:
            batch.put_state(written)  # staged only once the step's record is
        return promise, created


@dataclass(frozen=True, slots=True)
class ReplaceStateOp:
    """An operator's rewrite of workflow `root_id`'s slot `name`, based on
    `expected_version`: written only if the run is parked and the slot still at that
    version, decided here, in the write's transaction (`states.replace`)."""

    root_id: str
    name: str
    value: Payload
    expected_version: int
    principal: str | None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(
            promises=(self.root_id,), roots=(self.root_id,), states=((self.root_id, self.name),)
        )

    def apply(self, batch: Batch) -> tuple[WorkflowState, Lost | None]:
        root = batch.get(self.root_id)
        if root is None:
            raise PromiseNotFound(self.root_id)
        if INVOKE_TAG not in root.tags:
            raise NotAWorkflow(root.id)
        slot = batch.state(root.id, self.name)
        outcome = states.replace(
            slot,
            root,
            batch.active_task(root.id),
            self.expected_version,
            self.value,
            self.principal,
            batch.now,
        )
        if isinstance(outcome, states.Lost):
            return slot, outcome
        batch.put_state(outcome)
        return outcome, None
