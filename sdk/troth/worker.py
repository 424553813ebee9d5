"""`Worker`: runs the workflows of one group, as tasks leased from the server.

A worker registers workflow functions (`@worker.workflow`), opens one `Poll`
stream to the server for its group and runs each task it receives on a
bounded thread pool::

    worker = Worker(client, group="workers")

    @worker.workflow
    def publish(ctx: Context, post_id: str) -> Generator[Any, Any, dict[str, Any]]:
        approval = yield ctx.promise(timeout=timedelta(days=3))
        yield ctx.run(send_email, approval.id)
        return {"post": post_id, "decision": (yield approval)}

    worker.run()  # blocks until SIGINT/SIGTERM; or start() ... stop() to embed

Running a task. The worker builds a `troth._engine.Engine` from the
registered function, the arguments in the root promise's param and the
history the task carries, and does the I/O the engine asks for: it creates
step promises (latent, timer, child workflow), runs `ctx.run` functions under
their `RetryPolicy` and records the result on the step promise (the last
failure rejects it, so the workflow can catch it), and resolves `now()` /
`random()` steps with a fresh draw. When the workflow waits on pending
promises it registers callbacks and completes the task (the workflow is
suspended and costs this worker nothing but, optionally, a place in a small
cache); when it returns or raises, one `CompleteTask` settles the root.

Leases. Every task is leased to this worker; one heartbeat thread extends
all the leases every `lease / 3`, on its own thread, so a step that keeps the
CPU busy does not lose its task. A task whose lease is gone (the server says
`STALE_COUNTER`, the heartbeat no longer lists it, or no heartbeat got
through for a whole lease) is dropped quietly: another worker replays it from
the checkpoints.

Failover. A broken stream does not end the leases by itself: a server that
died (or a replica of several, see `Client`) could not end them. The worker
reopens the stream at once, through the client's channel, which moves to
another replica when the one it used stops answering, and heartbeats at
once; the answer says which tasks are still this worker's (a server that saw
the stream break while it stayed up has given them back to the group).

Stopping. `stop()` lets every running task reach its next step boundary (a
step function already running finishes and its result is recorded), for at
most `shutdown_grace`, then gives every task it still holds back to the group
(`ReleaseTask`) so other workers pick them up at once, and closes the stream.
Threads: one poller (owns the stream), one heartbeater, and the pool; all
are started by `start()` and ended by `stop()`.

Versions. Each workflow is registered with a version of its code (by default
a digest of its source; see `workflow`). The server records on a workflow's
root the version of the worker that first took it, and sends its later tasks
only to workers registering that version, or declaring it `compatible`: a
workflow parked for days never resumes on code it did not start with, and new
starts go to the newest version connected. A task that reaches this worker
with a version it does not run anyway is given back, not run.

Suspended generators. A workflow that suspends may stay in the cache
(`cache_size` workflows, least recently used evicted) so that its resume,
which the server prefers to send to this worker, needs no replay. Evicting
it, or stopping the worker, closes the generator (`Engine.close()`), which
runs the workflow's `finally:` blocks: durable cleanup belongs in a step.
Nothing depends on the cache: any worker of the group can resume any workflow.

Logging goes to `logging.getLogger("troth.worker")`; the SDK configures nothing.
"""

from __future__ import annotations

import collections
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, overload

import grpc

from troth._commands import TAG_FUNC, CreatePromise, Now, Random, RunStep
from troth._convert import payload_to_proto, promise_from_proto, timedelta_to_proto
from troth._engine import CreateStep, Done, Engine, Failed, Suspend, Workflow, error_value
from troth._transport import as_call
from troth._versions import WorkflowRegistration, registration
from troth._worker_steps import Exhausted, Interrupted, Succeeded, run_with_retry
from troth.errors import (
    AlreadyExistsError,
    AlreadySettledError,
    InvalidArgumentError,
    LeaseLostError,
    NonDeterminismError,
    NotFoundError,
    PromiseTimedOutError,
    RegistrationError,
    RpcError,
)
from troth.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2

