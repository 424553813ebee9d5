"""Claim on commit (issue 13): a task created while a connected worker of its group has
room is leased in the transaction that creates it, and delivered with no claim of its
own; tasks already waiting are not overtaken; a slot held for a transaction that did
not commit is given back. In-process, on a real SQLite file, with the real dispatcher."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from test_task_service import HOUR, LEASE, Clock

from troth_server.dispatch import Delivery, Dispatcher, PollStream, wall_ms
from troth_server.domain import promise as domain
from troth_server.domain.promise import (
    EMPTY,
    CreateRequest,
    Payload,
    Promise,
    PromiseState,
    SettleRequest,
)
from troth_server.domain.steps import Fence
from troth_server.domain.task import Task, TaskKind, TaskState
from troth_server.service import PromiseService
from troth_server.store import Store, StoreError, WriteTx, open_store
from troth_server.task_service import TaskService
from troth_server.watch import WatchHub
from troth_server.writes.batch import Batch, Keys, Leased, Lessee, Lessor
from troth_server.writes.group_commit import GroupCommitter
from troth_server.writes.ops.create import CreateOp

if TYPE_CHECKING:
    from troth_server.writes.ops.settle import Settled


@dataclass
class Env:
    clock: Clock
    store: Store
    committer: GroupCommitter
    promises: PromiseService
    tasks: TaskService
    dispatcher: Dispatcher
    loop: asyncio.AbstractEventLoop

    def stream(self, worker_id: str, capacity: int = 4) -> PollStream:
        stream = PollStream("workers", worker_id, capacity, LEASE, self.loop)
        self.dispatcher.connect(stream)
        self.quiet()
        return stream

    def start(self, root: str) -> None:
        """A workflow's start, as the op its RPC submits (from this thread)."""
        tags = {"troth:invoke": "workers", "troth:func": "publish"}
        self.committer.submit(
            CreateOp(CreateRequest(root, Payload({}, b"[]"), tags, ttl=HOUR), None)
        )

    def next(self, stream: PollStream, timeout: float = 5.0) -> Delivery:
        delivery = asyncio.run_coroutine_threadsafe(stream.next_async(), self.loop).result(timeout)
        assert delivery is not None
        return delivery

    def nothing_for(self, stream: PollStream, seconds: float = 0.3) -> None:
        future = asyncio.run_coroutine_threadsafe(stream.next_async(), self.loop)
        with pytest.raises(TimeoutError):
            future.result(seconds)
        future.cancel()

    def task_of(self, root: str) -> Task:
        (task,) = self.store.search_tasks("workers", 10, root)
        return task

    def quiet(self) -> None:
        """Wait until the dispatcher's wake-ups of a moment ago have run their claims."""
        commits = -1
        while commits != self.committer.stats.commits:
            commits = self.committer.stats.commits
            time.sleep(0.15)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    clock = Clock()
    store = open_store(f"sqlite:///{tmp_path}/t.db")
    holder: list[Dispatcher] = []
    committer = GroupCommitter(
        store,
        clock,
        on_commit=lambda c: promises.on_commit(c),
        on_pending_tasks=lambda groups: holder[0].wake(groups),
    )
    promises = PromiseService(store, committer, WatchHub(), clock)
    tasks = TaskService(store, committer, clock)
    dispatcher = Dispatcher(tasks, store)
    holder.append(dispatcher)
    committer.lease_on_commit(dispatcher)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    committer.start()
    dispatcher.start()
    yield Env(clock, store, committer, promises, tasks, dispatcher, loop)
    dispatcher.stop()
    committer.stop()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()
    store.close()


def test_a_new_task_is_leased_by_the_transaction_that_creates_it(env: Env) -> None:
    stream = env.stream("w1")
    before = env.committer.stats.commits
    env.start("wf-1")
    # Already leased when the start returns: no claim has run in between.
    task = env.task_of("wf-1")
    assert (task.state, task.worker_id, task.counter) == (TaskState.CLAIMED, "w1", 1)
    assert task.lease_expire_time == env.clock.now + LEASE
    delivery = env.next(stream)
    assert delivery.task.id == task.id and delivery.task.counter == 1
    assert delivery.root is not None and delivery.root.id == "wf-1"
    assert delivery.history == []
    env.quiet()
    assert env.committer.stats.commits == before + 1  # the start's commit, nothing more
    assert stream.held == {task.id} and stream.reserved == set()


def test_a_resume_is_leased_to_the_worker_that_suspended_with_what_settled(env: Env) -> None:
    first = env.stream("w1")
    second = env.stream("w2", capacity=8)  # more room: it would win on room alone
    env.start("wf-2")
    invoke = env.next(second).task
    assert invoke.worker_id == "w2"
    fence = Fence(invoke.id, invoke.counter, "w2")
    asyncio.run(
        env.promises.create_async(CreateRequest("wf-2.0", EMPTY, {}, ttl=HOUR), fence=fence)
    )
    asyncio.run(env.tasks.suspend_async(invoke.id, invoke.counter, "w2", ["wf-2.0"]))
    env.dispatcher.done("w2", invoke.id)

    settled = asyncio.run(
        env.promises.settle_async(SettleRequest("wf-2.0", PromiseState.RESOLVED, Payload({}, b"1")))
    )
    resume = env.next(second)
    assert (resume.task.kind, resume.task.state) == (TaskKind.RESUME, TaskState.CLAIMED)
    # The settle's own write knew the task it resumed: what its reply says of the
    # workflow's wait needs no read (`Settled.workflow_task`).
    assert settled.workflow_known and settled.workflow_task is not None
    assert settled.workflow_task.id == resume.task.id
    assert [(p.id, p.state) for p in resume.history] == [("wf-2.0", PromiseState.RESOLVED)]
    env.nothing_for(first)


