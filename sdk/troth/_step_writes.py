"""Step I/O: what a worker does for each step its workflow yields, on the server.

`StepWriter.write` creates a step's promise (latent, timer, child start), or
runs a `ctx.run` function under its `RetryPolicy` (on a fresh lease,
`Leases.confirm`), draws `now()`/`random()`, mints a settle token, and
records the result with the step's creation, in one call. Every write carries
the task's fence (`Held.fence`).

A finished step is recorded, not re-run (DESIGN §4 rule 6): once a step
function has returned, its result is kept and its record retried through any
outage (`until_landed`: no per-call timeout, lease or reconnect ends it; only
the end of the process, or `stop()` giving up on running tasks), until it
lands or the step's promise exists already (then the stored one counts: first
writer wins). Meanwhile the task is busy (`Leases.busy`): it is not dropped
for want of a heartbeat, so the first heartbeat after the server is back
keeps its lease and nobody else replays the step before the record lands. A
lease lost anyway (the server moved the task on) does not stop the record
(the server accepts a finished result at any counter the task had); the
task is dropped after it.

What user code raises here is a bug, and pauses the run (`PauseTask`: the task
fails, nothing is recorded for the step, and it runs again on the task's next
attempt): a `ctx.run` function still failing after its attempts in the task
under a retry policy with no maximum (the default), the codec refusing a
step's result, the server refusing the step (`INVALID_ARGUMENT`: a result over
the size limit, a schema over its budget...). Only the step's own policy
rejects it: an explicit `max_attempts` run out, or an exception it declares
non-retryable.

A pending step refused because the root is settled (`WORKFLOW_SETTLED`) is
answered with the root if it was cancelled (the engine throws `Cancelled` into
the workflow at that yield, and its compensation steps are still recorded); a
root settled otherwise (timed out) raises `RootSettled`: the task is over.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from troth._commands import CreatePromise, Now, Random, ReadState, RunStep, SettleToken, WriteState
from troth._engine import CreateStep, error_value
from troth._failures import PauseTask
from troth._lifetimes import cut_short
from troth._promise import Promise, PromiseState
from troth._worker_steps import Exhausted, Interrupted, Paused, Succeeded, run_with_retry
from troth.errors import (
    AlreadyExistsError,
    AlreadySettledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    PromiseTimedOutError,
    Reason,
    ResourceExhaustedError,
    RpcError,
    UnavailableError,
)
from troth.v1 import promises_pb2

if TYPE_CHECKING:
    from troth._calls import Connection
    from troth._leases import Held, Leases
    from troth._promise import CreateResult
    from troth.client import Client
    from troth.codec import Payload

__all__ = ["Carried", "RootSettled", "StepWriter", "Stopping", "until_landed"]

_log = logging.getLogger("troth.worker")

_RESOLVE = promises_pb2.ResolvePromiseRequest
_REJECT = promises_pb2.RejectPromiseRequest

_T = TypeVar("_T")

UNRECORDED = (UnavailableError, DeadlineExceededError, ResourceExhaustedError)
"""Failures of a record that say nothing about the record: the server was away (or busy)."""
RECORD_BACKOFF = (0.1, 1.0)
"""First and longest wait between attempts to record a result: short, so that the
record lands soon after the server is back."""
_LOG_EVERY_S = 30.0
"""While a result waits, its warning is logged at most this often."""


@dataclass(frozen=True, slots=True)
class Carried:
    """A step computed here whose record waits for the task's next call (`troth._carry`)."""

    step: CreateStep
    request: promises_pb2.CreatePromiseRequest
    """Its record: the step's create, settled with its result, under the task's fence."""
    provisional: Promise
    """The step as it will be recorded (the workflow goes on with it meanwhile)."""


class Stopping(Exception):
    """The worker is stopping: leave the task for the release sweep."""


class RootSettled(Exception):
    """The root finished without this task (it timed out, say): nothing is left to run."""


