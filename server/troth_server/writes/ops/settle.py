"""Settling a promise (`ResolvePromise`, `RejectPromise`, a cancel), with the writer's
part of the settle guard (`troth_server.guard`): comparisons only."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from troth_server.domain import approvers as policies
from troth_server.domain import promise as domain
from troth_server.domain import settle_tokens, steps
from troth_server.domain.promise import PromiseState
from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.domain.promise import Promise, SettleRequest
    from troth_server.domain.steps import Fence
    from troth_server.domain.task import Task
    from troth_server.store import WriteTx


class Settled(NamedTuple):
    """What a settle wrote, and what it knows of the workflow it resumes."""

    promise: Promise
    applied: bool
    workflow_task: Task | None = None
    """The active task of the promise's parent workflow, if it has one."""
    workflow_known: bool = False
    """Whether the settle's batch read that task (a human's settle asks for it:
    `Keys.parents_of`); if not, `workflow_task` says nothing."""


@dataclass(frozen=True, slots=True)
class SettleOp:
    request: SettleRequest
    fence: Fence | None = None
    """A worker recording a step's result on a step created pending."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        # A workflow's root settling ends its pending steps (§4.10, §4.11).
        promise_ids: tuple[str, ...] = (self.request.id,)
        if self.fence is not None:
            return Keys(promises=promise_ids, task_ids=(self.fence.task_id,), steps_of=promise_ids)
        if self.request.create_if_missing:
            promise_ids += tuple(steps.namespace_roots(self.request.id))
        # A distinct quorum's other approvals: who settled them is compared here.
        promise_ids += self.request.quorum
        # A cancelled workflow's task waiting out a retry backoff is hurried (Batch.settle).
        cancel = self.request.state is PromiseState.REJECTED_CANCELED
        return Keys(
            promises=promise_ids,
            steps_of=promise_ids[:1],
            roots=promise_ids[:1] if cancel else (),
            # Not read for a cancel (or a worker's own step): its reply says nothing of it.
            parents_of=() if cancel else promise_ids[:1],
        )

    def apply(self, batch: Batch) -> Settled:
        existing = batch.get(self.request.id)
        if self.fence is not None:
            task = steps.check_fence(batch.task(self.fence.task_id), self.fence, pending=False)
            if existing is not None and existing.parent_id != task.root_promise_id:
                raise steps.ReservedForWorkflow(
                    self.request.id, f"is not a step of workflow {task.root_promise_id!r}"
                )
            if existing is None and self.request.create_if_missing:
                steps.check_step_owner(self.request.id, task.root_promise_id)
        elif self.request.state is not PromiseState.REJECTED_CANCELED and (
            existing is not None or self.request.create_if_missing
        ):
            # Cancel stays an operator's tool for any promise; resolve and reject
            # of a checkpoint are the workflow's own. A plain settle of an id that
            # does not exist yet is NOT_FOUND, in a workflow's namespace or not: the
            # workflow may not have reached that wait yet, and the caller retries.
            roots = {r: batch.get(r) for r in steps.namespace_roots(self.request.id)}
            steps.check_unfenced_settle(self.request.id, existing, roots)
            if existing is not None and not self._guarded(batch, existing):
                return Settled(existing, False)
        promise, applied = domain.settle(existing, self.request, batch.now)
        if applied and existing is None:
            # Settled before the wait exists: watchers hear a create, then a settle.
            existing = replace(
                promise,
                state=PromiseState.PENDING,
                value=domain.EMPTY,
                settle_time=None,
                idempotency_key_for_settle=None,
                settled_by=None,
            )
            batch.add(existing, self.request.principal)
        if applied:
            assert existing is not None
            # A workflow root's pending steps end with it, in this transaction.
            batch.settle(existing, promise)
        parent = promise.parent_id
        if parent is None or not batch.knows_active_task(parent):
            return Settled(promise, applied)
        return Settled(promise, applied, batch.active_task(parent), workflow_known=True)

    def _guarded(self, batch: Batch, existing: Promise) -> bool:
        """The writer's part of the settle guard (`troth_server.guard`): comparisons
        only. False for a repeat of a token's own settle, answered as it was."""
        request = self.request
        token = request.token
        if token is not None and not settle_tokens.check_use(
            existing, token, request.idempotency_key
        ):
            return False
        if existing.is_settled:
            return True  # the state machine answers: a repeat, or ALREADY_SETTLED
        if existing.approvers != request.checked_policy:
            raise policies.PolicyNotChecked(existing.id)
        if request.quorum:
            # Who settled each, by principal: a token's settle counts as its principal's.
            settlers = [p.settled_by for p in map(batch.get, request.quorum) if p is not None]
            refusal = policies.check_distinct(existing.id, request.principal, settlers)
            if refusal is not None:
                raise refusal
        return True
