"""Use cases of workflows as a whole: list them (`SearchWorkflows`), retry a paused
one now (`RetryWorkflowNow`), and read or rewrite its state slots (`GetWorkflowState`,
`ReplaceWorkflowState`: a compare-and-swap, one write op through the group committer).

A workflow is the promise that starts one (tagged `troth:invoke`, its group; its
name `troth:func`), with its steps (`parent_id` is it) and at most one task that
is not completed. The listing reads the store's workflow indexes, then, for the
page only, each root's task and the PENDING steps it waits on; the retry is one
write op through the group committer, whose commit wakes the dispatcher (a task
left PENDING), so the task is delivered at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from troth_server import paging
from troth_server.domain import states, steps
from troth_server.domain.errors import NotAWorkflow, PromiseNotFound
from troth_server.domain.promise import PromiseState
from troth_server.domain.steps import INVOKE_TAG
from troth_server.store import PromiseOrder
from troth_server.writes.ops.states import ReplaceStateOp
from troth_server.writes.ops.workflows import RetryNowOp

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.domain.promise import Payload, Promise
    from troth_server.domain.states import Lost, WorkflowState
    from troth_server.domain.task import Task
    from troth_server.store import Store, WorkflowQuery
    from troth_server.writes.group_commit import GroupCommitter


@dataclass(frozen=True, slots=True)
class Workflow:
    """One workflow as a listing shows it."""

    root: Promise
    task: Task | None
    """Its task that is not completed, if it has one."""
    waiting_on: list[Promise]
    """Its PENDING steps that no worker settles (human decisions), in creation order."""

    @property
    def group(self) -> str:
        return self.root.tags.get(INVOKE_TAG, "")


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    workflows: list[Workflow]
    next_page_token: str


class WorkflowService:
    def __init__(
        self,
        store: Store,
        committer: GroupCommitter,
        clock: Callable[[], int],
        decided: Callable[[list[Promise], int], list[Promise]],
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._decided = decided
        """A reader's view of promises past their expire_time, as the writer decides
        them (`PromiseService.decided`)."""

    def search(self, query: WorkflowQuery, page_token: str) -> WorkflowPage:
        """A page of the workflows `query` matches (its `limit` is the page size), each
        with its task and the human decisions it waits on. A page may come back
        shorter than asked, keeping its token, when a root the filter took for PENDING
        has just timed out (the writer decides)."""
        order = PromiseOrder.CREATED_DESC if query.newest_first else PromiseOrder.CREATED_ASC
        fingerprint = paging.workflow_fingerprint(query)
        after = (
            paging.decode(page_token, order, fingerprint, paging.WORKFLOW_FILTERS)
            if page_token
            else paging.START
        )
        now = self._clock()
        rows = self._store.search_workflows(
            replace(query, after_seq=after.seq, limit=query.limit + 1), now
        )
        more = len(rows) > query.limit
        rows = rows[: query.limit]
        token = paging.encode(paging.Cursor(rows[-1].seq), order, fingerprint) if more else ""
        roots = self._decided([r.promise for r in rows], now)
        if query.states:
            roots = [p for p in roots if p.state in query.states]
        if query.waiting_for_human:
            roots = [p for p in roots if p.state is PromiseState.PENDING]
        return WorkflowPage(self._described(roots, now), token)

    def _described(self, roots: list[Promise], now: int) -> list[Workflow]:
        """Each root with its task (one read for the page) and the PENDING human steps
        it waits on (one read of the page's PENDING steps)."""
        ids = [r.id for r in roots]
        active = self._store.active_tasks(ids)
        waiting: dict[str, list[Promise]] = {}
        pending = [r.id for r in roots if r.state is PromiseState.PENDING]
        for step in self._store.pending_steps(pending):
            overdue = step.expire_time is not None and step.expire_time <= now
            if step.parent_id is not None and not overdue and not steps.is_checkpoint(step.tags):
                waiting.setdefault(step.parent_id, []).append(step)
        return [Workflow(r, active.get(r.id), waiting.get(r.id, [])) for r in roots]

    async def retry_now_async(self, root_id: str) -> Task:
        """Offer workflow `root_id`'s paused task at once (its next attempt now);
        returns it. Refused (`WorkflowNotPaused`) if its task is not paused."""
        return await self._committer.submit_async(RetryNowOp(root_id))

    def get_state(
        self, root_id: str, name: str, *, require_parked: bool = False
    ) -> tuple[WorkflowState, Promise, str | None]:
        """Workflow `root_id`'s slot `name` (version 0: never written), its root as a
        reader sees it, and why the run is not parked (None: it is). With
        `require_parked`, a run that is not parked is refused (`WorkflowNotParked`)."""
        found = self._store.get_promise(root_id)
        if found is None:
            raise PromiseNotFound(root_id)
        if INVOKE_TAG not in found.tags:
            raise NotAWorkflow(root_id)
        (root,) = self._decided([found], self._clock())
        slot = self._store.workflow_state(root_id, name) or states.WorkflowState(root_id, name)
        why = states.not_parked_because(root, self._store.active_tasks([root_id]).get(root_id))
        if require_parked and why is not None:
            raise states.WorkflowNotParked(root_id, why)
        return slot, root, why

    async def replace_state_async(
        self,
        root_id: str,
        name: str,
        value: Payload,
        expected_version: int,
        principal: str | None,
    ) -> tuple[WorkflowState, Lost | None]:
        """An operator's rewrite by compare-and-swap (`ReplaceStateOp`): the new slot and
        None, or the slot as it is and what the rewrite lost to."""
        op = ReplaceStateOp(root_id, name, value, expected_version, principal)
        return await self._committer.submit_async(op)


__all__ = ["Workflow", "WorkflowPage", "WorkflowService"]
