"""`Runner`: runs one task of a worker: the engine loop, the step I/O, and the cache of
suspended generators.

For each delivery the runner builds a `troth._engine.Engine` from the
registered function, the root's param and the task's history (or takes the
workflow's live generator from the cache), and does the I/O the engine asks
for: it creates step promises (latent, timer, child start), runs `ctx.run`
functions under their `RetryPolicy` and records their results, resolves
`now()`/`random()` with a fresh draw, suspends the task on what the workflow
waits for, and completes it with the workflow's outcome. Every step write
carries the task's fence (`Held.fence`).

A bug pauses, it does not lose (`troth._failures`): an exception out of
workflow code that is not the workflow's outcome (`WorkflowFailed`, a declared
`fail_on` type, an uncaught rejection, timeout or `Cancelled`) fails the task
instead of the root, logged at ERROR with its traceback once per attempt: the
server records it and retries the task after a backoff, and the root stays
PENDING until fixed code resumes it.

A finished step is recorded, not re-run: once a step function has returned,
its result is kept and its record retried (with backoff, until the worker
gives up stopping) through any outage, until it lands or the step's promise
exists already (then the stored one counts: first writer wins). A lease lost
meanwhile does not stop the record; the task is dropped after it.

A step function starts only on a fresh lease (`Leases.confirm`). A pending
step refused because the root is settled (`WORKFLOW_SETTLED`) throws
`Cancelled` into the workflow at that yield if the root was cancelled (its
compensation steps are still recorded); a root settled otherwise (timed out)
ends the task.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from troth._commands import TAG_FUNC, TAG_KIND, CreatePromise, Now, Random, RunStep, SettleToken
from troth._convert import promise_from_proto
from troth._engine import CreateStep, Done, Engine, Failed, Suspend, error_value
from troth._failures import describe_error, fails_workflow, format_traceback, log_paused
from troth._leases import Held, Leases, Lost
from troth._lifetimes import cut_short
from troth._promise import PromiseState
from troth._tracing import step_span, task_span
from troth._worker_steps import Exhausted, Interrupted, Succeeded, run_with_retry
from troth.errors import (
    AlreadyExistsError,
    AlreadySettledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    LeaseLostError,
    PromiseTimedOutError,
    Reason,
    RegistrationError,
    ResourceExhaustedError,
    RpcError,
    UnavailableError,
)
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth._calls import Connection
    from troth._promise import CreateResult, Promise
    from troth._tasks import TaskCalls
    from troth._versions import WorkflowRegistration
    from troth.client import Client
    from troth.codec import Payload

__all__ = ["Runner", "Stopping", "describe_version", "foreign_version"]

_log = logging.getLogger("troth.worker")

_UNRECORDED = (UnavailableError, DeadlineExceededError, ResourceExhaustedError)
"""Failures of a record that say nothing about the record: the server was away."""
_RECORD_BACKOFF = (0.1, 5.0)  # first and longest wait between attempts to record a result


class Stopping(Exception):
    """The worker is stopping: leave the task for the release sweep."""


class _RootSettled(Exception):
    """The root finished without this task (it timed out, say): nothing is left to run."""


class Runner:
    """Runs tasks for one worker; thread-safe (one call of `run` per task, on the pool).

    Args:
        client: Its codec encodes and decodes values.
        connection: The client's transport and deadline (promise calls).
        tasks: The `TaskService` calls, as the worker makes them.
        leases: The worker's leases.
        registrations: The registered workflows by name, with their versions.
        group: The worker's group (the default of child workflows).
        cache_size: Suspended workflows kept for a resume without replay (0: none).
        stopping: Set when the worker starts stopping: no new step starts.
        abandon: Set when the worker stops waiting for running tasks: a result
            still being recorded is given up.
    """

    def __init__(
        self,
        client: Client,
        connection: Connection,
        tasks: TaskCalls,
        leases: Leases,
        registrations: Callable[[], Mapping[str, WorkflowRegistration]],
        *,
        group: str,
        cache_size: int,
        stopping: threading.Event,
        abandon: threading.Event,
    ) -> None:
        self._client = client
        self._calls = connection
        self._tasks = tasks
        self._leases = leases
        self._registrations = registrations
        self.group = group
        self.worker_id = tasks.worker_id
        self._cache_size = cache_size
        self._stopping = stopping
        self._abandon = abandon
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, Engine] = collections.OrderedDict()

    # -- one task ----------------------------------------------------------

    def run(self, held: Held, response: tasks_pb2.PollResponse) -> None:
        """Run the task to its end, its suspension, or the loss of its lease."""
        try:
            waited = self._after(held)
            if self._stopping.is_set():
                return  # left for the release sweep
            if held.lost:
                return
            root = response.root
            with task_span(root.tags, **{
                "troth.workflow.id": root.id,
                "troth.workflow.name": root.tags.get(TAG_FUNC, ""),
                "troth.task.id": held.task_id,
                "troth.task.kind": tasks_pb2.TaskKind.Name(response.task.kind),
                "troth.worker.id": self.worker_id,
            }):  # fmt: skip
                self._execute(held, response, refresh=waited)
            self._leases.forget(held)
        except (Lost, LeaseLostError) as exc:
            _log.info(
                "worker %s lost its lease on task %s of workflow %r; dropping it (%s)",
                self.worker_id,
                held.task_id,
                held.root_id,
                "the lease moved on" if isinstance(exc, Lost) else exc,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._leases.forget(held)
        except Stopping:
            pass  # left for the release sweep
        except _RootSettled as exc:
            _log.info(
                "workflow %r was settled (%s) while task %s ran; completing the task",
                held.root_id,
                exc,
                held.task_id,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            try:
                self._tasks.complete(held.task_id, held.counter)
            except RpcError:
                pass  # then its lease runs out, and the server moves it on
            self._leases.forget(held)
        except Exception:
            _log.exception(
                "worker %s failed running task %s of workflow %r; giving it back",
                self.worker_id,
                held.task_id,
                held.root_id,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._leases.release(held)
        finally:
            self._leases.finished(held)

    def _after(self, held: Held) -> bool:
        """Wait until the older task of this root (if one still runs here) stops;
        True if there was one (then the delivery's history may lack its last steps)."""
        older = held.after
        held.after = None
        if older is None:
            return False
        while not older.stopped.wait(0.1):
            if self._stopping.is_set():
                raise Stopping
        return True

    def _execute(
        self, held: Held, response: tasks_pb2.PollResponse, *, refresh: bool = False
    ) -> None:
        foreign = foreign_version(self._registrations(), response)
        if foreign is not None:
            # Replaying it on other code could take other branches on its history.
            _log.warning(
                "worker %s: %s; giving task %s back for a worker with that code",
                self.worker_id,
                foreign,
                held.task_id,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._leases.release(held)
            return
        root = promise_from_proto(response.root)
        history = [root, *(promise_from_proto(p) for p in response.history)]
        if refresh:
            # Steps the older task recorded after this delivery left the server:
            # read them, so that none of their functions runs again.
            history += self._client.search_all(parent_id=root.id)
        engine = self._cache_take(root.id)
        if engine is not None:
            outcome = engine.advance(history)
        else:
            name = root.tags.get(TAG_FUNC, "")
            registered = self._registrations()
            workflow = registered.get(name)
            if workflow is None:
                known = ", ".join(sorted(registered)) or "none"
                error = RegistrationError(
                    name,
                    f"workflow {name!r} is not registered on the workers of group "
                    f"{self.group!r} (worker {self.worker_id} knows: {known}); register it "
                    "with @worker.workflow, or start it in the group whose workers run it",
                )
                _log.warning("%s; rejecting workflow %r", error, root.id)
                self._complete(held, reject=error_value(error))
                return
            try:
                args = self._decode_args(root)
            except (TypeError, ValueError) as exc:
                self._complete(held, reject=error_value(exc))
                return
            engine = Engine(
                workflow.fn,
                args,
                root_id=root.id,
                history=history,
                codec=self._client.codec,
                group=self.group,
            )
            outcome = engine.advance()
        keep = False
        try:
            while True:
                if isinstance(outcome, CreateStep):
                    self._check(held)
                    try:
                        with step_span(**_step_attributes(outcome)):
                            created = self._step(held, outcome)
                    except AlreadyExistsError as exc:
                        # The step's id is taken by a promise that is not this
                        # workflow's step (the server says whose): no retry helps,
                        # and each would run the step's function again.
                        self._reject(held, exc)
                        return
                    outcome = engine.advance(created)
                elif isinstance(outcome, Suspend):
                    # One call registers the callbacks and completes the task,
                    # unless something it waits on settled meanwhile.
                    settled = self._tasks.suspend(held.task_id, held.counter, outcome.awaiting)
                    if settled:
                        outcome = engine.advance(settled)
                        continue
                    keep = True
                    _log.info(
                        "workflow %r waits on %s",
                        held.root_id,
                        ", ".join(outcome.awaiting),
                        extra={"workflow_id": held.root_id},
                    )
                    return
                elif isinstance(outcome, Done):
                    try:
                        value = self._client.encode(outcome.value)
                    except (TypeError, ValueError) as exc:
                        self._complete(held, reject=error_value(exc))
                    else:
                        self._complete(held, resolve=value)
                        _log.info(
                            "workflow %r returned",
                            held.root_id,
                            extra={"workflow_id": held.root_id},
                        )
                    return
                else:
                    self._failed(held, response, outcome)
                    return
        finally:
            if keep:
                self._cache_put(root.id, engine)
            else:
                engine.close()

    def _decode_args(self, root: Promise) -> list[Any]:
        args = self._client.decode(root.param)
        if args is None:
            return []
        if not isinstance(args, list):
            raise TypeError(
                f"workflow {root.id!r} has param {args!r}, not a list of arguments; "
                "start workflows with client.start(name, *args, id=...)"
            )
        return args

    def _failed(self, held: Held, response: tasks_pb2.PollResponse, outcome: Failed) -> None:
        """The workflow raised: its outcome (reject the root), or a bug (fail the task:
        the server retries it after a backoff and the root stays PENDING)."""
        error = outcome.error
        name = response.root.tags.get(TAG_FUNC, "")
        registered = self._registrations().get(name)
        if fails_workflow(error, registered.fail_on if registered else ()):
            self._reject(held, error)
            return
        log_paused(
            _log,
            error,
            workflow_id=held.root_id,
            task_id=held.task_id,
            attempt=response.task.failed_attempts + 1,
            version=response.task.workflow_version or response.root.workflow_version,
            worker_id=self.worker_id,
        )
        # A lease lost meanwhile: `run` drops the task; whoever holds it now retries.
        self._tasks.fail(held.task_id, held.counter, describe_error(error), format_traceback(error))

    def _reject(self, held: Held, error: Exception) -> None:
        _log.info(
            "workflow %r raised %s: %s; rejecting it",
            held.root_id,
            type(error).__name__,
            error,
            extra={"workflow_id": held.root_id},
        )
        self._complete(held, reject=error_value(error))

    def _check(self, held: Held) -> None:
        self._leases.check(held)
        if self._stopping.is_set():
            raise Stopping

    def _wait(self, seconds: float) -> bool:
        return not self._stopping.wait(seconds)

    # -- step I/O ----------------------------------------------------------

    def _step(self, held: Held, step: CreateStep) -> list[Promise]:
        command = step.command
        if not isinstance(command, RunStep | Now | Random | SettleToken):
            if step.exists:
                return [self._calls.get(step.step_id)]
            try:
                created = self._create(held, step).promise
            except FailedPreconditionError as exc:
                if exc.reason != Reason.WORKFLOW_SETTLED:
                    raise
                return [self._settled_root(held)]
            if (warning := cut_short(step, created)) is not None:
                _log.warning(
                    "%s", warning, extra={"step_id": step.step_id, "workflow_id": created.parent_id}
                )
            return [created]
        # A step that computes its value records it with its creation, in one call.
        # Dying before that call means the step runs again: at-least-once
        # execution, exactly-once recording (the first record wins).
        value: Any
        if isinstance(command, Now | Random):
            ok, value = True, command.draw()
        elif isinstance(command, SettleToken):
            ok, value = self._mint(held, command)
        else:
            self._leases.confirm(held, self._wait)
            result = run_with_retry(
                command.fn, command.args, command.retry, wait=self._wait, step_id=step.step_id
            )
            if isinstance(result, Interrupted):
                raise Stopping
            if isinstance(result, Succeeded):
                ok, value = True, result.value
            else:
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
                ok, value = False, error_value(result.error)
        return [self._record_until_landed(held, step, ok, value)]

    def _mint(self, held: Held, command: SettleToken) -> tuple[bool, Any]:
        """Mint the settle token a `settle_token` step records (a refusal is recorded
        as the step's rejection: the yield raises it)."""
        try:
            token = self._calls.mint_settle_token(
                command.promise_id,
                outcomes=command.outcomes,
                ttl=command.ttl,
                fence=held.fence(self.worker_id),
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
            raise _RootSettled(root.state.value)
        return root

    def _record_until_landed(self, held: Held, step: CreateStep, ok: bool, value: Any) -> Promise:
        """Record a finished step's result, through any outage: an outage alone never
        re-runs a step function. Gives up only when the worker stops waiting."""
        attempt = 0
        while True:
            try:
                if step.exists:  # created pending by an older worker: settle it
                    return self._settle(held, step.step_id, ok, value)
                return self._record(held, step, ok, value)
            except AlreadyExistsError:
                stored = self._calls.get(step.step_id)
                if stored.parent_id != held.root_id:
                    raise  # a promise that is not this workflow's step: never a checkpoint
                return stored  # recorded first by another writer of this workflow: that stands
            except _UNRECORDED as exc:
                attempt += 1
                first, longest = _RECORD_BACKOFF
                delay = min(longest, first * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
                _log.warning(
                    "step %r finished but its result is not recorded yet (%s); "
                    "retrying in %.1fs (attempt %d)",
                    step.step_id,
                    exc,
                    delay,
                    attempt,
                    extra={"step_id": step.step_id, "workflow_id": held.root_id},
                )
                if self._abandon.wait(delay):
                    raise Stopping from exc

    def _create(
        self, held: Held, step: CreateStep, *, ok: bool | None = None, value: Any = None
    ) -> CreateResult:
        encoded = None if ok is None else self._client.encode(value)
        command = step.command
        decision = command if isinstance(command, CreatePromise) else None
        return self._calls.create(
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
        except (TypeError, ValueError, InvalidArgumentError) as exc:
            if not ok:
                raise
            # The result cannot be recorded (not encodable, over the size limit).
            _log.info("step %r: its result cannot be recorded: %s", step.step_id, exc)
            return self._create(held, step, ok=False, value=error_value(exc)).promise

    def _settle(self, held: Held, step_id: str, ok: bool, value: Any) -> Promise:
        """Record a step's result; a step someone else settled first keeps their result."""
        fence = held.fence(self.worker_id)
        try:
            if ok:
                try:
                    encoded = self._client.encode(value)
                    return self._calls.settle(step_id, encoded, ok=True, fence=fence)
                except (TypeError, ValueError, InvalidArgumentError) as exc:
                    # The result cannot be recorded (not encodable, over the size limit).
                    _log.info("step %r: its result cannot be recorded: %s", step_id, exc)
                    value = error_value(exc)
            return self._calls.settle(step_id, self._client.encode(value), ok=False, fence=fence)
        except (AlreadySettledError, PromiseTimedOutError):
            return self._calls.get(step_id)

    # -- task calls --------------------------------------------------------

    def _complete(self, held: Held, *, resolve: Payload | None = None, reject: Any = None) -> None:
        encoded_reject = None if reject is None else self._client.encode(reject)
        try:
            self._tasks.complete(held.task_id, held.counter, resolve=resolve, reject=encoded_reject)
        except (AlreadySettledError, PromiseTimedOutError) as exc:
            # The root was settled meanwhile (cancelled, timed out): that stands.
            _log.info(
                "workflow %r finished, but its root was already settled (%s)",
                held.root_id,
                exc,
                extra={"workflow_id": held.root_id},
            )
            self._tasks.complete(held.task_id, held.counter)

    # -- the cache of suspended workflows ----------------------------------

    def _cache_take(self, root_id: str) -> Engine | None:
        with self._lock:
            return self._cache.pop(root_id, None)

    def _cache_put(self, root_id: str, engine: Engine) -> None:
        evicted: list[Engine] = []
        with self._lock:
            if self._cache_size and not self._stopping.is_set():
                self._cache[root_id] = engine
                while len(self._cache) > self._cache_size:
                    evicted.append(self._cache.popitem(last=False)[1])
            else:
                evicted.append(engine)
        for old in evicted:
            old.close()

    def close(self) -> None:
        """Close every cached workflow (their `finally:` blocks run)."""
        with self._lock:
            engines = list(self._cache.values())
            self._cache.clear()
        for engine in engines:
            engine.close()


def _step_attributes(step: CreateStep) -> dict[str, str]:
    command = step.command
    attributes = {"troth.step.id": step.step_id, "troth.step.kind": step.tags.get(TAG_KIND, "")}
    if isinstance(command, RunStep):
        attributes["troth.step.function"] = command.name
    return attributes


def foreign_version(
    registrations: Mapping[str, WorkflowRegistration], response: tasks_pb2.PollResponse
) -> str | None:
    """Why a worker must not run the task: the workflow was started with code of a
    version it neither runs nor declared compatible (None: it may run it)."""
    version = response.task.workflow_version or response.root.workflow_version
    name = response.root.tags.get(TAG_FUNC, "")
    registered = registrations.get(name)
    if not version or registered is None or registered.runs(version):
        return None
    return (
        f"workflow {response.root.id!r} ({name!r}) was started with version {version!r}; "
        f"this worker runs {describe_version(registered)}"
    )


def describe_version(registered: WorkflowRegistration) -> str:
    text = f"{registered.name} version {registered.version}"
    if registered.compatible:
        text += f" (compatible with {', '.join(registered.compatible)})"
    return text