def until_landed(
    record: Callable[[], _T], *, what: str, abandon: threading.Event, extra: dict[str, str]
) -> _T:
    """`record()`, tried again through any outage (`UNRECORDED` failures) until it
    lands: no per-call timeout, lease or reconnect window ends the retry, only
    `abandon` (the worker stops waiting for its running tasks: `Stopping`).

    Args:
        record: The call that records the result (each try has the client's timeout).
        what: What waits, for the log ("step 'x.1' finished").
        abandon: Set when the worker gives up on its running tasks.
        extra: The log lines' extra fields.
    """
    attempt = 0
    started = time.monotonic()
    logged = -_LOG_EVERY_S
    while True:
        try:
            return record()
        except UNRECORDED as exc:
            attempt += 1
            first, longest = RECORD_BACKOFF
            delay = min(longest, first * 2 ** min(attempt - 1, 16)) * random.uniform(0.5, 1.0)
            waited = time.monotonic() - started
            if waited - logged >= _LOG_EVERY_S:
                logged = waited
                _log.warning(
                    "%s, but its result is not recorded yet (%s); keeping it and trying again "
                    "until the server takes it (attempt %d, %.0fs so far)",
                    what,
                    exc,
                    attempt,
                    waited,
                    extra=extra,
                )
            if abandon.wait(delay):
                _log.error(
                    "%s, but the worker stopped before its result was recorded (%s); "
                    "the result is given up",
                    what,
                    exc,
                    extra=extra,
                )
                raise Stopping from exc


