"""Task use cases in-process on a real SQLite file: start, claim, suspend on callbacks,
resume, complete with the root's result, leases and fencing (groundwork for issue 3)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from troth_server.domain import task as domain_task
from troth_server.domain.errors import PromiseNotFound
from troth_server.domain.promise import (
    EMPTY,
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)
from troth_server.domain.steps import Fence
from troth_server.domain.task import StaleCounter, Task, TaskKind, TaskNotFound, TaskState
from troth_server.service import PromiseService
from troth_server.store import open_store
from troth_server.sweeper import LeaseExpiry, Sweeper
from troth_server.task_service import TaskService
from troth_server.watch import WatchHub
from troth_server.writes.batch import Batch
from troth_server.writes.group_commit import GroupCommitter

HOUR = 3_600_000
LEASE = 10_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Env:
    clock: Clock
    promises: PromiseService
    tasks: TaskService
    committer: GroupCommitter

    def start(self, root: str, group: str = "workers") -> tuple[Promise, bool]:
        tags = {"troth:invoke": group, "troth:func": "publish"}
        return asyncio.run(
            self.promises.create_async(CreateRequest(root, Payload({}, b"[]"), tags, ttl=HOUR))
        )

    def latent(self, promise_id: str, task: Task | None = None) -> Promise:
        """A latent promise; with `task`, a step written by the worker holding it."""
        fence = None if task is None else Fence(task.id, task.counter, task.worker_id or "")
        request = CreateRequest(promise_id, EMPTY, {}, ttl=HOUR)
        return asyncio.run(self.promises.create_async(request, fence=fence))[0]

    def resolve(self, promise_id: str) -> Promise:
        return asyncio.run(
            self.promises.settle_async(SettleRequest(promise_id, PromiseState.RESOLVED, EMPTY))
        )[0]

    def claim(self, worker: str, limit: int = 10) -> list[Task]:
        return [c.task for c in self.tasks.claim("workers", worker, limit, LEASE)]

    def expire_leases(self, came_back: Callable[[int], int] | None = None) -> list[Task]:
        """One sweeper pass: the tasks whose lease it gave back."""
        lost: list[Task] = []
        leases = LeaseExpiry(self.committer, came_back=came_back, on_lost=lost.extend)
        sweeper = Sweeper(self.promises, interval=60, batch_size=100, leases=leases)
        assert sweeper.run_once().leases_expired == len(lost)
        return lost


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    clock = Clock()
    store = open_store(f"sqlite:///{tmp_path}/t.db")
    holder: list[PromiseService] = []
    committer = GroupCommitter(store, clock, on_commit=lambda c: holder[0].on_commit(c))
    promises = PromiseService(store, committer, WatchHub(), clock)
    holder.append(promises)
    committer.start()
    yield Env(clock, promises, TaskService(store, committer, clock), committer)
    committer.stop()
    store.close()


def test_starting_a_workflow_creates_one_invoke_task(env: Env) -> None:
    assert env.start("wf-1")[1] is True
    assert env.start("wf-1")[1] is False  # a second start is the same execution
    env.latent("not-a-workflow")
    claimed = env.tasks.claim("workers", "w1", 10, LEASE)
    assert len(claimed) == 1
    task, root = claimed[0].task, claimed[0].root
    assert (task.kind, task.state, task.counter, task.worker_id) == (
        TaskKind.INVOKE, TaskState.CLAIMED, 1, "w1",
    )  # fmt: skip
    assert task.lease_expire_time == env.clock.now + LEASE
    assert root is not None and root.id == "wf-1"
    assert env.claim("w2") == []
    assert env.tasks.claim("other-group", "w3", 10, LEASE) == []


def test_complete_with_the_roots_result_in_one_call(env: Env) -> None:
    env.start("wf-2")
    (task,) = env.claim("w1")
    outcome = SettleRequest("wf-2", PromiseState.RESOLVED, Payload({}, b'"done"'))
    done, root = asyncio.run(env.tasks.complete_async(task.id, task.counter, "w1", outcome))
    assert done.state is TaskState.COMPLETED
    assert root is not None and root.state is PromiseState.RESOLVED
    assert asyncio.run(env.promises.get_async("wf-2")).value.data == b'"done"'
    assert env.claim("w2") == []


def test_suspend_then_resume_prefers_the_worker_that_suspended(env: Env) -> None:
    env.start("wf-3")
    env.start("wf-other")
    first = env.claim("w1", limit=1)[0]
    env.latent(f"{first.root_promise_id}.0", first)
    assert (
        asyncio.run(
            env.tasks.register_callbacks_async(first.id, 1, "w1", [f"{first.root_promise_id}.0"])
        )
        == []
    )
    asyncio.run(env.tasks.complete_async(first.id, 1, "w1", None))

    env.resolve(f"{first.root_promise_id}.0")
    # w2 asks first; the resume, preferring w1 (which suspended the workflow and may
    # still hold its generator), comes after the tasks that prefer nobody.
    other = env.claim("w2", limit=1)
    assert [t.kind for t in other] == [TaskKind.INVOKE]
    assert other[0].root_promise_id != first.root_promise_id
    (resume,) = env.claim("w1", limit=1)
    assert (resume.kind, resume.root_promise_id) == (TaskKind.RESUME, first.root_promise_id)


def test_register_callbacks_answers_already_settled(env: Env) -> None:
    env.start("wf-4")
    (task,) = env.claim("w1")
    env.latent("wf-4.0", task)
    env.resolve("wf-4.0")
    settled = asyncio.run(env.tasks.register_callbacks_async(task.id, 1, "w1", ["wf-4.0"]))
    assert [p.id for p in settled] == ["wf-4.0"]
    with pytest.raises(PromiseNotFound):
        asyncio.run(env.tasks.register_callbacks_async(task.id, 1, "w1", ["wf-4.nope"]))
    with pytest.raises(StaleCounter):
        asyncio.run(env.tasks.register_callbacks_async(task.id, 7, "w1", ["wf-4.0"]))


def test_one_resume_per_root_however_many_settle(env: Env) -> None:
    env.start("wf-5")
    (task,) = env.claim("w1")
    for n in range(3):
        env.latent(f"wf-5.{n}", task)
    asyncio.run(
        env.tasks.register_callbacks_async(task.id, 1, "w1", [f"wf-5.{n}" for n in range(3)])
    )
    asyncio.run(env.tasks.complete_async(task.id, 1, "w1", None))
    for n in range(3):
        env.resolve(f"wf-5.{n}")
    resumes = env.claim("w1")
    assert [t.kind for t in resumes] == [TaskKind.RESUME]


def test_a_settle_while_the_task_runs_resumes_after_it(env: Env) -> None:
    env.start("wf-6")
    (task,) = env.claim("w1")
    env.latent("wf-6.0", task)
    env.latent("wf-6.1", task)
    asyncio.run(env.tasks.register_callbacks_async(task.id, 1, "w1", ["wf-6.0"]))
    asyncio.run(env.tasks.complete_async(task.id, 1, "w1", None))
    env.resolve("wf-6.0")
    (resume,) = env.claim("w1")
    # While the resume runs, it registers on .1 and .1 settles before it completes.
    asyncio.run(env.tasks.register_callbacks_async(resume.id, resume.counter, "w1", ["wf-6.1"]))
    env.resolve("wf-6.1")
    assert env.claim("w2") == []  # still one active task for the root
    asyncio.run(env.tasks.complete_async(resume.id, resume.counter, "w1", None))
    (again,) = env.claim("w1")
    assert again.kind is TaskKind.RESUME and again.id != resume.id


def test_lease_expiry_and_fencing(env: Env) -> None:
    env.start("wf-7")
    (task,) = env.claim("w1")
    env.clock.now += LEASE // 2
    assert [t.id for t in asyncio.run(env.tasks.heartbeat_async("w1", LEASE)).tasks] == [task.id]
    env.clock.now += LEASE - 1
    assert env.expire_leases() == []  # the heartbeat moved the lease on
    env.clock.now += 1
    assert [t.state for t in env.expire_leases()] == [TaskState.PENDING]
    (moved,) = env.claim("w2")
    assert moved.id == task.id and moved.counter == 2
    with pytest.raises(StaleCounter):
        asyncio.run(env.tasks.complete_async(task.id, 1, "w1", None))
    with pytest.raises(StaleCounter):
        env.tasks.release(task.id, 1, "w1")
    assert asyncio.run(env.tasks.heartbeat_async("w1", LEASE)).tasks == []
    with pytest.raises(TaskNotFound):
        asyncio.run(env.tasks.complete_async("no-such-task", 1, "w2", None))


def test_a_broken_stream_and_a_release_give_tasks_back_at_once(env: Env) -> None:
    env.start("wf-8")
    env.start("wf-9")
    held = env.claim("w1")
    assert len(held) == 2
    assert len(env.tasks.worker_gone("w1", "workers")) == 2
    again = env.claim("w2")
    assert sorted(t.counter for t in again) == [2, 2]
    released = env.tasks.release(again[0].id, 2, "w2")
    assert released.state is TaskState.PENDING and released.worker_id is None
    assert [t.id for t in env.claim("w3")] == [again[0].id]


def test_cancelling_a_root_cancels_its_pending_descendants_and_resumes_it(env: Env) -> None:
    env.start("wf-10")
    (task,) = env.claim("w1")
    for n in range(3):
        env.latent(f"wf-10.{n}", task)
    env.resolve("wf-10.2")
    asyncio.run(env.tasks.register_callbacks_async(task.id, 1, "w1", ["wf-10.0"]))
    asyncio.run(env.tasks.complete_async(task.id, 1, "w1", None))

    cancel = SettleRequest("wf-10", PromiseState.REJECTED_CANCELED, EMPTY, principal="ops")
    settled = asyncio.run(env.promises.settle_async(cancel))
    root, applied = settled.promise, settled.applied
    assert applied and root.state is PromiseState.REJECTED_CANCELED
    states = {n: asyncio.run(env.promises.get_async(f"wf-10.{n}")).state for n in range(3)}
    assert states == {
        0: PromiseState.REJECTED_CANCELED,
        1: PromiseState.REJECTED_CANCELED,
        2: PromiseState.RESOLVED,  # settled before: never changes
    }
    assert asyncio.run(env.promises.get_async("wf-10.1")).settled_by == "ops"
    # The workflow resumes, sees Cancelled at its next yield, and may compensate.
    (resume,) = env.claim("w1")
    assert (resume.kind, resume.root_promise_id) == (TaskKind.RESUME, "wf-10")
    # Finishing (after compensation) does not override the cancel.
    outcome = SettleRequest("", PromiseState.REJECTED, Payload({}, b'"compensated"'))
    done, final = asyncio.run(env.tasks.complete_async(resume.id, resume.counter, "w1", outcome))
    assert done.state is TaskState.COMPLETED
    assert final is not None and final.state is PromiseState.REJECTED_CANCELED


def test_cancelling_a_plain_promise_takes_nothing_along(env: Env) -> None:
    env.latent("plain")
    env.latent("plain.note")
    asyncio.run(
        env.promises.settle_async(SettleRequest("plain", PromiseState.REJECTED_CANCELED, EMPTY))
    )
    assert asyncio.run(env.promises.get_async("plain.note")).state is PromiseState.PENDING


def test_a_step_never_outlives_its_workflow(env: Env) -> None:
    tags = {"troth:invoke": "workers", "troth:func": "publish"}
    root, _ = asyncio.run(
        env.promises.create_async(CreateRequest("wf-11", EMPTY, tags, ttl=60_000))
    )
    (task,) = env.claim("w1")
    fence = Fence(task.id, task.counter, "w1")

    def step(promise_id: str, ttl: int | None) -> Promise:
        return asyncio.run(
            env.promises.create_async(CreateRequest(promise_id, EMPTY, {}, ttl=ttl), fence=fence)
        )[0]

    assert step("wf-11.0", HOUR).expire_time == root.expire_time  # capped; the creator is told
    assert step("wf-11.1", None).expire_time == root.expire_time
    assert step("wf-11.2", 1_000).expire_time == env.clock.now + 1_000
    # Only a workflow root caps: a dotted id under a plain promise keeps its ttl.
    asyncio.run(env.promises.create_async(CreateRequest("order", EMPTY, {}, ttl=60_000)))
    other, _ = asyncio.run(
        env.promises.create_async(CreateRequest("order.note-7", EMPTY, {}, ttl=HOUR))
    )
    assert other.expire_time == env.clock.now + HOUR


def test_a_repeated_completion_is_answered_and_changes_nothing(env: Env) -> None:
    """A CompleteTask retried through another replica after its first reply was lost."""
    env.start("wf-again")
    (task,) = env.claim("w1")
    outcome = SettleRequest("wf-again", PromiseState.RESOLVED, Payload({}, b'"first"'))
    done, _ = asyncio.run(env.tasks.complete_async(task.id, task.counter, "w1", outcome))
    again = SettleRequest("wf-again", PromiseState.RESOLVED, Payload({}, b'"second"'))
    repeated, root_again = asyncio.run(env.tasks.complete_async(task.id, task.counter, "w1", again))
    assert repeated == done
    assert root_again is not None and root_again.value.data == b'"first"'
    assert env.claim("w2") == []  # no second RESUME or INVOKE came of it
    with pytest.raises(StaleCounter):  # another worker, or another counter, is refused
        asyncio.run(env.tasks.complete_async(task.id, task.counter, "w2", None))
    with pytest.raises(StaleCounter):
        asyncio.run(env.tasks.complete_async(task.id, task.counter + 1, "w1", None))


def test_a_repeated_suspension_is_answered_and_changes_nothing(env: Env) -> None:
    env.start("wf-park")
    (task,) = env.claim("w1")
    env.latent("wf-park.0", task)
    first = asyncio.run(env.tasks.suspend_async(task.id, task.counter, "w1", ["wf-park.0"]))
    assert first[0].state is TaskState.COMPLETED and first[1] == []
    assert asyncio.run(env.tasks.suspend_async(task.id, task.counter, "w1", ["wf-park.0"])) == first
    env.resolve("wf-park.0")
    (resume,) = env.claim("w1")
    assert (resume.kind, resume.root_promise_id) == (TaskKind.RESUME, "wf-park")


def test_after_an_outage_a_lease_is_kept_one_lease_length(env: Env) -> None:
    env.start("wf-outage")
    env.claim("w1")
    env.clock.now += 3 * LEASE  # the server was away: nobody could heartbeat
    back = [env.clock.now]

    def came_back(now: int) -> int:
        return back[0]

    def expired() -> list[TaskState]:
        return [t.state for t in env.expire_leases(came_back)]

    assert expired() == []
    env.clock.now += LEASE - 1
    assert expired() == []
    # The worker heartbeats in time, asking for a longer lease: that one is recorded.
    asyncio.run(env.tasks.heartbeat_async("w1", 2 * LEASE))
    lease_ends = env.clock.now + 2 * LEASE
    back[0] = env.clock.now + LEASE  # and the server is away again, for a while
    env.clock.now = lease_ends + LEASE // 2
    assert expired() == []  # within 2 * LEASE of coming back
    env.clock.now = back[0] + 2 * LEASE
    assert expired() == [TaskState.PENDING]


def test_a_task_failed_on_a_bug_waits_its_backoff_unless_its_workflow_is_cancelled(
    env: Env,
) -> None:
    env.start("wf-bug")
    (task,) = env.claim("w1")
    failed, root = asyncio.run(
        env.tasks.fail_async(task.id, task.counter, "w1", "NameError: x", "tb")
    )
    assert root is not None and root.state is PromiseState.PENDING
    assert failed.state is TaskState.PENDING and failed.failed_attempts == 1
    assert failed.next_attempt_time is not None
    assert env.claim("w2") == []  # in its backoff: no worker gets it
    env.clock.now = failed.next_attempt_time
    (again,) = env.claim("w2")  # then any worker does (fixed code, say)
    assert again.failed_attempts == 1 and again.next_attempt_time is None

    failed, _ = asyncio.run(
        env.tasks.fail_async(again.id, again.counter, "w2", "NameError: x", "tb")
    )
    assert failed.next_attempt_time is not None and failed.next_attempt_time > env.clock.now
    assert env.claim("w1") == []
    # Cancelled: the workflow must hear of it now (and may compensate), not after the backoff.
    asyncio.run(
        env.promises.settle_async(SettleRequest("wf-bug", PromiseState.REJECTED_CANCELED, EMPTY))
    )
    (hurried,) = env.claim("w1")
    assert hurried.id == task.id and hurried.failed_attempts == 2


def test_a_batch_gives_a_group_s_operation_only_the_worker_s_tasks_of_that_group() -> None:
    """A heartbeat or a broken stream of one group shares its batch with other
    operations, which may have loaded the same worker's tasks of other groups."""
    held = [
        domain_task.claim(
            domain_task.create(f"t-{group}", f"r-{group}", group, TaskKind.INVOKE), "w1", 0, LEASE
        )
        for group in ("a", "b")
    ]
    batch = Batch({}, 0, tasks=held)
    assert [t.id for t in batch.claimed_by("w1", "a")] == ["t-a"]
    assert sorted(t.id for t in batch.claimed_by("w1")) == ["t-a", "t-b"]
    assert batch.claimed_by("w2", "a") == []


