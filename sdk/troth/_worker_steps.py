"""Running one `ctx.run` step's function under its `RetryPolicy`, with no I/O of its own.

`run_with_retry` calls the function until it succeeds, raises a
non-retryable error, or runs out of attempts, waiting `policy.backoff(n)`
between attempts through an injected `wait` (so tests take no time, and a
stopping worker can cut a wait short). What it answers the worker records on
the step promise: `Succeeded` resolves it, `Exhausted` rejects it with
`error_value(error)` (the workflow sees `PromiseRejectedError` and may
compensate), `Interrupted` leaves it pending for a replay to run again.

A policy with no maximum (the default) is tried `ATTEMPTS_PER_TASK` times in one
task and then answers `Paused`: the worker fails the task with the error
(`FailTask`: a bug or an outage shows in `troth tasks list`, and the server
retries the task after its backoff) and records nothing, so the step runs again
on the task's next attempt: a fix deployed meanwhile is what runs it. A worker
never holds a task, its lease and a pool thread for a step that may fail until
a deploy, and the run stays recoverable whatever the step does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth.errors import Cancelled

if TYPE_CHECKING:
    from troth._commands import RetryPolicy

__all__ = [
    "ATTEMPTS_PER_TASK",
    "Exhausted",
    "Interrupted",
    "Paused",
    "StepResult",
    "Succeeded",
    "run_with_retry",
]

_log = logging.getLogger("troth.worker")

ATTEMPTS_PER_TASK = 3
"""Attempts of a step with no maximum in one task (waits 1 s and 2 s between them by
default) before the task fails and the server's backoff takes over."""


@dataclass(frozen=True, slots=True)
class Succeeded:
    """The function returned `value` on attempt number `attempts`."""

    value: Any
    attempts: int


@dataclass(frozen=True, slots=True)
class Exhausted:
    """The function's last attempt (number `attempts`) raised `error`; no retry is left."""

    error: Exception | Cancelled
    attempts: int


@dataclass(frozen=True, slots=True)
class Paused:
    """A policy with no maximum: the function failed `attempts` times in this task, the
    last with `error`. Fail the task with it; record nothing (the step runs again)."""

    error: Exception
    attempts: int


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The wait before attempt number `attempts + 1` was cut short (the worker is stopping)."""

    attempts: int


StepResult = Succeeded | Exhausted | Paused | Interrupted


def run_with_retry(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    policy: RetryPolicy,
    *,
    wait: Callable[[float], bool],
    step_id: str = "",
    per_task: int = ATTEMPTS_PER_TASK,
) -> StepResult:
    """Call `fn(*args)` per `policy`; never raises an `Exception` out of `fn`.

    Args:
        fn: The step's function.
        args: Its arguments.
        policy: How many attempts, how long between them, what is never retried.
        wait: Waits the given seconds; answers False if it was cut short, so
            no further attempt is made.
        step_id: Named in log lines.
        per_task: Attempts in this task of a policy with no maximum, then `Paused`.

    A `BaseException` that is not an `Exception` (KeyboardInterrupt,
    SystemExit) propagates: it is not the step's failure to record. `Cancelled`
    (a `BaseException` so that workflow code cannot swallow it), raised by the
    function, say from `Handle.result()` of a cancelled workflow, is: it fails
    the step at once (never retried).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return Succeeded(fn(*args), attempt)
        except (Exception, Cancelled) as exc:
            if isinstance(exc, Cancelled) or not policy.should_retry(exc, attempt):
                return Exhausted(exc, attempt)
            if policy.max_attempts is None and attempt >= per_task:
                return Paused(exc, attempt)
            delay = policy.backoff(attempt)
            _log.info(
                "step %r failed on attempt %d of %s (%s: %s); retrying in %.3gs",
                step_id,
                attempt,
                policy.max_attempts or f"{per_task} in this task (no maximum)",
                type(exc).__name__,
                exc,
                delay,
                extra={"step_id": step_id, "attempt": attempt},
            )
            if not wait(delay):
                return Interrupted(attempt)
