"""Creating a promise (`CreatePromise`, a workflow's start, a step written by its
worker under its task's fence), or finding its repeat."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from troth_server.domain import approvers as policies
from troth_server.domain import promise as domain
from troth_server.domain import settle_tokens, steps
from troth_server.domain.errors import PromiseNotFound
from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.domain.promise import CreateRequest, Promise, SettleRequest
    from troth_server.domain.steps import Fence
    from troth_server.store import WriteTx


log = structlog.get_logger("troth.promises")


@dataclass(frozen=True, slots=True)
class CreateOp:
    request: CreateRequest
    principal: str | None
    settled_with: SettleRequest | None = None
    fence: Fence | None = None
    """The task of the workflow whose step this is (DESIGN §4.13)."""
    instance: int = field(default_factory=lambda: 1 + secrets.randbelow(settle_tokens.MAX_INSTANCE))
    """The created promise's `instance`, drawn once (an op may be applied again)."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        promise_ids = (self.request.id,)
        if self.fence is not None:
            # The task's root (the workflow) is loaded and locked with the task.
            return Keys(promises=promise_ids, task_ids=(self.fence.task_id,))
        return Keys(promises=(*promise_ids, *steps.namespace_roots(self.request.id)))

    def apply(self, batch: Batch) -> tuple[Promise, bool]:
        request = self.request
        existing = batch.get(request.id)
        cap: int | None = None
        links: tuple[str, str] | None = None
        started_by = self.principal
        early_refused = False
        if self.fence is None:
            roots = {r: batch.get(r) for r in steps.namespace_roots(request.id)}
            steps.check_unfenced_create(request.id, request.tags, roots)
        else:
            workflow = self._workflow(batch, existing)
            # A step never outlives its workflow (nor, so, its top-level root).
            cap, links = workflow.expire_time, steps.links_under(workflow)
            # Four-eyes compares with who started the top-level workflow (§7).
            started_by = workflow.started_by
        if (
            existing is not None
            and domain.is_early(existing)
            and not steps.is_workflow_start(request.tags)
        ):
            refusal = policies.early_refusal(request.approvers, existing, started_by)
            if refusal is not None:
                # Settled before its policy existed, by someone it does not allow:
                # that settle never counts; the promise is created pending (DESIGN §7).
                log.warning(
                    "promise.early_settle_refused",
                    promise_id=request.id,
                    settled_by=existing.settled_by,
                    rule=refusal.rule.value,
                    message=refusal.message,
                )
                existing = None
                early_refused = True
        promise, created = domain.create(
            existing,
            request,
            batch.now,
            cap=cap,
            links=links,
            started_by=started_by,
            instance=self.instance,
        )
        if not created and existing is not None and domain.is_early(existing):
            batch.rewrite(promise)  # a settled-early promise, adopted by its creator
        if created:
            if early_refused:
                batch.rewrite(promise)  # the row of the early settle, pending again
            else:
                batch.add(promise, self.principal)
            if self.settled_with is not None:
                settled, _ = domain.settle(promise, self.settled_with, batch.now)
                batch.settle(promise, settled)
                promise = settled
        return promise, created

    def _workflow(self, batch: Batch, existing: Promise | None) -> Promise:
        """The workflow whose task the fence names, if it may write this step."""
        assert self.fence is not None
        pending = self.settled_with is None
        task = steps.check_fence(batch.task(self.fence.task_id), self.fence, pending=pending)
        workflow = batch.get(task.root_promise_id)
        if workflow is None:
            raise PromiseNotFound(task.root_promise_id)
        steps.check_step_owner(self.request.id, workflow.id)
        if existing is not None:
            latent = pending and not steps.is_checkpoint(self.request.tags)
            steps.check_owner(existing, workflow, latent=latent, early=domain.is_early(existing))
        elif pending and workflow.is_settled:
            raise steps.WorkflowSettled(self.request.id, workflow)
        return workflow