if TYPE_CHECKING:
    from troth._promise import CreateResult, Promise
    from troth.client import Client
    from troth.codec import Payload

__all__ = ["Worker"]

_log = logging.getLogger("troth.worker")

_W = TypeVar("_W", bound=Callable[..., Any])

_MIN_RECONNECT_BACKOFF = 0.1
_MAX_DROPPED = 1024
_STABLE_STREAM = 10.0  # a stream open this long counts as established: reset the backoff
_TRANSIENT_CODES = frozenset(
    {
        None,  # the server ended the stream (shutting down)
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""Poll failures that may pass by themselves; any other is logged as an ERROR."""


class _TasksStub(Protocol):
    """The typed shape of the generated `troth.v1.Tasks` stub."""

    Poll: grpc.UnaryStreamMultiCallable[tasks_pb2.PollRequest, tasks_pb2.PollResponse]
    CompleteTask: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.CompleteTaskRequest, tasks_pb2.CompleteTaskResponse
    ]
    Heartbeat: grpc.UnaryUnaryMultiCallable[tasks_pb2.HeartbeatRequest, tasks_pb2.HeartbeatResponse]
    ReleaseTask: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.ReleaseTaskRequest, tasks_pb2.ReleaseTaskResponse
    ]
    RegisterCallbacks: grpc.UnaryUnaryMultiCallable[
        tasks_pb2.RegisterCallbacksRequest, tasks_pb2.RegisterCallbacksResponse
    ]


class _Cancellable(Protocol):
    def cancel(self) -> bool: ...


@dataclass(eq=False, slots=True)
class _Held:
    """A task leased to this worker, as this worker knows it."""

    task_id: str
    counter: int
    root_id: str
    expires: float = 0.0
    """The monotonic time its lease surely ends by, unless a heartbeat extends it."""
    lost: bool = False
    """The server moved it on (stale counter, missing from a heartbeat, lease ran out)."""
    abandoned: bool = False
    """Its runner gave up on it but could not release it yet; the heartbeater retries."""


class _Stopping(Exception):
    """The worker is stopping: leave the task for the release sweep."""


class _Lost(Exception):
    """The lease is gone: drop the task."""


class Worker:
    """Runs the workflows registered on it for one group; see the module docstring.

    Args:
        client: The connection to the server (its codec encodes values); a
            client of several replicas' addresses makes the worker fail over.
        group: The group whose tasks this worker runs.
        worker_id: Unique per worker process; default `<host>-<pid>-<random>`.
        concurrency: Most tasks run (and held) at once.
        lease: How long each task stays leased without a heartbeat; a
            frozen worker's tasks move on after about this long.
        cache_size: Suspended workflows kept for a resume without replay (0: none).
        shutdown_grace: How long `stop()` lets running tasks reach a step boundary.
        max_reconnect_backoff: Upper bound, in seconds, of the wait between
            attempts to reopen a broken stream.

    Raises:
        ValueError: An argument is out of range.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        client: Client,
        group: str = "workers",
        *,
        worker_id: str | None = None,
        concurrency: int = 16,
        lease: timedelta = timedelta(seconds=10),
        cache_size: int = 256,
        shutdown_grace: timedelta = timedelta(seconds=30),
        max_reconnect_backoff: float = 5.0,
    ) -> None:
        if not group:
            raise ValueError("group must be a non-empty string, e.g. 'workers'")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if lease < timedelta(seconds=1):
            raise ValueError(f"lease must be at least one second, not {lease}")
        if cache_size < 0:
            raise ValueError(f"cache_size must not be negative, not {cache_size}")
        if max_reconnect_backoff < _MIN_RECONNECT_BACKOFF:
            raise ValueError(f"max_reconnect_backoff must be at least {_MIN_RECONNECT_BACKOFF}s")
        self.client = client
        self.group = group
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.concurrency = concurrency
        self.lease = lease
        self._cache_size = cache_size
        self._grace = shutdown_grace.total_seconds()
        self._max_backoff = max_reconnect_backoff
        self._versions: dict[str, WorkflowRegistration] = {}
        """The registered workflows by name, with their versions."""
        self._transport = client._transport
        stub = tasks_pb2_grpc.TasksStub(self._transport.channel)  # type: ignore[no-untyped-call,unused-ignore]
        self._stub: _TasksStub = stub
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._held: dict[str, _Held] = {}
        self._running = 0  # tasks submitted to the pool and not yet finished
        self._cache: collections.OrderedDict[str, Engine] = collections.OrderedDict()
        self._dropped: collections.OrderedDict[str, _Held] = collections.OrderedDict()
        self._unknown: dict[str, int] = {}
        """Tasks the last heartbeat named that this worker never received, by counter."""
        self._state = "new"
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._heartbeat_stop = threading.Event()
        self._heartbeat_now = threading.Event()  # heartbeat at once (the stream broke)
        self._poll_call: _Cancellable | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._poller: threading.Thread | None = None
        self._heartbeater: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"Worker(group={self.group!r}, worker_id={self.worker_id!r})"

    # -- registry ----------------------------------------------------------

    @overload
    def workflow(self, fn: _W, /) -> _W: ...

    @overload
    def workflow(
        self,
        /,
        *,
        name: str | None = None,
        version: str | None = None,
        compatible: Iterable[str] = (),
    ) -> Callable[[_W], _W]: ...

    def workflow(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        version: str | None = None,
        compatible: Iterable[str] = (),
    ) -> Any:
        """Register a workflow: `@worker.workflow` or `@worker.workflow(name="...", ...)`.

        The name (default: the function's `__name__`) is what `client.start`
        and `ctx.start` name. Returns the function unchanged.

        Args:
            name: The workflow's name (default: the function's `__name__`).
            version: The version of its code (default: a 12-digit digest of
                the function's source, so any edit is a new version). The
                server records it on each workflow this worker starts, and
                resumes that workflow only on a worker running this version.
            compatible: Older versions this code may safely resume (their
                parked workflows replay the same way on it), e.g.
                `compatible=("1f2e3d4c5b6a",)` after an edit that changes no
                step. Declaring one also marks this version as the newer.

        Raises:
            RegistrationError: The name is taken, empty, or `fn` is a plain
                function without `yield` (a workflow must be a generator);
                or a version is empty or too long (at most 128 characters).

        .. versionchanged:: 0.2.0
           `version` and `compatible`.
        """
        declared = tuple(compatible) if not isinstance(compatible, str) else compatible

        def register(function: _W) -> _W:
            self._register(function, name, version, declared)
            return function

        return register if fn is None else register(fn)

    def _register(
        self,
        fn: Callable[..., Any],
        name: str | None,
        version: str | None = None,
        compatible: Iterable[str] = (),
    ) -> None:
        if not callable(fn):
            raise RegistrationError(str(name), f"workflow {fn!r} is not callable")
        key = name if name is not None else str(getattr(fn, "__name__", ""))
        if not key:
            raise RegistrationError(
                key, f"workflow {fn!r} has no name; register it with @worker.workflow(name=...)"
            )
        if inspect.isfunction(fn) and not inspect.isgeneratorfunction(fn):
            raise RegistrationError(
                key,
                f"workflow {key!r} is a plain function, not a generator: a workflow must "
                "`yield` its steps (write `result = yield ctx.run(fn, ...)`)",
            )
        registered = registration(key, fn, version, compatible)
        with self._lock:
            existing = self._versions.get(key)
            if existing is not None and existing.fn is not fn:
                raise RegistrationError(
                    key,
                    f"a workflow named {key!r} is already registered on this worker "
                    f"({_describe(existing.fn)}); register {_describe(fn)} under another "
                    "name with @worker.workflow(name=...)",
                )
            self._versions[key] = registered

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        """The registered workflows by name (a copy)."""
        with self._lock:
            return {name: registered.fn for name, registered in self._versions.items()}

    @property
    def registrations(self) -> Mapping[str, WorkflowRegistration]:
        """The registered workflows by name, each with its version and the older
        versions it declared compatible (a copy).

        .. versionadded:: 0.2.0
        """
        with self._lock:
            return dict(self._versions)

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        """Connect to the group and start running tasks, on background threads.

        Returns at once; call `stop()` to end. A worker starts once.

        Raises:
            RuntimeError: It was already started.
        """
        with self._lock:
            if self._state != "new":
                raise RuntimeError(f"{self!r} was already started; a Worker starts once")
            self._state = "running"
        self._pool = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix=f"troth-worker-{self.group}"
        )
        self._poller = threading.Thread(
            target=self._poll_loop, name=f"troth-poller-{self.group}", daemon=True
        )
        self._heartbeater = threading.Thread(
            target=self._heartbeat_loop, name=f"troth-heartbeat-{self.group}", daemon=True
        )
        self._poller.start()
        self._heartbeater.start()
        _log.info(
            "worker %s polling group %r (%d at once, workflows: %s)",
            self.worker_id,
            self.group,
            self.concurrency,
            ", ".join(_describe_version(r) for _, r in sorted(self.registrations.items()))
            or "none",
            extra={"worker_id": self.worker_id, "group": self.group},
        )

    def stop(self, grace: float | None = None) -> None:
        """Stop gracefully: finish current steps, give held tasks back, close the stream.

        Running tasks stop at their next step boundary (a step function
        already running completes and its result is recorded), for at most
        `grace` seconds (default `shutdown_grace`). Then every task still held
        is released to the group at once. Safe to call more than once, from
        any thread; returns when the worker has stopped.
        """
        with self._lock:
            state = self._state
            if state == "new":
                self._state = "stopped"
                self._stopped.set()
                return
            if state == "running":
                self._state = "stopping"
        if state != "running":
            self._stopped.wait()
            return
        self._stopping.set()
        deadline = time.monotonic() + (self._grace if grace is None else grace)
        with self._idle:
            while self._running and (remaining := deadline - time.monotonic()) > 0:
                self._idle.wait(remaining)
            busy = self._running
            held = list(self._held.values())
        if busy:
            _log.warning(
                "worker %s stopping with %d task(s) still inside a step; releasing them anyway",
                self.worker_id,
                busy,
                extra={"worker_id": self.worker_id},
            )
        for task in held:
            if not task.lost:
                self._release(task)
        with self._lock:
            call, self._poll_call = self._poll_call, None
        if call is not None:
            call.cancel()
        if self._poller is not None:
            self._poller.join()
        self._heartbeat_stop.set()
        self._heartbeat_now.set()
        if self._heartbeater is not None:
            self._heartbeater.join()
        if self._pool is not None:
            self._pool.shutdown(wait=not busy, cancel_futures=True)
        with self._lock:
            engines = list(self._cache.values())
            self._cache.clear()
            self._state = "stopped"
        for engine in engines:
            engine.close()
        self._stopped.set()
        _log.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    def run(self) -> None:
        """Start, and block until stopped: by `stop()` from another thread, or by SIGINT/SIGTERM.

        In the main thread, SIGINT and SIGTERM stop the worker gracefully (a
        second signal acts as usual); elsewhere, signals are left alone.
        """
        previous: dict[signal.Signals, Any] = {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            _log.info("worker %s got %s; stopping", self.worker_id, signal.Signals(signum).name)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stopping.set()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, on_signal)
        try:
            self.start()
            while not self._stopping.wait(1.0):
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the stream --------------------------------------------------------

    def _poll_request(self) -> tasks_pb2.PollRequest:
        return tasks_pb2.PollRequest(
            group=self.group,
            worker_id=self.worker_id,
            capacity=self.concurrency,
            lease=timedelta_to_proto(self.lease),
            # Each workflow's own version first: the one recorded on what it starts.
            workflows=[
                tasks_pb2.WorkflowVersion(name=name, version=version)
                for registered in self.registrations.values()
                for name, version in registered.listed()
            ],
        )

    def _poll_loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            call = self._stub.Poll(self._poll_request(), metadata=self._transport.metadata)
            with self._lock:
                if self._stopping.is_set():
                    call.cancel()
                    return
                self._poll_call = call
            opened = time.monotonic()
            received = False
            why = "the server ended the stream"
            code: grpc.StatusCode | None = None
            try:
                for response in call:
                    if not received:
                        received, failures = True, 0
                    self._accept(response)
            except grpc.RpcError as exc:
                rpc = as_call(exc)
                code = rpc.code() if rpc is not None else None
                why = f"{rpc.code().name}: {rpc.details()}" if rpc is not None else f"{exc!r}"
            except Exception:
                _log.exception("worker %s: error reading the task stream", self.worker_id)
                why = "an error in the worker"
                call.cancel()
            finally:
                with self._lock:
                    if self._poll_call is call:
                        self._poll_call = None
            if self._stopping.is_set():
                return
            # Leases outlive the stream: a server that died could not end them
            # (and its replicas still honour them); one that stayed up gave the
            # tasks back to the group. A heartbeat now, through whichever
            # server answers, tells which it is, for each task we hold.
            self._heartbeat_now.set()
            if received or time.monotonic() - opened > _STABLE_STREAM:
                failures = 0
            failures += 1
            delay = min(self._max_backoff, _MIN_RECONNECT_BACKOFF * 2 ** (failures - 1))
            delay *= random.uniform(0.5, 1.0)
            # A refusal (bad group, capacity or lease; no permission) will not
            # go away by itself: say so loudly, but keep trying, slowly.
            refused = code not in _TRANSIENT_CODES
            _log.log(
                logging.ERROR if refused else logging.WARNING,
                "worker %s %s its task stream (%s); reconnecting in %.1fs",
                self.worker_id,
                "was refused" if refused else "lost",
                why,
                delay,
                extra={"worker_id": self.worker_id, "group": self.group},
            )
            self._stopping.wait(delay)

    def _accept(self, response: tasks_pb2.PollResponse) -> None:
        task = response.task
        expires = time.monotonic() + self.lease.total_seconds()
        held = _Held(task.id, task.counter, task.root_promise_id, expires)
        with self._lock:
            self._held[task.id] = held
            if self._stopping.is_set():
                return  # released by stop()
            self._running += 1
        pool = self._pool
        assert pool is not None, "worker bug: stream open without a pool"
        try:
            pool.submit(self._run, held, response)
        except RuntimeError:  # the pool is shutting down
            self._finished_running()

    # -- heartbeats --------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        seconds = self.lease.total_seconds()
        interval = seconds / 3
        lease = timedelta_to_proto(self.lease)
        while True:
            self._heartbeat_now.wait(interval)
            self._heartbeat_now.clear()
            if self._heartbeat_stop.is_set():
                return
            with self._lock:
                before = dict(self._held)
                idle = not before and not self._dropped
            if idle:
                continue
            request = tasks_pb2.HeartbeatRequest(worker_id=self.worker_id, lease=lease)
            sent = time.monotonic()
            try:
                response = self._transport.call(
                    self._stub.Heartbeat, request, timeout=interval, idempotent=True
                )
            except RpcError as exc:
                _log.warning(
                    "worker %s: heartbeat failed (%s); leases expire in %s unless one succeeds",
                    self.worker_id,
                    exc,
                    self.lease,
                    extra={"worker_id": self.worker_id},
                )
                self._expire(time.monotonic())
                continue
            still = set(response.task_ids)
            with self._lock:
                for task_id, held in before.items():
                    if task_id in still:
                        held.expires = sent + seconds
                        continue
                    held.lost = True
                    if self._held.get(task_id) is held:
                        del self._held[task_id]
                abandoned = [h for h in self._held.values() if h.abandoned]
                # Tasks we dropped (their leases ran out unheard, or a release
                # failed) that the server still counts as ours: give them
                # back, or they would wait for as long as this worker heartbeats.
                stale = [
                    self._dropped.pop(task_id)
                    for task_id in still
                    if task_id not in self._held and task_id in self._dropped
                ]
                # Tasks leased to us that we never received: a replica claimed
                # them for our stream and died before delivering them. Named by
                # two heartbeats in a row at one counter, they are not merely in
                # flight on the stream: give them back, or our heartbeats would
                # keep them leased for as long as we hold anything else.
                unknown = {
                    task_id: response.counters.get(task_id, 0)
                    for task_id in still
                    if task_id not in self._held and task_id not in self._dropped
                }
                orphans = [
                    _Held(task_id, counter, root_id="")
                    for task_id, counter in unknown.items()
                    if self._unknown.get(task_id) == counter
                ]
                self._unknown = {
                    task_id: counter
                    for task_id, counter in unknown.items()
                    if self._unknown.get(task_id) != counter
                }
            for held in [*abandoned, *stale, *orphans]:
                self._release(held)

    def _expire(self, now: float) -> None:
        """Drop the tasks whose leases ran out with no heartbeat getting through."""
        with self._lock:
            expired = [held for held in self._held.values() if held.expires <= now]
            for held in expired:
                held.lost = True
                del self._held[held.task_id]
                # If the server still counts it as ours when heartbeats get
                # through again, the heartbeater gives it back.
                self._dropped[held.task_id] = held
                while len(self._dropped) > _MAX_DROPPED:
                    self._dropped.popitem(last=False)
        if expired:
            _log.warning(
                "worker %s: no heartbeat got through for %s; dropping %d task(s) whose "
                "leases ran out",
                self.worker_id,
                self.lease,
                len(expired),
                extra={"worker_id": self.worker_id},
            )

    # -- running a task ----------------------------------------------------

    def _finished_running(self) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def _forget(self, held: _Held) -> None:
        with self._lock:
            if self._held.get(held.task_id) is held:
                del self._held[held.task_id]

    def _run(self, held: _Held, response: tasks_pb2.PollResponse) -> None:
        try:
            if self._stopping.is_set():
                return  # left for the release sweep
            if held.lost:
                return
            self._execute(held, response)
            self._forget(held)
        except (_Lost, LeaseLostError) as exc:
            _log.info(
                "worker %s lost its lease on task %s of workflow %r; dropping it (%s)",
                self.worker_id,
                held.task_id,
                held.root_id,
                "the lease moved on" if isinstance(exc, _Lost) else exc,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._forget(held)
        except _Stopping:
            pass  # left for the release sweep
        except Exception:
            _log.exception(
                "worker %s failed running task %s of workflow %r; giving it back",
                self.worker_id,
                held.task_id,
                held.root_id,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._release(held)
        finally:
            self._finished_running()

    def _foreign_version(self, response: tasks_pb2.PollResponse) -> str | None:
        """Why this worker must not run the task: the workflow was started with code
        of a version it neither runs nor declared compatible (None: it may run it)."""
        version = response.task.workflow_version or response.root.workflow_version
        name = response.root.tags.get(TAG_FUNC, "")
        with self._lock:
            registered = self._versions.get(name)
        if not version or registered is None or registered.runs(version):
            return None
        return (
            f"workflow {response.root.id!r} ({name!r}) was started with version {version!r}; "
            f"this worker runs {_describe_version(registered)}"
        )

    def _execute(self, held: _Held, response: tasks_pb2.PollResponse) -> None:
        foreign = self._foreign_version(response)
        if foreign is not None:
            # Replaying it on other code could take other branches on its history.
            _log.warning(
                "worker %s: %s; giving task %s back for a worker with that code",
                self.worker_id,
                foreign,
                held.task_id,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            self._release(held)
            return
        root = promise_from_proto(response.root)
        history = [root, *(promise_from_proto(p) for p in response.history)]
        engine = self._cache_take(root.id)
        if engine is not None:
            outcome = engine.advance(history)
        else:
            name = root.tags.get(TAG_FUNC, "")
            workflow = self.workflows.get(name)
            if workflow is None:
                known = ", ".join(sorted(self.workflows)) or "none"
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
                workflow,
                args,
                root_id=root.id,
                history=history,
                codec=self.client.codec,
                group=self.group,
            )
            outcome = engine.advance()
        keep = False
        try:
            while True:
                if isinstance(outcome, CreateStep):
                    self._check(held)
                    try:
                        created = self._step(outcome, held)
                    except AlreadyExistsError as exc:
                        # The step's id is taken by a promise that is not this
                        # workflow's step (the server says whose): no retry helps.
                        self._failed(held, Failed(exc))
                        return
                    outcome = engine.advance(created)
                elif isinstance(outcome, Suspend):
                    # One call registers the callbacks and completes the task,
                    # unless something it waits on settled meanwhile.
                    settled = self._suspend(held, outcome.awaiting)
                    if settled:
                        outcome = engine.advance(settled)
                        continue
                    keep = True
                    return
                elif isinstance(outcome, Done):
                    try:
                        value = self.client.encode(outcome.value)
                    except (TypeError, ValueError) as exc:
                        self._complete(held, reject=error_value(exc))
                    else:
                        self._complete(held, resolve=value)
                    return
                else:
                    self._failed(held, outcome)
                    return
        finally:
            if keep:
                self._cache_put(root.id, engine)
            else:
                engine.close()

    def _decode_args(self, root: Promise) -> list[Any]:
        args = self.client.decode(root.param)
        if args is None:
            return []
        if not isinstance(args, list):
            raise TypeError(
                f"workflow {root.id!r} has param {args!r}, not a list of arguments; "
                "start workflows with client.start(name, *args, id=...)"
            )
        return args

    def _failed(self, held: _Held, outcome: Failed) -> None:
        error = outcome.error
        if isinstance(error, NonDeterminismError):
            _log.error("workflow %r: %s", held.root_id, error, extra={"workflow_id": held.root_id})
        else:
            _log.info(
                "workflow %r raised %s: %s",
                held.root_id,
                type(error).__name__,
                error,
                extra={"workflow_id": held.root_id},
            )
        self._complete(held, reject=error_value(error))

    def _check(self, held: _Held) -> None:
        if held.lost:
            raise _Lost
        if self._stopping.is_set():
            raise _Stopping

    def _wait(self, seconds: float) -> bool:
        return not self._stopping.wait(seconds)

    # -- step I/O ----------------------------------------------------------

    def _step(self, step: CreateStep, held: _Held) -> list[Promise]:
        command = step.command
        if not isinstance(command, RunStep | Now | Random):
            if step.exists:
                return [self.client.get(step.step_id)]
            return [self._create(step, held).promise]
        # A step that computes its value records it with its creation, in one call.
        # Dying before that call means the step runs again: at-least-once
        # execution, exactly-once recording (the first record wins).
        value: Any
        if isinstance(command, Now | Random):
            ok, value = True, command.draw()
        else:
            result = run_with_retry(
                command.fn, command.args, command.retry, wait=self._wait, step_id=step.step_id
            )
            if isinstance(result, Interrupted):
                raise _Stopping
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
        if step.exists:  # created pending by an older worker: settle it
            return [self._settle(step.step_id, held, ok, value)]
        return [self._record(step, held, ok, value)]

    def _fence(self, held: _Held) -> types_pb2.TaskFence:
        return types_pb2.TaskFence(
            task_id=held.task_id, counter=held.counter, worker_id=self.worker_id
        )

    def _create(
        self, step: CreateStep, held: _Held, *, ok: bool | None = None, value: Any = None
    ) -> CreateResult:
        encoded = None if ok is None else self.client.encode(value)
        command = step.command
        decision = command if isinstance(command, CreatePromise) else None
        return self.client._create_raw(
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
            fence=self._fence(held),
        )

    def _record(self, step: CreateStep, held: _Held, ok: bool, value: Any) -> Promise:
        """Create the step's promise already settled with its result."""
        try:
            return self._create(step, held, ok=ok, value=value).promise
        except (TypeError, ValueError, InvalidArgumentError) as exc:
            if not ok:
                raise
            # The result cannot be recorded (not encodable, over the size limit).
            _log.info("step %r: its result cannot be recorded: %s", step.step_id, exc)
            return self._create(step, held, ok=False, value=error_value(exc)).promise

    def _settle(self, step_id: str, held: _Held, ok: bool, value: Any) -> Promise:
        """Record a step's result; a step someone else settled first keeps their result."""
        fence = self._fence(held)
        try:
            if ok:
                try:
                    return self.client.resolve(step_id, value, _fence=fence).promise
                except (TypeError, ValueError, InvalidArgumentError) as exc:
                    # The result cannot be recorded (not encodable, over the size limit).
                    _log.info("step %r: its result cannot be recorded: %s", step_id, exc)
                    return self.client.reject(step_id, error_value(exc), _fence=fence).promise
            return self.client.reject(step_id, value, _fence=fence).promise
        except (AlreadySettledError, PromiseTimedOutError):
            return self.client.get(step_id)

    # -- task calls --------------------------------------------------------

    def _call_timeout(self) -> float:
        return self.client._timeout

    def _suspend(self, held: _Held, awaiting: Iterable[str]) -> list[Promise]:
        """Suspend the task on `awaiting`; returns those already settled (then the
        task is still ours and the workflow goes on), or [] once suspended."""
        request = tasks_pb2.CompleteTaskRequest(
            task_id=held.task_id,
            counter=held.counter,
            worker_id=self.worker_id,
            suspend_on=list(awaiting),
        )
        response = self._transport.call(
            self._stub.CompleteTask, request, timeout=self._call_timeout()
        )
        return [promise_from_proto(p) for p in response.settled]

    def _complete(self, held: _Held, *, resolve: Payload | None = None, reject: Any = None) -> None:
        request = tasks_pb2.CompleteTaskRequest(
            task_id=held.task_id, counter=held.counter, worker_id=self.worker_id
        )
        if resolve is not None:
            request.resolve_root.CopyFrom(payload_to_proto(resolve))
        elif reject is not None:
            request.reject_root.CopyFrom(payload_to_proto(self.client.encode(reject)))
        try:
            self._transport.call(self._stub.CompleteTask, request, timeout=self._call_timeout())
        except (AlreadySettledError, PromiseTimedOutError) as exc:
            # The root was settled meanwhile (cancelled, timed out): that stands.
            _log.info(
                "workflow %r finished, but its root was already settled (%s)",
                held.root_id,
                exc,
                extra={"workflow_id": held.root_id},
            )
            request.ClearField("root_result")
            self._transport.call(self._stub.CompleteTask, request, timeout=self._call_timeout())

    def _release(self, held: _Held) -> None:
        request = tasks_pb2.ReleaseTaskRequest(
            task_id=held.task_id, counter=held.counter, worker_id=self.worker_id
        )
        try:
            self._transport.call(self._stub.ReleaseTask, request, timeout=self._call_timeout())
        except (LeaseLostError, NotFoundError):
            pass  # it had moved on already
        except RpcError as exc:
            _log.warning(
                "worker %s could not release task %s (%s); retrying with the next heartbeat",
                self.worker_id,
                held.task_id,
                exc,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            held.abandoned = True
            with self._lock:
                if self._held.get(held.task_id) is not held:
                    self._dropped[held.task_id] = held  # retried when a heartbeat names it
            return
        held.lost = True
        self._forget(held)

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


def _describe_version(registered: WorkflowRegistration) -> str:
    text = f"{registered.name} version {registered.version}"
    if registered.compatible:
        text += f" (compatible with {', '.join(registered.compatible)})"
    return text


def _describe(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return f"{module}.{name}" if module else str(name)
