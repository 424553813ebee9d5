"""Routing by workflow version in the store, on SQLite and PostgreSQL: the claim's SQL
takes exactly what `Route.accepts` allows, a claim records the version on the root
and the task, resumes carry it, and `search_tasks` lists a group's open tasks."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, event

from troth_server.domain import routing
from troth_server.domain import task as tasks
from troth_server.domain.promise import EMPTY, CreateRequest, Payload, PromiseState, SettleRequest
from troth_server.domain.routing import Deployments, Route
from troth_server.domain.steps import Fence
from troth_server.domain.task import Task, TaskKind, TaskState
from troth_server.service import PromiseService
from troth_server.task_service import TaskService
from troth_server.watch import WatchHub
from troth_server.writes.group_commit import GroupCommitter

if TYPE_CHECKING:
    from troth_server.store import Store

HOUR = 3_600_000
LEASE = 10_000
NAMES = ["publish", "billing"]
VERSIONS = ["v1", "v2"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_767_225_600_000

    def __call__(self) -> int:
        self.now += 1  # every task a distinct create_time: "oldest first" is checkable
        return self.now


@dataclass
class Env:
    store: Store
    promises: PromiseService
    tasks: TaskService

    def start(self, root: str, workflow: str = "publish", group: str = "g") -> None:
        tags = {"troth:invoke": group, "troth:func": workflow}
        asyncio.run(
            self.promises.create_async(CreateRequest(root, Payload({}, b"[]"), tags, ttl=HOUR))
        )

    def claim(self, worker: str, route: Route, limit: int = 10) -> list[Task]:
        return [c.task for c in self.tasks.claim("g", worker, limit, LEASE, route)]

    def suspend(self, task: Task, worker: str) -> str:
        step = f"{task.root_promise_id}.0"
        asyncio.run(
            self.promises.create_async(
                CreateRequest(step, EMPTY, {}, ttl=HOUR), fence=fence(task, worker)
            )
        )
        assert asyncio.run(self.tasks.suspend_async(task.id, task.counter, worker, [step]))[1] == []
        return step

    def resolve(self, promise_id: str) -> None:
        asyncio.run(
            self.promises.settle_async(SettleRequest(promise_id, PromiseState.RESOLVED, EMPTY))
        )


def fence(task: Task, worker: str) -> Fence:
    """What the worker holding `task` sends with its step writes."""
    return Fence(task.id, task.counter, worker)


@pytest.fixture
def env(store: Store) -> Iterator[Env]:
    clock = Clock()
    holder: list[PromiseService] = []
    committer = GroupCommitter(store, clock, on_commit=lambda c: holder[0].on_commit(c))
    promises = PromiseService(store, committer, WatchHub(), clock)
    holder.append(promises)
    committer.start()
    yield Env(store, promises, TaskService(store, committer, clock))
    committer.stop()


def fleet(*streams: list[tuple[str, str]]) -> list[Route]:
    """Routes of a group's streams connected in this order (the last is the newest)."""
    deployments = Deployments()
    registrations = [routing.registration(s) for s in streams]
    for registration in registrations:
        deployments.register("g", registration)
    return routing.routes("g", registrations, deployments)


# -- the claim's SQL is Route.accepts ------------------------------------------------------

KINDS = list(itertools.product([*NAMES, "other", None], [*VERSIONS, None]))


@pytest.fixture
def every_kind(store: Store) -> dict[str, Task]:
    """One PENDING task of each (workflow, version), each of its own root."""
    made = {
        f"t{n}": tasks.create(
            f"t{n}", f"root-{n}", "g", TaskKind.RESUME, workflow=workflow, workflow_version=version
        )
        for n, (workflow, version) in enumerate(KINDS)
    }
    store.write(lambda tx: tx.insert_tasks(list(made.values()), 1))
    return made


