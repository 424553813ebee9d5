"""What the task ops share: the task a batch holds by id, and a worker's CLAIMED tasks
locked in the one lock order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from troth_server.domain.task import Task, TaskNotFound
from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.store import WriteTx


def held(batch: Batch, task_id: str) -> Task:
    task = batch.task(task_id)
    if task is None:
        raise TaskNotFound(task_id)
    return task


def claimed_keys(tx: WriteTx, worker_id: str, group: str | None = None) -> Keys:
    """A worker's CLAIMED tasks (of one group), locked in the one lock order (after
    promises)."""
    if tx.row_locks:
        return Keys(unlocked=tx.claimed_tasks(worker_id, group, lock=False))
    return Keys(tasks=tx.claimed_tasks(worker_id, group))
