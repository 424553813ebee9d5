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
its checkpoints by fixed code. Pure functions, and `log_paused`, the worker's
one ERROR line per failed attempt; the runner does the calls.
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
    "describe_error",
    "fails_workflow",
    "format_traceback",
    "log_paused",
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


def format_traceback(error: BaseException) -> str:
    """The traceback as Python prints it, its innermost part if too long. Empty for
    non-determinism: its message names the step and both commands, and its stack is
    the engine's, not the workflow's."""
    if isinstance(error, NonDeterminismError):
        return ""
    text = "".join(traceback.format_exception(error))
    if len(text) <= MAX_TRACEBACK_CHARS:
        return text
    marker = "... (traceback cut: its start is in the worker's log)\n"
    return marker + text[-(MAX_TRACEBACK_CHARS - len(marker)) :]


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
) -> None:
    """The worker's one ERROR line for an attempt that failed on a bug, with the
    traceback (not for non-determinism: its message says it all), and what to do."""
    hint = (
        f"; fix the code and deploy it (declaring compatible=({version!r},) if its version changes)"
        if version
        else "; fix the code and deploy it"
    )
    log.error(
        "workflow %r (task %s, attempt %d) raised %s: %s. Its task is retried with "
        "backoff and the workflow stays pending%s, or fail it on purpose with "
        "troth.WorkflowFailed, @worker.workflow(fail_on=...) or "
        "`troth workflows fail %s --reason ...`",
        workflow_id,
        task_id,
        attempt,
        type(error).__name__,
        error,
        hint,
        workflow_id,
        exc_info=None if isinstance(error, NonDeterminismError) else error,
        extra={"worker_id": worker_id, "workflow_id": workflow_id, "attempt": attempt},
    )
