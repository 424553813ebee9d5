"""The writer's ops (`troth_server.writes.ops`) on their own, on a real store of each
backend: each submitted to a group committer as the services and the sweeper submit
them, with a clock the test moves. A task's lease from claim to expiry, a completion
that settles its root, a promise's create, settle and timeout."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from troth_server.domain.errors import PromiseAlreadySettled
from troth_server.domain.promise import (
    EMPTY,
    TIMEOUT_PRINCIPAL,
    CreateRequest,
    Payload,
    PromiseState,
    SettleRequest,
)
from troth_server.domain.task import StaleCounter, Task, TaskState
from troth_server.writes.group_commit import GroupCommitter, WriteOp
from troth_server.writes.ops.complete import CompleteOp
from troth_server.writes.ops.create import CreateOp
from troth_server.writes.ops.expire import ExpireOp, ReadDueOp
from troth_server.writes.ops.leases import ClaimOp, HeartbeatOp, ReclaimOp, ReleaseOp
from troth_server.writes.ops.settle import SettleOp

if TYPE_CHECKING:
    from troth_server.store import Store

T0 = 1_767_225_600_000
HOUR = 3_600_000
LEASE = 10_000
WORKFLOW = {"troth:invoke": "g", "troth:func": "publish"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@dataclass
class Writer:
    clock: Clock
    store: Store
    committer: GroupCommitter

    def __call__(self, op: WriteOp[Any]) -> Any:
        return self.committer.submit(op)

    def start(self, root: str) -> None:
        self(CreateOp(CreateRequest(root, Payload({}, b"[]"), WORKFLOW, ttl=HOUR), None))

    def claim(self, worker: str) -> list[Task]:
        return [c.task for c in self(ClaimOp("g", worker, 10, LEASE))]

    def expire_leases(self, came_back: int | None = None) -> list[Task]:
        returned: list[Task] = self(
            ReclaimOp(None, None, 100, None if came_back is None else lambda _now: came_back)
        )
        return returned


@pytest.fixture
def writer(store: Store) -> Iterator[Writer]:
    clock = Clock()
    committer = GroupCommitter(store, clock, on_commit=lambda changes: None)
    committer.start()
    yield Writer(clock, store, committer)
    committer.stop()


def test_a_lease_from_claim_to_expiry(writer: Writer) -> None:
    writer.start("wf-1")
    (task,) = writer.claim("w1")
    assert (task.state, task.worker_id, task.lease_expire_time) == (
        TaskState.CLAIMED, "w1", T0 + LEASE,
    )  # fmt: skip
    writer.clock.now += LEASE // 2
    beat = writer(HeartbeatOp("w1", LEASE))
    assert [t.id for t in beat.tasks] == [task.id] and beat.now == writer.clock.now
    writer.clock.now += LEASE - 1
    assert writer.expire_leases() == []  # the heartbeat moved the lease on
    writer.clock.now += 1
    (back,) = writer.expire_leases()
    assert (back.id, back.state, back.worker_id) == (task.id, TaskState.PENDING, None)
    (again,) = writer.claim("w2")
    assert (again.id, again.counter) == (task.id, task.counter + 1)
    with pytest.raises(StaleCounter):
        writer(CompleteOp(task.id, task.counter, "w1", None))
    released = writer(ReleaseOp(again.id, again.counter, "w2"))
    assert released.state is TaskState.PENDING


def test_no_lease_is_taken_within_one_lease_length_of_coming_back(writer: Writer) -> None:
    """DESIGN §4: a server away (frozen, cut off from its store) keeps every lease for
    one lease length after it comes back, since no worker could heartbeat meanwhile."""
    writer.start("wf-away")
    writer.claim("w1")
    writer.clock.now += 3 * LEASE
    back = writer.clock.now
    assert writer.expire_leases(came_back=back) == []
    writer.clock.now = back + LEASE - 1
    assert writer.expire_leases(came_back=back) == []
    writer.clock.now = back + LEASE
    assert [t.state for t in writer.expire_leases(came_back=back)] == [TaskState.PENDING]


def test_a_completion_settles_its_root_in_its_transaction(writer: Writer) -> None:
    writer.start("wf-done")
    (task,) = writer.claim("w1")
    outcome = SettleRequest("wf-done", PromiseState.RESOLVED, Payload({}, b'"ok"'))
    done, root = writer(CompleteOp(task.id, task.counter, "w1", outcome))
    assert done.state is TaskState.COMPLETED
    assert root is not None and (root.state, root.value.data) == (PromiseState.RESOLVED, b'"ok"')
    stored = writer.store.get_promise("wf-done")
    assert stored == root


def test_a_promise_created_settled_and_timed_out(writer: Writer) -> None:
    created, was_created = writer(CreateOp(CreateRequest("p", EMPTY, {}, ttl=1_000), None))
    assert was_created and created.state is PromiseState.PENDING
    settled, applied = writer(SettleOp(SettleRequest("p", PromiseState.RESOLVED, EMPTY)))[:2]
    assert applied and settled.state is PromiseState.RESOLVED
    with pytest.raises(PromiseAlreadySettled):
        writer(SettleOp(SettleRequest("p", PromiseState.REJECTED, EMPTY, "other")))

    writer(CreateOp(CreateRequest("due", EMPTY, {}, ttl=1_000), None))
    writer(CreateOp(CreateRequest("timer", EMPTY, {"troth:timer": "true"}, ttl=2_000), None))
    writer.clock.now += 1_000
    (read,) = writer(ReadDueOp(("due",)))
    assert (read.state, read.settled_by) == (PromiseState.REJECTED_TIMEDOUT, TIMEOUT_PRINCIPAL)
    writer.clock.now += 1_000
    assert writer(ExpireOp(None, 10)) == 1  # the timer; "due" was settled by the read
    timer = writer.store.get_promise("timer")
    assert timer is not None and (timer.state, timer.settle_time) == (
        PromiseState.RESOLVED, T0 + 2_000,
    )  # fmt: skip
