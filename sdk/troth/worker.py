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

Layout. This module is the registration API, the lifecycle and the poll loop;
`troth._versions.Registry` keeps the registered workflows, `troth._leases`
holds the leases (fencing, heartbeats), `troth._runner` runs each task (its
step I/O in `troth._step_writes`), `troth._tasks` makes the `TaskService`
calls (see ARCHITECTURE.md).

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

Leases. Every task is leased to this worker, until the `lease_expire_time`
the server sent with it; one heartbeat thread extends all the leases every
`lease / 3`, on its own thread, so a step that keeps the CPU busy does not
lose its task. A delivery whose lease ran out before it was read is dropped
unrun; a step function starts only on a lease the server confirmed recently;
one root never runs twice at once here. A task whose lease is gone (the
server says `STALE_COUNTER`, the heartbeat no longer lists it, or no
heartbeat got through for a whole lease) is dropped quietly: another worker
replays it from the checkpoints. A task inside a step function, or holding a
result not recorded yet, is not dropped for want of heartbeats: it is kept
until the server says it moved on, and the result is recorded, retried
through an outage of any length (no per-call timeout ends it), even if the
lease was lost: a server outage alone never runs a step function twice.

Failover. A broken stream does not end the leases by itself: a server that
died (or a replica of several, see `Client`) could not end them. The worker
reopens the stream at once, through the client's channel, which moves to
another replica when the one it used stops answering, and heartbeats at
once; the answer says which tasks are still this worker's (a server that saw
the stream break while it stayed up has given them back to the group).

Credentials. Every stream opens, and every call goes, with the client's current
token (`Client(token=callable)` or `token_file=`). A stream the server ends
refusing the credential (`UNAUTHENTICATED`: revoked, expired; `PERMISSION_DENIED`:
a narrowed grant) reopens at once if the client's token source now gives another
token, and the leases go on, heartbeated with it; with the same token it is a
refusal like any other: logged as an ERROR, and tried again slowly (a token
renewed later is picked up by the next try). A credential that will never work
(none sent; a fixed token refused; a source's token unknown before the worker
ever connected: `troth._poll_health`) stops the polling instead, with one ERROR
line saying what to do; `run()` raises it (`failure`), and `troth worker` exits 1.
After a stream is lost, the worker logs at INFO when one is taken again, and
after how long.

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

Logging goes to `logging.getLogger("troth.worker")`. `start()` and `stop()`
configure nothing; `run()`, which owns the process, sends troth's INFO lines
to stderr when the program configured no logging (`troth._foreground`).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

import grpc

from troth._calls import Connection
from troth._convert import timedelta_to_proto
from troth._foreground import Interrupts, exit_now, show_logs
from troth._leases import Held, Leases
from troth._poll_health import PollHealth
from troth._runner import Runner, describe_version
from troth._tasks import PollCall, TaskCalls, poll_taken
from troth._transport import as_call, overload_delay
from troth._versions import Registry, WorkflowRegistration
from troth.client import connection
from troth.v1 import tasks_pb2

if TYPE_CHECKING:
    from troth._engine import Workflow
    from troth.client import Client
    from troth.errors import RpcError

__all__ = ["Worker"]

_log = logging.getLogger("troth.worker")

_W = TypeVar("_W", bound=Callable[..., Any])

_MIN_RECONNECT_BACKOFF = 0.1
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