def test_a_settle_knows_the_task_of_the_workflow_it_does_not_resume(env: Env) -> None:
    """A human's settle reads its workflow's active task in its own write, whether the
    workflow waits on the promise or is running (a worker holds its task), and says
    so for a promise of no workflow: its reply needs no read of its own."""
    stream = env.stream("w1")
    env.start("wf-3")
    invoke = env.next(stream).task
    fence = Fence(invoke.id, invoke.counter, "w1")
    for step in ("wf-3.0", "wf-3.1"):
        asyncio.run(
            env.promises.create_async(CreateRequest(step, EMPTY, {}, ttl=HOUR), fence=fence)
        )
    asyncio.run(env.promises.create_async(CreateRequest("plain", EMPTY, {}, ttl=HOUR)))

    def settle(promise_id: str) -> Settled:
        request = SettleRequest(promise_id, PromiseState.RESOLVED, Payload({}, b"1"))
        return asyncio.run(env.promises.settle_async(request))

    running = settle("wf-3.0")  # the worker holds the task: no callback fires
    assert running.workflow_known and running.workflow_task is not None
    assert (running.workflow_task.id, running.workflow_task.state) == (
        invoke.id, TaskState.CLAIMED,
    )  # fmt: skip
    plain = settle("plain")
    assert plain.workflow_known is False and plain.workflow_task is None
    asyncio.run(env.tasks.complete_async(invoke.id, invoke.counter, "w1", None))
    env.dispatcher.done("w1", invoke.id)
    ended = settle("wf-3.1")  # nothing waits on it, no task is left
    assert ended.workflow_known and ended.workflow_task is None


def test_tasks_that_wait_are_delivered_before_new_ones(env: Env) -> None:
    stream = env.stream("w1", capacity=1)
    env.start("wf-a")
    a = env.next(stream).task
    env.start("wf-b")  # no room: it waits
    assert env.task_of("wf-b").state is TaskState.PENDING
    asyncio.run(env.tasks.complete_async(a.id, a.counter, "w1", None))
    env.dispatcher.done("w1", a.id)
    env.start("wf-c")  # must not take the slot that wf-b waits for
    assert env.next(stream).task.root_promise_id == "wf-b"
    assert env.task_of("wf-c").state is TaskState.PENDING