def test_the_sweeper_gives_back_one_batch_of_expired_leases_per_pass(env: Env) -> None:
    """Lease expiry is the last part of the sweeper's pass: up to its batch size each
    time, the streams told (`on_expired`) inside the transaction, before the commit."""
    for n in range(3):
        env.start(f"wf-sweep-{n}")
    held = env.claim("w1")
    assert len(held) == 3
    env.clock.now += LEASE
    told: list[list[str]] = []
    lost: list[Task] = []

    def on_expired(tasks: list[Task]) -> None:
        # On the writer, before the commit: the tasks are still CLAIMED in the store.
        stored = {t.id: t.state for t in env.tasks.search("workers", 10)}
        assert {stored[t.id] for t in tasks} == {TaskState.CLAIMED}
        told.append([t.id for t in tasks])

    leases = LeaseExpiry(env.committer, on_expired=on_expired, on_lost=lost.extend)
    sweeper = Sweeper(env.promises, interval=60, batch_size=2, leases=leases)
    assert sweeper.run_once().leases_expired == 2
    assert sweeper.run_once().leases_expired == 1
    assert sweeper.run_once().leases_expired == 0
    assert sorted(t.id for t in lost) == sorted(t.id for t in held)
    assert [len(ids) for ids in told] == [2, 1]
    assert all(t.state is TaskState.PENDING for t in lost)
    # Without lease expiry, a sweeper leaves leases alone.
    assert Sweeper(env.promises, interval=60, batch_size=2).run_once().leases_expired == 0
