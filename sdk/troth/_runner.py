"""`Runner`: runs one task of a worker: the engine loop and the cache of suspended
generators; the step I/O is `troth._step_writes.StepWriter`.

For each delivery the runner builds a `troth._engine.Engine` from the
registered function, the root's param and the task's history (or takes the
workflow's live generator from the cache), and does what the engine asks for:
each step goes to the step writer (it creates step promises, runs `ctx.run`
functions and records their results, every write fenced by the task), a wait
suspends the task on what the workflow waits for, and the workflow's end
completes it with its outcome.

A bug pauses, it does not lose (`troth._failures`): an exception out of
workflow code that is not the workflow's outcome (`WorkflowFailed`, a declared
`fail_on` type, an uncaught rejection, timeout or `Cancelled`) fails the task
instead of the root, logged at ERROR with its traceback once per attempt: the
server records it and retries the task after a backoff, and the root stays
PENDING until fixed code resumes it. So does user code that raises outside the
generator (`PauseTask`): a step's function still failing after its attempts in
the task (a retry policy with no maximum), and the codec on the workflow's
arguments, its result or a step's result. A root settled without the task (it
timed out) ends the task.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from troth._carry import Carrier
from troth._commands import TAG_FUNC, TAG_KIND, RunStep
from troth._convert import datetime_from_proto, promise_from_proto
from troth._engine import CreateStep, Done, Engine, Failed, Suspend, error_value
from troth._failures import PauseTask, fails_workflow, log_paused, task_failure
from troth._leases import Held, Leases, Lost
from troth._step_writes import RootSettled, StepWriter, Stopping
from troth._task_ends import TaskEnds
from troth._tracing import step_span, task_span
from troth.errors import (
    AlreadyExistsError,
    Cancelled,
    LeaseLostError,
    RegistrationError,
    RpcError,
)
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth._calls import Connection
    from troth._promise import Promise
    from troth._tasks import TaskCalls
    from troth._versions import WorkflowRegistration
    from troth.client import Client

__all__ = ["Runner", "describe_version", "foreign_version"]

_log = logging.getLogger("troth.worker")


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
        self._steps = StepWriter(
            client,
            connection,
            leases,
            worker_id=tasks.worker_id,
            stopping=stopping,
            abandon=abandon,
        )
        self._tasks = tasks
        self._leases = leases
        self._ends = TaskEnds(client, tasks, leases, abandon)
        self._registrations = registrations
        self.group = group
        self.worker_id = tasks.worker_id
        self._cache_size = cache_size
        self._stopping = stopping
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, Engine] = collections.OrderedDict()

    # -- one task ----------------------------------------------------------

    def run(self, held: Held, response: tasks_pb2.PollResponse) -> None:
        """Run the task to its end, its suspension, or the loss of its lease."""
        try:
            older_writes = self._after(held)
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
                self._execute(held, response, older_writes=older_writes)
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
            # A lease that ran out stalls this worker's streams on the server until a
            # call of ours succeeds: heartbeat now, even if nothing is held any more.
            self._leases.wake()
        except Stopping:
            pass  # left for the release sweep
        except RootSettled as exc:
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

    def _after(self, held: Held) -> list[Promise]:
        """Wait until the older task of this root (if one still runs here) stops; answer
        what it wrote (the delivery's history, read before, may lack its last steps)."""
        older = held.after
        held.after = None
        if older is None:
            return []
        while not older.stopped.wait(0.1):
            if self._stopping.is_set():
                raise Stopping
        return older.written

    def _execute(
        self,
        held: Held,
        response: tasks_pb2.PollResponse,
        *,
        older_writes: Sequence[Promise] = (),
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
        # Steps the older task of this root recorded here after this delivery left
        # the server: so that none of their functions runs again. Known in this
        # process, they need no read (which a worker's role may not make).
        history += older_writes
        engine = self._cache_take(root.id)
        if engine is not None:
            outcome = engine.advance(history)
        else:
            engine = self._new_engine(held, response, root, history)
            if engine is None:
                return
            outcome = engine.advance()
        keep = False
        carrier = Carrier(self._steps, self._leases, held)
        try:
            while True:
                if isinstance(outcome, CreateStep):
                    # A step computed before this one is recorded first, by its own call.
                    if not carrier.land():
                        self._ends.give_back(held)
                        return
                    self._check(held)
                    try:
                        with step_span(**_step_attributes(outcome)):
                            if self._steps.carries(outcome):
                                # Its record goes with the next call if that suspends or
                                # completes (`troth._carry`), else by its own call.
                                created = [carrier.run(outcome)]
                            else:
                                created = self._steps.write(held, outcome)
                                held.written.extend(created)
                    except AlreadyExistsError as exc:
                        # The step's id is taken by a promise that is not this
                        # workflow's step (the server says whose): no retry helps,
                        # and each would run the step's function again.
                        self._reject(held, exc)
                        return
                    except PauseTask as exc:  # a step's function or the codec: a bug
                        self._pause(held, response, exc.error, exc.where)
                        return
                    outcome = engine.advance(created)
                elif isinstance(outcome, Suspend):
                    # One call registers the callbacks and completes the task,
                    # unless something it waits on settled meanwhile.
                    settled = self._ends.suspend(held, outcome.awaiting, carrier)
                    if settled is None:
                        self._ends.give_back(held)
                        return
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
                    except Exception as exc:  # the codec refused it: a bug, it pauses
                        kind = type(outcome.value).__name__
                        where = f"encoding the workflow's result (a {kind}) with the codec"
                        if carrier.land():
                            self._pause(held, response, exc, where)
                        else:
                            self._ends.give_back(held)
                    else:
                        if not self._ends.complete(held, resolve=value, carrier=carrier):
                            self._ends.give_back(held)
                            return
                        _log.info(
                            "workflow %r returned",
                            held.root_id,
                            extra={"workflow_id": held.root_id},
                        )
                    return
                else:
                    if not carrier.land():
                        self._ends.give_back(held)
                        return
                    self._failed(held, response, outcome)
                    return
        except PauseTask as exc:
            # A carried step's record refused by the server (a result over the size
            # limit, say), also by its own call: a bug, the run pauses (as `write`'s).
            self._pause(held, response, exc.error, exc.where)
        finally:
            try:
                # Left by an error (the codec refused the result, say): a finished
                # step's record still lands, as it would have before the error.
                carrier.land()
            finally:
                if keep:
                    self._cache_put(root.id, engine)
                else:
                    engine.close()

    def _new_engine(
        self,
        held: Held,
        response: tasks_pb2.PollResponse,
        root: Promise,
        history: list[Promise],
    ) -> Engine | None:
        """An engine to replay the workflow of `root` from `history` (no generator of it
        is cached here); None once the task was ended otherwise: a workflow not
        registered here, or arguments that cannot be decoded."""
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
            self._ends.complete(held, reject=error_value(error))
            return None
        try:
            args = self._decode_args(root)
        except PauseTask as exc:
            self._pause(held, response, exc.error, exc.where)
            return None
        except TypeError as exc:  # not a list: the start was not this SDK's
            self._ends.complete(held, reject=error_value(exc))
            return None
        task = response.task
        return Engine(
            workflow.fn,
            args,
            root_id=root.id,
            history=history,
            codec=self._client.codec,
            group=self.group,
            # What the execution before this one saw: `ctx.log` stays silent up to
            # the wait where it suspended.
            resumed_at=(
                datetime_from_proto(task.create_time) if task.HasField("create_time") else None
            ),
        )

    def _decode_args(self, root: Promise) -> list[Any]:
        try:
            args = self._client.decode(root.param)
        except Exception as exc:  # the codec's (a key not deployed?): the run waits
            raise PauseTask(exc, "decoding the workflow's arguments with the codec") from exc
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
        if fails_workflow(error, self._fail_on(response)):
            self._reject(held, error)
            return
        self._pause(held, response, error)

    def _fail_on(self, response: tasks_pb2.PollResponse) -> tuple[type[BaseException], ...]:
        registered = self._registrations().get(response.root.tags.get(TAG_FUNC, ""))
        return registered.fail_on if registered else ()

    def _pause(
        self, held: Held, response: tasks_pb2.PollResponse, error: BaseException, where: str = ""
    ) -> None:
        """A bug: fail the task with it (the server retries it after a backoff; the root
        stays PENDING, nothing more recorded), logged at ERROR with its traceback."""
        named, text, trace = task_failure(error, self._fail_on(response), where)
        log_paused(
            _log,
            named,
            workflow_id=held.root_id,
            task_id=held.task_id,
            attempt=response.task.failed_attempts + 1,
            version=response.task.workflow_version or response.root.workflow_version,
            worker_id=self.worker_id,
            where=where,
        )
        # A lease lost meanwhile: `run` drops the task; whoever holds it now retries.
        self._tasks.fail(held.task_id, held.counter, text, trace)

    def _reject(self, held: Held, error: Exception | Cancelled) -> None:
        _log.info(
            "workflow %r raised %s: %s; rejecting it",
            held.root_id,
            type(error).__name__,
            error,
            extra={"workflow_id": held.root_id},
        )
        self._ends.complete(held, reject=error_value(error))

    def _check(self, held: Held) -> None:
        self._leases.check(held)
        if self._stopping.is_set():
            raise Stopping

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
