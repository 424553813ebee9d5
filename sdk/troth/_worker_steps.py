"""Running one `ctx.run` step's function under its `RetryPolicy`, with no I/O of its own.

`run_with_retry` calls the function until it succeeds, raises a
non-retryable error, or runs out of attempts, waiting `policy.backoff(n)`
between attempts through an injected `wait` (so tests take no time, and a
stopping worker can cut a wait short). What it answers the worker records on
the step promise: `Succeeded` resolves it, `Exhausted` rejects it with
`error_value(error)` (the workflow sees `PromiseRejectedError` and may
compensate), `Interrupted` leaves it pending for a replay to run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from troth.errors import Cancelled

if TYPE_CHECKING:
    from troth._commands import RetryPolicy

__all__ = ["Exhausted", "Interrupted", "StepResult", "Succeeded", "run_with_retry"]

_log = logging.getLogger("troth.worker")


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
class Interrupted:
    """The wait before attempt number `attempts + 1` was cut short (the worker is stopping)."""

    attempts: int


StepResult = Succeeded | Exhausted | Interrupted


def run_with_retry(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    policy: RetryPolicy,
    *,
    wait: Callable[[float], bool],
    step_id: str = "",
) -> StepResult:
    """Call `fn(*args)` per `policy`; never raises an `Exception` out of `fn`.

    Args:
        fn: The step's function.
        args: Its arguments.
        policy: How many attempts, how long between them, what is never retried.
        wait: Waits the given seconds; answers False if it was cut short, so
            no further attempt is made.
        step_id: Named in log lines.

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
            if not policy.should_retry(exc, attempt):
                return Exhausted(exc, attempt)
            delay = policy.backoff(attempt)
            _log.info(
                "step %r failed on attempt %d of %d (%s: %s); retrying in %.3gs",
                step_id,
                attempt,
                policy.max_attempts,
                type(exc).__name__,
                exc,
                delay,
                extra={"step_id": step_id, "attempt": attempt},
            )
            if not wait(delay):
                return Interrupted(attempt)