def test_a_backlog_without_waiting_tasks_does_not_outlive_the_pass_that_drains_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wake-up (the sweeper's, every tick) marks a group's tasks as possibly waiting,
    and tasks created meanwhile are left to the dispatcher. Once its pass finds
    nothing more to take, new tasks must be leased on commit again, even though the
    tasks left behind made the group wanted anew: else, under steady load, the
    backlog fed itself and most tasks took a claim transaction of their own."""
    env.stream("w1", capacity=10_000)
    claimed: list[int] = []
    claim = env.tasks.claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = claim(*args, **kwargs)
        claimed.append(len(found))
        return found

    monkeypatch.setattr(env.tasks, "claim", counted)
    starts = 400
    ticking = threading.Event()

    def tick() -> None:
        while not ticking.wait(0.05):
            env.dispatcher.wake_all()

    def starter(first: int) -> None:
        for n in range(first, starts, 8):
            env.start(f"wf-steady-{n}")

    threads = [threading.Thread(target=tick)]
    threads += [threading.Thread(target=starter, args=(first,)) for first in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join()
    ticking.set()
    threads[0].join()
    env.quiet()
    # Eight callers at once, as a loaded server has them. A tick leaves the starts
    # of the moment to the dispatcher's next pass; the rest are leased by their
    # own commit.
    assert sum(claimed) <= starts // 10, f"{sum(claimed)} of {starts} tasks were claimed"


def test_no_stream_with_room_leaves_the_task_to_the_dispatcher(env: Env) -> None:
    env.start("wf-d")
    assert env.task_of("wf-d").state is TaskState.PENDING
    stream = env.stream("w1")  # connecting claims what waits
    assert env.next(stream).task.root_promise_id == "wf-d"


def test_a_first_run_is_delivered_without_reading_its_history(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An INVOKE task in its first lease has no steps (a step is created only under its
    task's fence): delivered with the root its claim read, with no read of the history,
    whether leased on commit or claimed later. A later lease of it reads the history."""
    trees: list[str] = []
    real_tree = env.store.promise_tree

    def counted(root_id: str) -> tuple[Promise, list[Promise]]:
        trees.append(root_id)
        return real_tree(root_id)

    monkeypatch.setattr(env.store, "promise_tree", counted)
    env.start("wf-first")  # no stream yet: claimed when one connects
    stream = env.stream("w1")
    first = env.next(stream)
    assert (first.task.kind, first.task.counter) == (TaskKind.INVOKE, 1)
    assert first.root is not None and first.root.id == "wf-first" and first.history == []
    assert trees == []
    # The worker ran a step, then gave the task back: the next lease reads the step.
    fence = Fence(first.task.id, first.task.counter, "w1")
    asyncio.run(
        env.promises.create_async(CreateRequest("wf-first.0", EMPTY, {}, ttl=HOUR), fence=fence)
    )
    env.tasks.release(first.task.id, first.task.counter, "w1")
    env.dispatcher.done("w1", first.task.id)
    again = env.next(stream)
    assert (again.task.id, again.task.counter) == (first.task.id, 2)
    assert [p.id for p in again.history] == ["wf-first.0"]
    assert trees == ["wf-first"]


class _Recording:
    """A lessor in front of the dispatcher that records the slots it is asked for."""

    def __init__(self, inner: Lessor) -> None:
        self.inner = inner
        self.reserved: list[str] = []
        self.unreserved: list[str] = []
        self.delivered: list[str] = []

    def reserve(self, task: Task, freed: object) -> Lessee | None:
        lessee = self.inner.reserve(task, ())
        if lessee is not None:
            self.reserved.append(task.root_promise_id)
        return lessee

    def leased(self, leases: list[Leased]) -> None:
        self.delivered.extend(lease.task.root_promise_id for lease in leases)
        self.inner.leased(leases)

    def unreserve(self, lessees: list[tuple[Lessee, str]]) -> None:
        self.unreserved.extend(task_id for _, task_id in lessees)
        self.inner.unreserve(lessees)


@dataclass(frozen=True)
class _DuplicateInsert:
    """An op that stages the insert of a promise that exists (it never loads it), so
    the transaction fails on the insert, after the fold leased the batch's tasks."""

    id: str

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys()

    def apply(self, batch: Batch) -> None:
        created, _ = domain.create(None, CreateRequest(self.id, EMPTY, {}, ttl=HOUR), batch.now)
        batch.add(created)


def test_a_slot_held_for_a_transaction_that_failed_is_given_back(env: Env) -> None:
    stream = env.stream("w1", capacity=1)
    asyncio.run(env.promises.create_async(CreateRequest("taken", EMPTY, {}, ttl=HOUR)))
    recording = _Recording(env.dispatcher)
    env.committer.lease_on_commit(recording)
    tags = {"troth:invoke": "workers", "troth:func": "publish"}
    start = CreateRequest("wf-e", Payload({}, b"[]"), tags, ttl=HOUR)

    async def both() -> list[object]:
        # Submitted in one loop iteration: one batch, failed by the duplicate insert,
        # then each op committed alone.
        return list(
            await asyncio.gather(
                env.promises.create_async(start),
                env.committer.submit_async(_DuplicateInsert("taken")),
                return_exceptions=True,
            )
        )

    outcomes = asyncio.run_coroutine_threadsafe(both(), env.loop).result(10)
    assert isinstance(outcomes[1], StoreError)
    assert env.next(stream).task.root_promise_id == "wf-e"
    # Slots were held for each failed attempt and given back; one lease stands.
    assert recording.delivered == ["wf-e"]
    assert len(recording.reserved) == len(recording.unreserved) + 1
    assert len(stream.held) == 1 and stream.reserved == set()


def _taken_elsewhere(env: Env, task_id: str) -> None:
    """Another replica (or server process) took the task back: this dispatcher is not told."""
    path = env.store._engines.write.url.database  # type: ignore[attr-defined]
    with sqlite3.connect(path) as db:
        db.execute("UPDATE tasks SET worker_id = 'someone-else' WHERE id = ?", (task_id,))


def test_a_stream_unheard_for_a_lease_whose_tasks_moved_on_elsewhere_is_stalled(
    env: Env,
) -> None:
    """Its leases ran out and another process took them back (a frozen worker): the
    process holding its stream stops handing it tasks, as it would had it taken them
    back itself (`stall`), until the worker calls again."""
    stream = env.stream("w1")
    env.start("wf-frozen")
    task = env.next(stream).task
    env.dispatcher._streams._last_seen["w1"] = wall_ms() - LEASE - 1  # no call for a lease
    _taken_elsewhere(env, task.id)
    env.dispatcher.reconcile()
    assert stream.held == set() and stream.stalled and stream.room == 0
    env.dispatcher.alive("w1", None)  # it calls again: it gets tasks again
    assert not stream.stalled


def test_a_stream_heard_from_whose_task_moved_on_elsewhere_keeps_taking_tasks(env: Env) -> None:
    stream = env.stream("w1")
    env.start("wf-alive")
    task = env.next(stream).task
    _taken_elsewhere(env, task.id)  # completed through another process, say
    env.dispatcher.reconcile()
    assert stream.held == set() and not stream.stalled
