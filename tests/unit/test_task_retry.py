"""A bug pauses, it does not lose (issue 12 item 5), in the pure task machine:
the retry backoff, and a failed task going back to its group with the failure kept."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troth_server.domain import task as tasks
from troth_server.domain.access import Principal, Role
from troth_server.domain.task import (
    RETRY_FIRST_MS,
    RETRY_MAX_MS,
    StaleCounter,
    TaskKind,
    TaskNotClaimable,
    TaskState,
    retry_delay_ms,
)

LEASE = 1_000


@pytest.mark.parametrize(
    ("failures", "draw", "delay"),
    [
        (0, 0.5, 0),  # never failed: no wait
        (1, 0.0, 500),  # 1 s, jittered over its upper half: [0.5 s, 1 s)
        (1, 0.999_999, 999),
        (2, 0.0, 1_000),
        (3, 0.5, 3_000),  # 4 s: [2 s, 4 s)
        (9, 0.0, 128_000),  # 256 s
        (10, 0.0, 150_000),  # 512 s is capped at 5 min
        (10, 0.999_999, 299_999),
        (64, 0.0, 150_000),  # however many failures: no overflow, still the cap
        (10_000, 0.5, 225_000),
    ],
)
def test_retry_delay_doubles_from_one_second_to_a_cap_of_five_minutes(
    failures: int, draw: float, delay: int
) -> None:
    assert retry_delay_ms(failures, draw) == delay


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0, max_value=1))
def test_retry_delay_stays_within_half_and_all_of_its_base(failures: int, draw: float) -> None:
    base = min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** min(failures - 1, 40))
    assert base // 2 <= retry_delay_ms(failures, draw) <= base
    assert retry_delay_ms(failures, draw) <= retry_delay_ms(failures + 1, draw)


def _claimed(counter_claims: int = 1) -> tasks.Task:
    task = tasks.create("t1", "root", "g", TaskKind.INVOKE, workflow="wf")
    return tasks.claim(task, "w1", 0, LEASE, "worker-a")


def test_a_failed_task_goes_back_to_its_group_after_a_backoff_with_the_failure_kept() -> None:
    task = _claimed()
    failed = tasks.fail(task, "w1", task.counter, 10_000, "NameError: x", "Traceback ...", 0.0)
    assert failed.state is TaskState.PENDING
    assert failed.counter == task.counter  # the next claim moves the counter on
    assert (failed.worker_id, failed.lease_expire_time) == (None, None)
    assert (failed.failed_attempts, failed.last_error) == (1, "NameError: x")
    assert failed.last_traceback == "Traceback ..."
    assert failed.next_attempt_time == 10_500
    # The worker that failed keeps no preference: any worker (with fixed code) may take it.
    assert failed.preferred_worker_id is None
    assert not failed.claimable(10_499) and failed.claimable(10_500)
    with pytest.raises(TaskNotClaimable, match="retry backoff until 10500"):
        tasks.claim(failed, "w2", 10_499, LEASE)
    again = tasks.claim(failed, "w2", 10_500, LEASE)
    assert again.counter == task.counter + 1 and again.failed_attempts == 1
    assert again.next_attempt_time is None and again.last_error == "NameError: x"
    twice = tasks.fail(again, "w2", again.counter, 20_000, "NameError: y", "tb", 0.0)
    assert (twice.failed_attempts, twice.last_error) == (2, "NameError: y")
    assert twice.next_attempt_time == 21_000
    # A lease lost or a stream broken is no failure: nothing is counted.
    back = tasks.worker_gone(tasks.claim(twice, "w3", 21_000, LEASE), "w3", "g")
    assert back.failed_attempts == 2 and back.claimable(21_000)


def test_a_fail_is_fenced_like_a_completion() -> None:
    task = _claimed()
    with pytest.raises(StaleCounter):
        tasks.fail(task, "w1", task.counter - 1, 5, "E", "tb", 0.5)
    with pytest.raises(StaleCounter):
        tasks.fail(task, "w2", task.counter, 5, "E", "tb", 0.5)
    other = Principal("worker-b", frozenset({Role.WORKER}), frozenset({"g"}))
    with pytest.raises(tasks.NotTheTasksWorker):
        tasks.fail(task, "w1", task.counter, 5, "E", "tb", 0.5, other)
    failed = tasks.fail(task, "w1", task.counter, 5, "E", "tb", 0.5)
    with pytest.raises(StaleCounter):  # a repeat: the task is no longer held
        tasks.fail(failed, "w1", task.counter, 6, "E", "tb", 0.5)


def test_finish_ends_a_waiting_task_once() -> None:
    failed = tasks.fail(_claimed(), "w1", 1, 5, "E", "tb", 0.5)
    done = tasks.finish(failed, 9)
    assert done.state is TaskState.COMPLETED and done.complete_time == 9
    assert done.next_attempt_time is None and done.last_error == "E"
    assert tasks.finish(done, 20) is done


def test_hurry_makes_only_a_task_in_its_backoff_claimable_at_once() -> None:
    failed = tasks.fail(_claimed(), "w1", 1, 5, "E", "tb", 0.5)
    hurried = tasks.hurry(failed)
    assert hurried.claimable(5) and hurried.failed_attempts == 1 and hurried.last_error == "E"
    claimed = _claimed()
    assert tasks.hurry(claimed) is claimed
    plain = tasks.create("t2", "root", "g", TaskKind.INVOKE)
    assert tasks.hurry(plain) is plain
