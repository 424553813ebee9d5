"""A `ctx.run` step's function under its RetryPolicy: attempts, backoff, non-retryable errors.

The default policy has no maximum (issue 27 item 5): a few attempts in the task, then
`Paused` (the worker fails the task; nothing is recorded); an explicit maximum and
non-retryable errors reject the step, as the user chose.
"""

from __future__ import annotations

import pytest

from troth import RetryPolicy
from troth._worker_steps import (
    ATTEMPTS_PER_TASK,
    Exhausted,
    Interrupted,
    Paused,
    Succeeded,
    run_with_retry,
)


class FakeWait:
    """Records the waits asked for; answers False (cut short) from `stop_after` on."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.waits: list[float] = []
        self.stop_after = stop_after

    def __call__(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.stop_after is None or len(self.waits) < self.stop_after


class Flaky:
    """Fails `failures` times with `error`, then returns "ok"."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("flaky")
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: object) -> str:
        self.calls.append(args)
        if len(self.calls) <= self.failures:
            raise self.error
        return "ok"


def test_success_first_time_waits_for_nothing() -> None:
    wait, fn = FakeWait(), Flaky(0)
    result = run_with_retry(fn, (1, "a"), RetryPolicy(), wait=wait)
    assert result == Succeeded("ok", 1)
    assert fn.calls == [(1, "a")]
    assert wait.waits == []


def test_retries_with_exponential_backoff_until_it_succeeds() -> None:
    wait, fn = FakeWait(), Flaky(3)
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.5, multiplier=3, max_backoff=100)
    assert run_with_retry(fn, (), policy, wait=wait) == Succeeded("ok", 4)
    assert wait.waits == [0.5, 1.5, 4.5]


def test_backoff_is_capped() -> None:
    wait, fn = FakeWait(), Flaky(4)
    policy = RetryPolicy(max_attempts=10, initial_backoff=1, multiplier=10, max_backoff=7)
    run_with_retry(fn, (), policy, wait=wait)
    assert wait.waits == [1, 7, 7, 7]


def test_exhausted_after_max_attempts_carries_the_last_error() -> None:
    wait = FakeWait()
    errors = iter([ValueError("one"), ValueError("two"), ValueError("three")])

    def fn() -> None:
        raise next(errors)

    result = run_with_retry(fn, (), RetryPolicy(max_attempts=3, initial_backoff=0), wait=wait)
    assert isinstance(result, Exhausted)
    assert result.attempts == 3
    assert str(result.error) == "three"
    assert len(wait.waits) == 2


def test_non_retryable_error_fails_at_once() -> None:
    wait, fn = FakeWait(), Flaky(5, KeyError("nope"))
    policy = RetryPolicy(max_attempts=5, non_retryable=(LookupError,))
    result = run_with_retry(fn, (), policy, wait=wait)
    assert isinstance(result, Exhausted)
    assert result.attempts == 1
    assert wait.waits == []
    assert len(fn.calls) == 1


def test_max_attempts_one_means_no_retry() -> None:
    wait, fn = FakeWait(), Flaky(1)
    result = run_with_retry(fn, (), RetryPolicy(max_attempts=1), wait=wait)
    assert isinstance(result, Exhausted)
    assert wait.waits == []


def test_a_wait_cut_short_stops_retrying() -> None:
    wait, fn = FakeWait(stop_after=1), Flaky(5)
    result = run_with_retry(fn, (), RetryPolicy(max_attempts=5), wait=wait)
    assert result == Interrupted(1)
    assert len(fn.calls) == 1


def test_base_exceptions_are_not_the_steps_failure() -> None:
    def fn() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_with_retry(fn, (), RetryPolicy(), wait=FakeWait())


def test_the_default_policy_has_no_maximum_and_pauses_the_task_after_a_few_attempts() -> None:
    assert RetryPolicy().max_attempts is None
    wait = FakeWait()
    errors = iter([NameError("one"), NameError("two"), NameError("three"), NameError("four")])

    def fn() -> None:
        raise next(errors)

    result = run_with_retry(fn, (), RetryPolicy(), wait=wait)
    assert isinstance(result, Paused)  # not Exhausted: the step is not rejected
    assert (result.attempts, str(result.error)) == (ATTEMPTS_PER_TASK, "three")
    assert wait.waits == [1.0, 2.0]


def test_the_default_policy_still_succeeds_on_a_retry_within_the_task() -> None:
    wait, fn = FakeWait(), Flaky(2)
    assert run_with_retry(fn, (), RetryPolicy(), wait=wait) == Succeeded("ok", 3)


def test_with_no_maximum_a_non_retryable_error_still_fails_the_step_at_once() -> None:
    wait, fn = FakeWait(), Flaky(5, KeyError("nope"))
    result = run_with_retry(fn, (), RetryPolicy(non_retryable=(KeyError,)), wait=wait)
    assert isinstance(result, Exhausted) and result.attempts == 1


def test_an_explicit_maximum_above_the_attempts_per_task_runs_them_all_in_the_task() -> None:
    wait, fn = FakeWait(), Flaky(10)
    policy = RetryPolicy(max_attempts=5, initial_backoff=0)
    result = run_with_retry(fn, (), policy, wait=wait)
    assert isinstance(result, Exhausted) and result.attempts == 5


def test_backoff_with_no_maximum_stays_capped_however_many_attempts() -> None:
    policy = RetryPolicy(initial_backoff=1, multiplier=10, max_backoff=30)
    assert policy.backoff(10_000) == 30
    assert RetryPolicy(initial_backoff=0).backoff(10_000) == 0
    with pytest.raises(ValueError, match="or None for no maximum"):
        RetryPolicy(max_attempts=0)
