"""What an exception out of workflow code means: the workflow's outcome, or a bug.

A bug pauses a workflow, it does not lose it (the rule Temporal follows: a
workflow *task* that raises a non-Temporal exception fails and is retried; the
workflow fails only on an `ApplicationError` or a declared failure exception
type). An exception that leaves workflow code fails the workflow only when it
is meant to:

- `troth.WorkflowFailed`, raised on purpose;
- an instance of a type the workflow declared, `@worker.workflow(fail_on=(ValueError,))`;
- one of troth's outcomes it did not catch: a rejected promise
  (`PromiseRejectedError`, which a `ctx.run` step that failed after its
  retries and a failed child workflow raise too), a timeout
  (`PromiseTimedOutError`) or `Cancelled`.

Anything else (a `NameError`, a `KeyError`, a `TypeError`, and non-determinism,
which a deploy of the right code cures as well) fails only the task: the
worker reports it with `FailTask` (the message and traceback), the server
retries the task after a backoff, and the root stays PENDING, resumable from
its checkpoints by fixed code. So does user code that raises outside the
workflow's generator (`PauseTask`): a `ctx.run` function still failing after
its attempts in the task under a retry policy with no maximum, and the codec
refusing a value to record (a workflow's or a step's result). A bug raised
while replaying, before the code reached all its recorded steps, is reported
as itself (its own traceback), not as the non-determinism it also is
(`task_failure`). Pure functions, and `log_paused`, the worker's one ERROR line
per failed attempt; the runner does the calls.
"""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING

from troth.errors import (
    Cancelled,
    NonDeterminismError,
    PromiseRejectedError,
    PromiseTimedOutError,
    WorkflowFailed,
)

if TYPE_CHECKING:
    import logging
    from collections.abc import Sequence

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_TRACEBACK_CHARS",
    "OUTCOME_ERRORS",
    "PauseTask",
    "describe_error",
    "fails_workflow",
    "format_traceback",
    "log_paused",
    "task_failure",
]

OUTCOME_ERRORS: tuple[type[BaseException], ...] = (
    WorkflowFailed,
    PromiseRejectedError,
    PromiseTimedOutError,
    Cancelled,
)
"""Exceptions that fail the workflow whatever it declares."""

MAX_ERROR_CHARS = 2_000
"""The longest error text the server keeps (`Type: message`); longer is cut."""
MAX_TRACEBACK_CHARS = 32_000
"""The longest traceback the server keeps; a longer one keeps its end (the raise)."""


class PauseTask(Exception):
    """User code raised outside the workflow's generator (a step's function, the codec):
    fail the task with `error` (its traceback, `where` first); nothing is recorded, the
    root stays PENDING, and the task's next attempt does it again, on fixed code once
    deployed.

    Attributes:
        error: The exception user code raised.
        where: What raised it, e.g. `step 'wf.3' (notify), attempt 3 in this task`.
    """

    def __init__(self, error: BaseException, where: str) -> None:
        super().__init__(f"{where}: {describe_error(error)}")
        self.error = error
        self.where = where


def fails_workflow(error: BaseException, fail_on: Sequence[type[BaseException]] = ()) -> bool:
    """Whether `error`, out of workflow code, is the workflow's outcome (reject the
    root) rather than a bug (fail the task, retry it, keep the root PENDING)."""
    return isinstance(error, (*OUTCOME_ERRORS, *fail_on))


def describe_error(error: BaseException) -> str:
    """`Type: message`, as `troth tasks list` shows a task's last error."""
    kind = type(error)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    message = str(error)
    name = f"{module}{kind.__qualname__}"
    return _cut_end(f"{name}: {message}" if message else name, MAX_ERROR_CHARS)


def format_traceback(error: BaseException, where: str = "") -> str:
    """The traceback as Python prints it (after a line saying `where`, if given), its
    innermost part if too long. For non-determinism, that of the exception the code
    raised before reaching its recorded steps, if it did, else empty: its message
    names the step and both commands, and its own stack is the engine's."""
    if isinstance(error, NonDeterminismError):
        if error.__cause__ is None:
            return f"{where}\n" if where else ""
        error = error.__cause__
    head = f"{where}\n" if where else ""
    text = head + "".join(traceback.format_exception(error))
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    marker = "... (traceback cut: its start is in the worker's log)\n"
    return head + marker + text[-(MAX_TRACEBACK_CHARS - len(marker) - len(head)) :]


def task_failure(
    error: BaseException, fail_on: Sequence[type[BaseException]] = (), where: str = ""
) -> tuple[BaseException, str, str]:
    """What a paused task reports: the exception to name, its `Type: message`, and its
    traceback (after `where`).

    That is `error`, except for non-determinism found because the code raised a bug
    (an exception that is not the workflow's outcome) before reaching the steps its
    history recorded: then the bug itself, with its own traceback, and a line saying
    which recorded step the code did not reach. (A declared failure raised there is
    reported as the non-determinism it is, naming it: the first execution went past
    that point, so it cannot be the run's outcome.)
    """
    cause = error.__cause__
    if (
        isinstance(error, NonDeterminismError)
        and error.raised
        and cause is not None
        and not fails_workflow(cause, fail_on)
    ):
        step = f"step {error.position}" + (f" ({error.step_id!r})" if error.step_id else "")
        where = "; ".join(
            part
            for part in (
                where,
                f"raised while replaying, before the code reached recorded {step}, "
                f"{error.recorded or 'a step'}",
            )
            if part
        )
        error = cause
    return error, describe_error(error), format_traceback(error, where)


def _cut_end(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def log_paused(
    log: logging.Logger,
    error: BaseException,
    *,
    workflow_id: str,
    task_id: str,
    attempt: int,
    version: str,
    worker_id: str,
    where: str = "",
) -> None:
    """The worker's one ERROR line for an attempt that failed on a bug, with the
    traceback (not for non-determinism: its message says it all), where it was
    raised if outside the workflow's code, and what to do."""
    hint = (
        f"; fix the code and deploy it (declaring compatible=({version!r},) if its version changes)"
        if version
        else "; fix the code and deploy it"
    )
    log.error(
        "workflow %r (task %s, attempt %d) raised %s: %s%s. Its task is retried with "
        "backoff and the workflow stays pending%s, or fail it on purpose with "
        "troth.WorkflowFailed, @worker.workflow(fail_on=...) or "
        "`troth workflows fail %s --reason ...`",
        workflow_id,
        task_id,
        attempt,
        type(error).__name__,
        error,
        f" ({where})" if where else "",
        hint,
        workflow_id,
        exc_info=None if isinstance(error, NonDeterminismError) else error,
        extra={"worker_id": worker_id, "workflow_id": workflow_id, "attempt": attempt},
    )