class StepWriter:
    """A worker's step I/O; thread-safe (each task's steps on its own pool thread).

    Args:
        client: Its codec encodes step values.
        connection: The client's transport and deadline (promise calls).
        leases: The worker's leases (a step function starts on a fresh one).
        stopping: Set when the worker starts stopping: no step function starts.
        abandon: Set when the worker stops waiting for running tasks: a result
            still being recorded is given up.
    """

    def __init__(
        self,
        client: Client,
        connection: Connection,
        leases: Leases,
        *,
        worker_id: str,
        stopping: threading.Event,
        abandon: threading.Event,
    ) -> None:
        self._client = client
        self._calls = connection
        self._leases = leases
        self.worker_id = worker_id
        self._stopping = stopping
        self._abandon = abandon

    def _wait(self, seconds: float) -> bool:
        return not self._stopping.wait(seconds)

    def write(self, held: Held, step: CreateStep) -> list[Promise]:
        """Do the I/O a step asks for; answer the promises to feed back to the engine.

        Raises:
            Stopping: The worker stops before the step's function ran, or gave up
                recording its result.
            RootSettled: The root finished (other than cancelled) without the task.
            AlreadyExistsError: The step's id is taken by a promise that is not
                this workflow's step.
        """
        command = step.command
        if isinstance(command, ReadState | WriteState):
            return [self._state(held, step, command)]
        if not isinstance(command, RunStep | Now | Random | SettleToken):
            if step.exists:
                return [self._calls.get(step.step_id)]
            try:
                created = self._create(held, step).promise
            except FailedPreconditionError as exc:
                if exc.reason != Reason.WORKFLOW_SETTLED:
                    raise
                return [self._settled_root(held)]
            except InvalidArgumentError as exc:  # what the code asked (a tag, a schema...)
                raise PauseTask(exc, f"creating step {step.step_id!r}") from exc
            if (warning := cut_short(step, created)) is not None:
                _log.warning(
                    "%s", warning, extra={"step_id": step.step_id, "workflow_id": created.parent_id}
                )
            return [created]
        # A step that computes its value records it with its creation, in one call.
        # Dying before that call means the step runs again: at-least-once
        # execution, exactly-once recording (the first record wins). From the
        # function's start to the record the task is busy: no outage takes it.
        if isinstance(command, RunStep):
            self._leases.confirm(held, self._wait)
        with self._leases.busy(held):
            ok, value = self._compute(held, step)
            return [self._record_until_landed(held, step, ok, value)]

    # -- a step's record carried by the call that ends the task's hold (`troth._carry`)

    @staticmethod
    def carries(step: CreateStep) -> bool:
        """Whether `step`'s record may go with the task's next call instead of its own: a
        step that computes its value here (`run`, `now`, `random`), created now."""
        return isinstance(step.command, RunStep | Now | Random) and not step.exists

    def confirm(self, held: Held, step: CreateStep) -> None:
        """Before a `run` step's function starts: on a fresh lease (as `write` does)."""
        if isinstance(step.command, RunStep):
            self._leases.confirm(held, self._wait)

    def compute(self, held: Held, step: CreateStep) -> Carried:
        """Run a step that `carries` (after `confirm`, the task busy) and make its
        record, not sent: the caller carries it, or `record_carried` sends it."""
        ok, value = self._compute(held, step)
        encoded = self._encode(step, value)
        request = self._create_request(held, step, ok, encoded)
        provisional = Promise(
            id=step.step_id,
            state=PromiseState.RESOLVED if ok else PromiseState.REJECTED,
            param=step.param,
            value=encoded,
            tags=dict(step.tags),
            create_time=datetime.now(UTC),
            requested_by=step.requested_by,
            parent_id=held.root_id,
        )
        return Carried(step, request, provisional)

    def record_carried(self, held: Held, carried: Carried) -> Promise:
        """Record a computed step by its own call, through any outage (`until_landed`),
        sending the very record it would have carried (a codec that encrypts writes other
        bytes each time); answers the record as stored (another writer's, if first)."""

        def send() -> Promise:
            try:
                return self._calls.create(carried.request).promise
            except InvalidArgumentError as exc:
                raise _refused(carried.step, exc) from exc

        return self._until_recorded(held, carried.step, send)

    def _state(self, held: Held, step: CreateStep, command: ReadState | WriteState) -> Promise:
        """A read or write of the workflow's state slot, made and recorded by the server
        in one transaction under the task's fence (a repeat answers the recorded step)."""
        write = isinstance(command, WriteState)
        value = self._encode(step, command.value) if isinstance(command, WriteState) else None
        try:
            return self._calls.create(
                self._calls.create_request(
                    step.step_id,
                    step.param,
                    tags=step.tags,
                    resolved_with=value,
                    fence=held.fence(self.worker_id),
                    state=(command.name, write),
                )
            ).promise
        except AlreadyExistsError:
            stored = self._calls.get(step.step_id)
            if stored.parent_id != held.root_id:
                raise  # a promise that is not this workflow's step: never a checkpoint
            return stored
        except InvalidArgumentError as exc:  # a value over the size limit, say
            raise _refused(step, exc) from exc

    def _compute(self, held: Held, step: CreateStep) -> tuple[bool, Any]:
        """The value a `run`, `now`, `random` or `settle_token` step records (False: its
        rejection)."""
        command = step.command
        if isinstance(command, Now | Random):
            return True, command.draw()
        if isinstance(command, SettleToken):
            return self._mint(held, command)
        assert isinstance(command, RunStep)
        result = run_with_retry(
            command.fn, command.args, command.retry, wait=self._wait, step_id=step.step_id
        )
        if isinstance(result, Interrupted):
            raise Stopping
        if isinstance(result, Paused):
            raise PauseTask(
                result.error,
                f"step {step.step_id!r} ({command.name}) failed {result.attempts} times in "
                "this task; nothing is recorded for it, and it runs again when the task "
                "is retried (its retry policy has no maximum)",
            )
        if isinstance(result, Succeeded):
            return True, result.value
        assert isinstance(result, Exhausted)
        _log.info(
            "step %r (%s) failed after %d attempt(s): %s: %s",
            step.step_id,
            command.name,
            result.attempts,
            type(result.error).__name__,
            result.error,
            extra={"step_id": step.step_id},
        )
        return False, error_value(result.error)

    def _mint(self, held: Held, command: SettleToken) -> tuple[bool, Any]:
        """Mint the settle token a `settle_token` step records (a refusal is recorded
        as the step's rejection: the yield raises it)."""
        try:
            token = self._calls.mint_settle_token(
                command.promise_id,
                outcomes=command.outcomes,
                ttl=command.ttl,
                fence=held.fence(self.worker_id),
                acts_for=command.acts_for,
            )
        except RpcError as exc:
            if exc.retryable:
                raise
            return False, error_value(exc)
        return True, token

    def _settled_root(self, held: Held) -> Promise:
        """The root, refused a new pending step because it is settled: if it was
        cancelled, the engine throws `Cancelled` at this yield; else the task is over."""
        root = self._calls.get(held.root_id)
        if root.state is not PromiseState.REJECTED_CANCELED:
            raise RootSettled(root.state.value)
        return root

    def _record_until_landed(self, held: Held, step: CreateStep, ok: bool, value: Any) -> Promise:
        """Record a finished step's result, through any outage: an outage alone never
        re-runs a step function. Gives up only when the worker stops waiting."""

        def send() -> Promise:
            if step.exists:  # created pending by an older worker: settle it
                return self._settle(held, step, ok, value)
            return self._record(held, step, ok, value)

        return self._until_recorded(held, step, send)

    def _until_recorded(self, held: Held, step: CreateStep, send: Callable[[], Promise]) -> Promise:
        """`send()` (a step's record), tried again through any outage until it lands or
        finds the step recorded already (then that record stands: first writer wins)."""

        def record() -> Promise:
            try:
                return send()
            except AlreadyExistsError:
                stored = self._calls.get(step.step_id)
                if stored.parent_id != held.root_id:
                    raise  # a promise that is not this workflow's step: never a checkpoint
                return stored  # recorded first by another writer of this workflow: that stands

        return until_landed(
            record,
            what=f"step {step.step_id!r} finished",
            abandon=self._abandon,
            extra={"step_id": step.step_id, "workflow_id": held.root_id},
        )

    def _encode(self, step: CreateStep, value: Any) -> Payload:
        """A step's result as the codec writes it; a value it refuses is a bug (`PauseTask`)."""
        try:
            return self._client.encode(value)
        except Exception as exc:
            command = step.command
            name = f" ({command.name})" if isinstance(command, RunStep) else ""
            where = (
                f"encoding the result of step {step.step_id!r}{name} "
                f"(a {type(value).__name__}) with the codec; nothing is recorded for it"
            )
            raise PauseTask(exc, where) from exc

    def _create(
        self, held: Held, step: CreateStep, *, ok: bool | None = None, value: Any = None
    ) -> CreateResult:
        encoded = None if ok is None else self._encode(step, value)
        return self._calls.create(self._create_request(held, step, ok, encoded))

    def _create_request(
        self, held: Held, step: CreateStep, ok: bool | None, encoded: Payload | None
    ) -> promises_pb2.CreatePromiseRequest:
        """The create of `step`'s promise (with `ok`, already settled with `encoded`)."""
        command = step.command
        decision = command if isinstance(command, CreatePromise) else None
        return self._calls.create_request(
            step.step_id,
            step.param,
            tags=step.tags,
            ttl=step.ttl,
            resolved_with=encoded if ok else None,
            rejected_with=encoded if ok is False else None,
            schema=decision.schema.json_schema if decision and decision.schema else None,
            title=decision.title if decision else "",
            message=decision.message if decision else "",
            requested_by=step.requested_by,
            fence=held.fence(self.worker_id),
            approvers=decision.approvers if decision else None,
        )

    def _record(self, held: Held, step: CreateStep, ok: bool, value: Any) -> Promise:
        """Create the step's promise already settled with its result."""
        try:
            return self._create(held, step, ok=ok, value=value).promise
        except InvalidArgumentError as exc:
            raise _refused(step, exc) from exc

    def _settle(self, held: Held, step: CreateStep, ok: bool, value: Any) -> Promise:
        """Record a step's result; a step someone else settled first keeps their result."""
        fence = held.fence(self.worker_id)
        encoded = self._encode(step, value)
        try:
            kind = _RESOLVE if ok else _REJECT
            return self._calls.settle(kind, step.step_id, encoded, fence=fence).promise
        except (AlreadySettledError, PromiseTimedOutError):
            return self._calls.get(step.step_id)
        except InvalidArgumentError as exc:
            raise _refused(step, exc) from exc


def _refused(step: CreateStep, error: InvalidArgumentError) -> PauseTask:
    """The server refused a step's record (a result over the size limit, say): a bug."""
    return PauseTask(error, f"recording the result of step {step.step_id!r}; nothing is recorded")
