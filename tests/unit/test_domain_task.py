"""The task state machine (domain/task.py) against a simple model, with Hypothesis."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from troth_server.domain import task as tasks
from troth_server.domain.access import Principal, Role
from troth_server.domain.task import StaleCounter, Task, TaskKind, TaskNotClaimable, TaskState

LEASE = 1_000
ROOTS = ["r1", "r2", "r3"]
WORKERS = ["w1", "w2"]
GROUPS = ["g", "h"]


def _group(root: str) -> str:
    """Roots spread over two groups, so one stream breaking has others to leave alone."""
    return GROUPS[ROOTS.index(root) % len(GROUPS)]


@dataclass
class Expected:
    state: TaskState
    counter: int
    worker: str | None
    lease_until: int | None
    resume_pending: bool = False
    failures: int = 0
    not_before: int | None = None


class TaskMachine(RuleBasedStateMachine):
    """Applies the pure functions as the service will, and checks them against a model."""

    @initialize()
    def setup(self) -> None:
        self.now = 0
        self.tasks: dict[str, Task] = {}
        self.model: dict[str, Expected] = {}
        self.next_id = 0

    def _new_id(self) -> str:
        self.next_id += 1
        return f"t{self.next_id}"

    def _active(self, root: str) -> Task | None:
        found = [
            t
            for t in self.tasks.values()
            if t.root_promise_id == root and t.state is not TaskState.COMPLETED
        ]
        assert len(found) <= 1
        return found[0] if found else None

    def _put(self, task: Task, expected: Expected) -> None:
        self.tasks[task.id] = task
        self.model[task.id] = expected

    @rule(root=st.sampled_from(ROOTS))
    def settle_awaited_promise(self, root: str) -> None:
        active = self._active(root)
        updated, created = tasks.resume(active, self._new_id(), root, _group(root), preferred="w1")
        if active is None:
            assert updated is None and created is not None
            assert created.kind is TaskKind.RESUME and created.preferred_worker_id == "w1"
            self._put(created, Expected(TaskState.PENDING, 0, None, None))
        else:
            assert created is None and updated is not None
            expected = self.model[active.id]
            if active.state is TaskState.CLAIMED:
                expected.resume_pending = True
            self.tasks[active.id] = updated

    @rule(root=st.sampled_from(ROOTS))
    def start_root(self, root: str) -> None:
        if self._active(root) is None and not any(
            t.root_promise_id == root for t in self.tasks.values()
        ):
            task = tasks.create(self._new_id(), root, _group(root), TaskKind.INVOKE)
            self._put(task, Expected(TaskState.PENDING, 0, None, None))

    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def claim(self, data: st.DataObject, worker: str) -> None:
        if not self.tasks:
            return
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        task, expected = self.tasks[task_id], self.model[task_id]
        backing_off = expected.not_before is not None and self.now < expected.not_before
        if expected.state is not TaskState.PENDING or backing_off:
            with pytest.raises(TaskNotClaimable):
                tasks.claim(task, worker, self.now, LEASE)
            return
        claimed = tasks.claim(task, worker, self.now, LEASE)
        self.tasks[task_id] = claimed
        expected.state, expected.counter = TaskState.CLAIMED, expected.counter + 1
        expected.worker, expected.lease_until = worker, self.now + LEASE
        expected.not_before = None
        assert claimed.next_attempt_time is None

    @rule(
        data=st.data(),
        worker=st.sampled_from(WORKERS),
        counter_delta=st.sampled_from([0, 0, 0, -1, 1]),
        action=st.sampled_from(["heartbeat", "complete", "release", "fail"]),
        draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    )
    def holder_call(
        self, data: st.DataObject, worker: str, counter_delta: int, action: str, draw: float
    ) -> None:
        if not self.tasks:
            return
        task_id = data.draw(st.sampled_from(sorted(self.tasks)))
        task, expected = self.tasks[task_id], self.model[task_id]
        counter = expected.counter + counter_delta
        legit = (
            expected.state is TaskState.CLAIMED and expected.worker == worker and counter_delta == 0
        )
        repeat = (
            action == "complete"
            and expected.state is TaskState.COMPLETED
            and expected.worker == worker
            and counter_delta == 0
        )
        if repeat:
            # A retried completion (its first reply was lost): answered, nothing changes.
            assert tasks.complete(task, worker, counter, self.now) == (task, False)
            return
        if not legit:
            with pytest.raises(StaleCounter):
                if action == "heartbeat":
                    tasks.heartbeat(task, worker, counter, self.now, LEASE)
                elif action == "complete":
                    tasks.complete(task, worker, counter, self.now)
                elif action == "fail":
                    tasks.fail(task, worker, counter, self.now, "E: e", "tb", draw)
                else:
                    tasks.release(task, worker, counter)
            return
        if action == "heartbeat":
            self.tasks[task_id] = tasks.heartbeat(task, worker, counter, self.now, LEASE)
            expected.lease_until = self.now + LEASE
        elif action == "complete":
            done, again = tasks.complete(task, worker, counter, self.now)
            self.tasks[task_id] = done
            assert again == expected.resume_pending
            # The worker stays recorded: it suspended the root and is preferred for its resume.
            expected.state, expected.lease_until = TaskState.COMPLETED, None
            if again:
                root = task.root_promise_id
                new = tasks.create(self._new_id(), root, _group(root), TaskKind.RESUME)
                self._put(new, Expected(TaskState.PENDING, 0, None, None))
        elif action == "fail":
            failed = tasks.fail(task, worker, counter, self.now, "E: e", "tb", draw)
            self.tasks[task_id] = failed
            expected.state, expected.worker, expected.lease_until = TaskState.PENDING, None, None
            expected.failures += 1
            base = min(tasks.RETRY_MAX_MS, tasks.RETRY_FIRST_MS * 2 ** (expected.failures - 1))
            assert failed.next_attempt_time is not None
            assert self.now + base // 2 <= failed.next_attempt_time <= self.now + base
            expected.not_before = failed.next_attempt_time
        else:
            self.tasks[task_id] = tasks.release(task, worker, counter)
            expected.state, expected.worker, expected.lease_until = TaskState.PENDING, None, None

    @rule(step=st.sampled_from([100, 500, 1_000, 2_000]))
    def advance_time(self, step: int) -> None:
        self.now += step
        for task_id, task in list(self.tasks.items()):
            expected = self.model[task_id]
            self.tasks[task_id] = tasks.expire_lease(task, self.now)
            if (
                expected.state is TaskState.CLAIMED
                and expected.lease_until is not None
                and self.now >= expected.lease_until
            ):
                expected.state, expected.worker, expected.lease_until = (
                    TaskState.PENDING,
                    None,
                    None,
                )

    @rule(worker=st.sampled_from(WORKERS), group=st.sampled_from(GROUPS))
    def worker_stream_breaks(self, worker: str, group: str) -> None:
        # Its stream of one group: the tasks it holds in the other stay with it.
        for task_id, task in list(self.tasks.items()):
            expected = self.model[task_id]
            self.tasks[task_id] = tasks.worker_gone(task, worker, group)
            if (
                expected.state is TaskState.CLAIMED
                and expected.worker == worker
                and _group(task.root_promise_id) == group
            ):
                expected.state, expected.worker, expected.lease_until = (
                    TaskState.PENDING,
                    None,
                    None,
                )

    @invariant()
    def matches_the_model(self) -> None:
        for task_id, task in self.tasks.items():
            expected = self.model[task_id]
            assert task.state is expected.state, task_id
            assert task.counter == expected.counter, task_id
            assert task.worker_id == expected.worker, task_id
            assert task.lease_expire_time == expected.lease_until, task_id
            # Failures are counted across claims, and only a fail counts one.
            assert task.failed_attempts == expected.failures, task_id
            if task.state is TaskState.CLAIMED:
                assert task.resume_pending == expected.resume_pending

    @invariant()
    def one_active_task_per_root(self) -> None:
        for root in ROOTS:
            self._active(root)


TestTaskMachine = TaskMachine.TestCase
TestTaskMachine.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)


def test_stale_counter_message_says_what_happened() -> None:
    task = tasks.claim(tasks.create("t1", "root", "g", TaskKind.INVOKE), "w1", 0, LEASE)
    moved = tasks.claim(tasks.expire_lease(task, LEASE), "w2", LEASE, LEASE)
    with pytest.raises(StaleCounter) as caught:
        tasks.complete(moved, "w1", task.counter, 0)
    message = str(caught.value)
    assert "counter 2" in message and "w2" in message and "carried counter 1" in message
    assert caught.value.reason == "STALE_COUNTER"


# --- the principal a task is leased to (issue 11) ----------------------------------------

_A = Principal("worker-a", frozenset({Role.WORKER}), frozenset({"g"}))
_B = Principal("worker-b", frozenset({Role.WORKER}), frozenset({"g"}))
_ADMIN = Principal("root", frozenset({Role.ADMIN}))
_A_ELSEWHERE = Principal("worker-a", frozenset({Role.WORKER}), frozenset({"other"}))


def _leased() -> Task:
    return tasks.claim(tasks.create("t1", "r1", "g", TaskKind.INVOKE), "w1", 0, LEASE, "worker-a")


def test_a_claim_records_the_principal_and_only_it_may_call_about_the_task() -> None:
    task = _leased()
    assert task.worker_principal == "worker-a"
    tasks.check_holder(task, "w1", task.counter, _A)
    for other in (_B, _ADMIN):
        # The principal is compared before the counter: the refusal says nothing of it.
        with pytest.raises(tasks.NotTheTasksWorker, match="leased to another principal"):
            tasks.check_holder(task, "w1", task.counter + 7, other)
        with pytest.raises(tasks.NotTheTasksWorker):
            tasks.complete(task, "w1", task.counter, 5, other)
        with pytest.raises(tasks.NotTheTasksWorker):
            tasks.heartbeat(task, "w1", task.counter, 5, LEASE, other)
    with pytest.raises(tasks.GroupNotAllowed):
        tasks.complete(task, "w1", task.counter, 5, _A_ELSEWHERE)
    # With authentication off (no principal) nothing is compared, as before.
    done, _ = tasks.complete(task, "w1", task.counter, 5, None)
    assert done.state is TaskState.COMPLETED
    with pytest.raises(tasks.NotTheTasksWorker):
        tasks.complete(done, "w1", task.counter, 6, _B)  # not even as a repeat


def test_an_admin_may_release_another_principals_task_and_nobody_else() -> None:
    task = _leased()
    with pytest.raises(tasks.NotTheTasksWorker):
        tasks.release(task, "w1", task.counter, _B)
    with pytest.raises(StaleCounter):
        tasks.release(task, "any", task.counter + 1, _ADMIN)
    back = tasks.release(task, "any", task.counter, _ADMIN)
    assert back.state is TaskState.PENDING and back.worker_id is None


def test_a_broken_stream_gives_back_only_its_own_principals_tasks() -> None:
    task = _leased()
    assert tasks.worker_gone(task, "w1", "g", "worker-b") is task
    assert tasks.worker_gone(task, "w1", "g", "worker-a").state is TaskState.PENDING
    assert tasks.worker_gone(task, "w1", "g", None).state is TaskState.PENDING


def test_a_broken_stream_gives_back_only_its_own_groups_tasks() -> None:
    task = _leased()
    assert tasks.worker_gone(task, "w1", "another-group") is task
    assert tasks.worker_gone(task, "w2", "g") is task
    assert tasks.worker_gone(task, "w1", "g").state is TaskState.PENDING