class Worker:
    """Runs the workflows registered on it for one group; see the module docstring.

    Args:
        client: The connection to the server (its codec encodes values); a
            client of several replicas' addresses makes the worker fail over.
            The worker makes every call through it, so the client's `tls`,
            `token` and `principal` cover the Poll stream, heartbeats and
            step writes alike: `Worker(Client(addr, tls=..., token=...))`.
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
        self._grace = shutdown_grace.total_seconds()
        self._max_backoff = max_reconnect_backoff
        self._registry = Registry()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = 0  # tasks submitted to the pool and not yet finished
        self._state = "new"
        self._stopping = threading.Event()
        self._abandon = threading.Event()  # stop() waited long enough: give up on running tasks
        self._stopped = threading.Event()
        shared = connection(client)
        # The worker's unary calls (steps, completions, heartbeats) are messages on
        # one stream: a fraction of a call's cost to the server (`troth._mux`).
        calls = Connection(shared.transport.multiplexed(), shared.timeout)
        self._calls = calls
        self._tasks = TaskCalls(calls, self.worker_id, group)
        self._leases = Leases(self._tasks, lease)
        self._runner = Runner(
            client,
            calls,
            self._tasks,
            self._leases,
            lambda: self.registrations,
            group=group,
            cache_size=cache_size,
            stopping=self._stopping,
            abandon=self._abandon,
        )
        self._poll_call: PollCall | None = None
        self._health = PollHealth(self.worker_id, group)
        self.failure: RpcError | None = None
        """What stopped the worker's polling for good (a credential refused that will
        never work: see `troth._poll_health`), which `run()` raises; None while it polls."""
        self._hurry: Callable[[], bool] = lambda: False
        """True once `stop()` must not wait for running steps (`run`: a second signal)."""
        self._pool: ThreadPoolExecutor | None = None
        self._poller: threading.Thread | None = None

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
        fail_on: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> Callable[[_W], _W]: ...

    def workflow(
        self,
        fn: Any = None,
        /,
        *,
        name: str | None = None,
        version: str | None = None,
        compatible: Iterable[str] = (),
        fail_on: type[BaseException] | tuple[type[BaseException], ...] = (),
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
            fail_on: Exception types that fail the workflow when they leave its
                code: its root is rejected with the exception's type and message.
                Any other unexpected exception (a bug: `NameError`, `KeyError`...)
                fails only the task: it is logged at ERROR with its traceback,
                recorded on the task (`troth tasks list`, `troth workflows show`)
                and retried with backoff while the root stays PENDING, so that
                fixed code resumes it from its checkpoints. `troth.WorkflowFailed`,
                and troth's outcomes the workflow did not catch (a rejection, a
                timeout, `Cancelled`), always fail it.

        Raises:
            RegistrationError: The name is taken, empty, or `fn` is a plain
                function without `yield` (a workflow must be a generator);
                or a version is empty or too long (at most 128 characters).

        .. versionchanged:: 0.2.0
           `version`, `compatible` and `fail_on`.
        """
        declared = tuple(compatible) if not isinstance(compatible, str) else compatible

        def register(function: _W) -> _W:
            self._registry.add(function, name, version, declared, fail_on)
            return function

        return register if fn is None else register(fn)

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        """The registered workflows by name (a copy)."""
        return {name: registered.fn for name, registered in self._registry.copy().items()}

    @property
    def registrations(self) -> Mapping[str, WorkflowRegistration]:
        """The registered workflows by name, each with its version and the older
        versions it declared compatible (a copy).

        .. versionadded:: 0.2.0
        """
        return self._registry.copy()

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
        self._leases.start(f"troth-heartbeat-{self.group}")
        self._poller.start()
        _log.info(
            "worker %s polling group %r (%d at once, workflows: %s)",
            self.worker_id,
            self.group,
            self.concurrency,
            ", ".join(describe_version(r) for _, r in sorted(self.registrations.items())) or "none",
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
            # In slices: a second Ctrl-C (`run`) ends the wait without notifying.
            while (
                self._running
                and not self._hurry()
                and (remaining := deadline - time.monotonic()) > 0
            ):
                self._idle.wait(min(remaining, 0.1))
            busy = self._running
        self._abandon.set()
        # The stream first: a task released while it is open could be delivered
        # to it again, after the list below was taken, and stay leased to us.
        with self._lock:
            call, self._poll_call = self._poll_call, None
        if call is not None:
            call.cancel()
        if self._poller is not None:
            self._poller.join()
        held = self._leases.held()
        if busy:
            _log.warning(
                "worker %s stopping with %d task(s) still inside a step; releasing them anyway",
                self.worker_id,
                busy,
                extra={"worker_id": self.worker_id},
            )
        for task in held:
            if not task.lost:
                self._leases.release(task)
        self._leases.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=not busy, cancel_futures=True)
        self._runner.close()
        self._calls.transport.close_calls()
        with self._lock:
            self._state = "stopped"
        self._stopped.set()
        _log.info("worker %s stopped", self.worker_id, extra={"worker_id": self.worker_id})

    def run(self) -> None:
        """Start, and block until stopped: by `stop()` from another thread, or by SIGINT/SIGTERM.

        In the main thread, the first SIGINT (Ctrl-C) or SIGTERM stops the worker
        gracefully and logs what it waits for (the running tasks, for at most
        `shutdown_grace`); a second one stops at once: the held tasks are given
        back without waiting for their steps, and if a step function is still
        running the process exits with status 130 (`troth._foreground`).
        Elsewhere, signals are left alone. When the program has configured no
        logging, troth's INFO lines go to stderr (`show_logs`).
        """
        show_logs()
        with Interrupts(self.worker_id) as interrupts:
            self._hurry = lambda: interrupts.now
            interrupts.watch()
            try:
                self.start()
                while (
                    not interrupts.count and self.failure is None and not self._stopping.wait(0.1)
                ):
                    pass
                if interrupts.count:
                    interrupts.say_stopping([h.root_id for h in self._leases.held()], self._grace)
            finally:
                self.stop()
        with self._lock:
            busy = self._running
        if interrupts.now and busy:
            exit_now()  # a step function is still running on a pool thread: do not wait for it
        if self.failure is not None:
            raise self.failure

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
        renewing = False  # the last stream was reopened at once with a new token
        while not self._stopping.is_set():
            call, sent = self._tasks.poll(self._poll_request())
            with self._lock:
                if self._stopping.is_set():
                    call.cancel()
                    return
                self._poll_call = call
            opened = time.monotonic()
            received = False
            why = "the server ended the stream"
            code: grpc.StatusCode | None = None
            asked: float | None = None  # the server's RetryInfo delay, when it refused
            renewed = False  # refused with an old token; the client has a new one
            try:
                if poll_taken(call):
                    self._health.taken()
                for response in call:
                    if not received:
                        received, failures = True, 0
                        self._health.taken()
                    self._accept(response)
                    for more in response.more:  # delivered in the same message
                        self._accept(more)
            except grpc.RpcError as exc:
                rpc = as_call(exc)
                code = rpc.code() if rpc is not None else None
                why = f"{rpc.code().name}: {rpc.details()}" if rpc is not None else f"{exc!r}"
                asked = overload_delay(rpc) if rpc is not None else None
                renewed = self._calls.transport.renewed(exc, sent, stream=True)
                if not renewed:  # refused for good: one ERROR line, and `run()` raises it
                    self.failure = self._health.refused_for_good(exc, self._calls.transport)
                    if self.failure is not None:
                        return
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
            self._health.lost()
            # Leases outlive the stream: a server that died could not end them
            # (and its replicas still honour them); one that stayed up gave the
            # tasks back to the group. A heartbeat now, through whichever
            # server answers, tells which it is, for each task we hold.
            self._leases.wake()
            if received or time.monotonic() - opened > _STABLE_STREAM:
                failures, renewing = 0, False
            if renewed and not renewing:  # (a source giving a new token each time waits)
                renewing = True
                _log.info(
                    "worker %s: the server ended its task stream refusing its token (%s); "
                    "reconnecting with the client's new token",
                    self.worker_id,
                    why,
                    extra={"worker_id": self.worker_id, "group": self.group},
                )
                continue
            failures += 1
            delay = min(self._max_backoff, _MIN_RECONNECT_BACKOFF * 2 ** (failures - 1))
            delay *= random.uniform(0.5, 1.0)
            if asked:  # the server is at its stream limit: never sooner than it asked
                delay = max(delay, asked * random.uniform(1.0, 1.5))
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
        held = self._leases.accept(response.task)
        if held is None:
            return  # stale on arrival: the server has moved it on
        with self._lock:
            if self._stopping.is_set():
                self._leases.finished(held)
                return  # released by stop()
            self._running += 1
        pool = self._pool
        assert pool is not None, "worker bug: stream open without a pool"
        try:
            pool.submit(self._run, held, response)
        except RuntimeError:  # the pool is shutting down
            self._leases.finished(held)
            self._finished_running()

    def _run(self, held: Held, response: tasks_pb2.PollResponse) -> None:
        try:
            self._runner.run(held, response)
        finally:
            self._finished_running()

    def _finished_running(self) -> None:
        with self._idle:
            self._running -= 1
            self._idle.notify_all()