stream_st = st.lists(
    st.tuples(st.sampled_from(NAMES), st.sampled_from(VERSIONS)), min_size=0, max_size=3
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(streams=st.lists(stream_st, min_size=1, max_size=3))
def test_the_claim_query_takes_exactly_what_the_route_accepts(
    store: Store, every_kind: dict[str, Task], streams: list[list[tuple[str, str]]]
) -> None:
    for route in fleet(*streams):
        found = store.write(lambda tx, r=route: tx.pending_tasks("g", "w", 100, r))
        expected = {
            t.id for t in every_kind.values() if route.accepts(t.workflow, t.workflow_version)
        }
        assert {t.id for t in found} == expected, route


# -- through the task service ------------------------------------------------------------


def test_the_first_claim_records_its_workers_version_on_the_root_and_the_task(env: Env) -> None:
    (v1,) = fleet([("publish", "v1")])
    env.start("wf-1")
    (invoke,) = env.store.search_tasks("g", 10)
    assert (invoke.kind, invoke.workflow, invoke.workflow_version) == (
        TaskKind.INVOKE, "publish", None,
    )  # fmt: skip
    (claimed,) = env.tasks.claim("g", "w1", 10, LEASE, v1)
    assert claimed.task.workflow_version == "v1"
    assert claimed.root is not None and claimed.root.workflow_version == "v1"
    root = env.store.get_promise("wf-1")
    assert root is not None and root.workflow_version == "v1"
    (stored,) = env.store.search_tasks("g", 10)
    assert (stored.state, stored.workflow_version) == (TaskState.CLAIMED, "v1")


def test_a_parked_workflow_resumes_only_on_its_version_and_waits_without_blocking(
    env: Env,
) -> None:
    v1_alone, *_ = fleet([("publish", "v1")])
    env.start("old")
    (invoke,) = env.claim("w-v1", v1_alone)
    step = env.suspend(invoke, "w-v1")
    # v2 is deployed; the old worker is gone; the human approves the old workflow.
    old_route, new_route = fleet([("publish", "v1")], [("publish", "v2")])
    env.resolve(step)
    env.start("new")  # queued after the old workflow's resume
    (resume,) = [t for t in env.store.search_tasks("g", 10) if t.root_promise_id == "old"]
    assert (resume.kind, resume.workflow, resume.workflow_version) == (
        TaskKind.RESUME, "publish", "v1",
    )  # fmt: skip
    (taken,) = env.claim("w-v2", new_route)  # skips the resume it may not run
    assert (taken.root_promise_id, taken.workflow_version) == ("new", "v2")
    assert env.claim("w-v2", new_route) == []
    # A worker compatible with v1 may take it; an old one surely does.
    (back,) = env.claim("w-v1", old_route)
    assert (back.id, back.workflow_version) == (resume.id, "v1")
    root = env.store.get_promise("old")
    assert root is not None and root.workflow_version == "v1"  # never re-recorded


def test_a_resume_after_a_completion_that_asked_for_it_keeps_the_version(env: Env) -> None:
    (v1,) = fleet([("publish", "v1")])
    env.start("wf")
    (invoke,) = env.claim("w1", v1)
    step = f"{invoke.root_promise_id}.0"
    asyncio.run(
        env.promises.create_async(
            CreateRequest(step, EMPTY, {}, ttl=HOUR), fence=fence(invoke, "w1")
        )
    )
    asyncio.run(env.tasks.register_callbacks_async(invoke.id, invoke.counter, "w1", [step]))
    env.resolve(step)  # while the task is still held: it asks for the next resume
    asyncio.run(env.tasks.complete_async(invoke.id, invoke.counter, "w1", None))
    (resume,) = env.store.search_tasks("g", 10)
    assert (resume.kind, resume.workflow_version) == (TaskKind.RESUME, "v1")


def test_a_worker_listing_nothing_takes_any_task_and_records_no_version(env: Env) -> None:
    env.start("wf")
    (task,) = env.claim("w-old-sdk", routing.ANY)
    assert task.workflow_version is None
    root = env.store.get_promise("wf")
    assert root is not None and root.workflow_version is None


def test_search_tasks_lists_open_tasks_oldest_first(env: Env) -> None:
    (v1,) = fleet([("publish", "v1")])
    for n in range(4):
        env.start(f"wf-{n}")
    env.start("elsewhere", group="other")
    first, _second = env.claim("w1", v1, limit=2)
    asyncio.run(env.tasks.complete_async(first.id, first.counter, "w1", None))
    found = env.store.search_tasks("g", 10)
    assert [t.root_promise_id for t in found] == ["wf-1", "wf-2", "wf-3"]
    assert [t.state for t in found] == [TaskState.CLAIMED, TaskState.PENDING, TaskState.PENDING]
    times = [t.create_time or 0 for t in found]
    assert all(times) and times == sorted(times)
    assert [t.root_promise_id for t in env.store.search_tasks("g", 2)] == ["wf-1", "wf-2"]
    assert env.store.search_tasks("nobody", 10) == []


def test_search_tasks_sees_a_task_that_changes_state_between_its_two_selects(
    store: Store,
) -> None:
    """SearchTasks reads PENDING tasks, then CLAIMED ones: both in one snapshot, so a
    lease that expires in between (CLAIMED -> PENDING) leaves the task in one of them.
    On PostgreSQL under READ COMMITTED it was in neither (a clock-jump test caught it)."""
    claimed = dataclasses.replace(
        tasks.create("t-moving", "root-moving", "g", TaskKind.INVOKE),
        state=TaskState.CLAIMED,
        counter=1,
        worker_id="w",
        lease_expire_time=2 * HOUR,
    )
    store.write(lambda tx: tx.insert_tasks([claimed], 1))
    expired = dataclasses.replace(
        claimed, state=TaskState.PENDING, worker_id=None, lease_expire_time=None
    )
    moved: list[bool] = []

    def between(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        # Just before the CLAIMED select: the lease runs out, committed elsewhere.
        if not moved and "'CLAIMED'" in statement and "tasks" in statement:
            moved.append(True)
            store.write(lambda tx: tx.update_tasks([expired], 2))

    event.listen(Engine, "before_cursor_execute", between)
    try:
        found = store.search_tasks("g", 10)
    finally:
        event.remove(Engine, "before_cursor_execute", between)
    assert moved, "the CLAIMED select never ran"
    assert [(t.id, t.state) for t in found] == [("t-moving", TaskState.CLAIMED)]
    (now,) = store.search_tasks("g", 10)
    assert now.state is TaskState.PENDING


def test_a_workflow_name_too_long_to_route_by_stays_unnamed_on_its_resumes(env: Env) -> None:
    # The root was read unlocked for its resume (the settle's batch did not load it):
    # the same rule as for its INVOKE applies, and the RESUME row fits its column.
    long_name = "w" * (routing.MAX_WORKFLOW_NAME + 1)
    env.start("long", workflow=long_name)
    (invoke,) = env.claim("w-old-sdk", routing.ANY)
    assert invoke.workflow is None
    env.resolve(env.suspend(invoke, "w-old-sdk"))
    (resume,) = env.store.search_tasks("g", 10)
    assert (resume.kind, resume.workflow) == (TaskKind.RESUME, None)
