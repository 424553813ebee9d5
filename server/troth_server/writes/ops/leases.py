"""A task's lease: claimed (`ClaimOp`), kept (`HeartbeatOp`), given back by its worker
(`ReleaseOp`), or taken back when it ran out or its stream broke (`ReclaimOp`); and
the task a worker's fence names (`HeldTaskOp`, a lookup on the writer)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troth_server.domain import steps
from troth_server.domain import task as tasks
from troth_server.domain.routing import ANY, Route
from troth_server.writes.batch import Batch, Keys, claim_in
from troth_server.writes.ops._tasks import claimed_keys, held

if TYPE_CHECKING:
    from collections.abc import Callable

    from troth_server.domain.access import Principal
    from troth_server.domain.promise import Promise
    from troth_server.domain.steps import Fence
    from troth_server.domain.task import Task
    from troth_server.store import WriteTx


@dataclass(frozen=True, slots=True)
class Claimed:
    task: Task
    root: Promise | None


@dataclass(frozen=True, slots=True)
class ClaimOp:
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
class HeartbeatOp:
    worker_id: str
    lease_ms: int
    principal: Principal | None = None
    """The caller: only the tasks leased to it are extended (None: auth off, all)."""
    group: str | None = None
    """Only the tasks of this group (None: of every group)."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return claimed_keys(tx, self.worker_id, self.group)

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
class ReleaseOp:
    task_id: str
    counter: int
    worker_id: str
    principal: Principal | None = None

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(task_ids=(self.task_id,))

    def apply(self, batch: Batch) -> Task:
        task = held(batch, self.task_id)
        released = tasks.release(task, self.worker_id, self.counter, self.principal)
        batch.put_task(released)
        return released


@dataclass(frozen=True, slots=True)
class ReclaimOp:
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
            return claimed_keys(tx, self.worker_id, self.group)
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


@dataclass(frozen=True, slots=True)
class HeldTaskOp:
    """Reads the task a worker's fence names, on the writer (a lookup, no write)."""

    fence: Fence

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(task_ids=(self.fence.task_id,))

    def apply(self, batch: Batch) -> Task:
        return steps.check_fence(batch.task(self.fence.task_id), self.fence, pending=True)
