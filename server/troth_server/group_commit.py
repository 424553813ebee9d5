"""Group commit: concurrent write requests share one transaction and one fsync.

Requests queue their operation and wait. One writer thread takes everything
queued (up to a cap), loads every row the batch touches with one statement,
applies the operations in arrival order on that in-memory view (so two settles
of the same promise in one batch still see each other), writes the changes
with one statement per kind, commits, and only then answers every request:
a reply always means committed. No timer delays a lone request; batches grow
by themselves while the previous commit is syncing.

Threads hand over one request at a time and block on a lock; an event loop
hands over every request of one loop iteration as one group and is answered
with one callback per batch.

Requests from an event loop (the RPCs) are refused with `Overloaded` once
`max_queued` writes wait for the writer: a queue that long already takes
several commits to drain, and a reply that comes seconds later helps nobody.
The server's own writes (sweeps, claims, lease expiry: `submit`) are never
refused.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import structlog

from troth.errors import Reason
from troth_server.clock import transaction_clock
from troth_server.domain import promise as domain
from troth_server.domain import steps
from troth_server.domain import task as tasks
from troth_server.domain.errors import DomainError, Overloaded
from troth_server.domain.routing import ANY, Route, workflow_name
from troth_server.domain.steps import INVOKE_TAG as INVOKE_TAG
from troth_server.domain.task import Callback, Task, TaskKind, TaskState
from troth_server.store import Store, StoreError, StoreUnavailable, WriteTx

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping

    from troth_server.domain.promise import Promise, PromiseState

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

log = structlog.get_logger("troth.commit")


class ShuttingDown(DomainError):
    reason = Reason.SHUTTING_DOWN

    def __init__(self) -> None:
        super().__init__("the server is shutting down; retry against another server or later")


@dataclass(frozen=True, slots=True)
class StateChange:
    promise: Promise
    old_state: PromiseState | None
    principal: str | None


@dataclass(frozen=True, slots=True)
class Keys:
    """What one op needs loaded before it applies."""

    promises: Collection[str] = ()
    roots: Collection[str] = ()
    """Roots whose active (PENDING or CLAIMED) task the op reads."""
    task_ids: Collection[str] = ()
    """Tasks to load by id (with one query for the whole batch), and their roots."""
    tasks: Collection[Task] = ()
    """Tasks the op already read inside this transaction (e.g. a claim's candidates)."""
    unlocked: Collection[Task] = ()
    """Tasks the op read without a lock, to be locked and re-read after the promises."""
    steps_of: Collection[str] = ()
    """Workflow roots the op may settle: their PENDING steps are loaded (and locked,
    after the roots) so that the settle ends them in the same transaction."""
    steps_of_task_roots: bool = False
    """The same for the roots of `task_ids` (a completion settles its root)."""


@dataclass(frozen=True, slots=True)
class Lessee:
    """A connected worker's stream that can take a task now (`Lessor.reserve`)."""

    stream: object
    """The lessor's own handle of the stream, given back in `Leased`."""
    worker_id: str
    lease_ms: int
    principal: str | None
    route: Route


@dataclass(frozen=True, slots=True)
class Leased:
    """A task created and leased in one transaction: what its delivery needs."""

    task: Task
    lessee: Lessee
    root: Promise | None
    new_root: bool
    """The root was created in the same transaction: it has no steps yet (no history
    to read before the delivery)."""


class Lessor(Protocol):
    """Leases tasks as the transaction that creates them commits (claim on commit), so
    that a delivery costs no second write: the dispatcher, which knows the streams."""

    def reserve(self, task: Task, freed: Collection[str]) -> Lessee | None:
        """A stream of this server to lease the new PENDING `task` to, its slot held
        until `leased` or `unreserve`; None: leave the task PENDING. `freed`: tasks
        this transaction completes (their slots are free once it commits)."""

    def leased(self, leases: list[Leased]) -> None:
        """After the commit: deliver these."""

    def unreserve(self, lessees: list[tuple[Lessee, str]]) -> None:
        """The transaction did not commit (or was retried): free these slots
        (stream, task id)."""


class Batch:
    """What one batch touches, as a reader at the batch's `now` sees it.

    Promises, tasks and callbacks live in one working set, so that a settle
    turns the callbacks on that promise into RESUME tasks in the same
    transaction, and two requests of one batch see each other's changes.
    """

    def __init__(
        self,
        loaded: dict[str, Promise],
        now: int,
        callbacks: Collection[Callback] = (),
        tasks: Collection[Task] = (),
        root_workflows: Mapping[str, tuple[str | None, str | None]] | None = None,
    ) -> None:
        self.now = now
        self._root_workflows = root_workflows or {}
        """(workflow, version) of the roots of `callbacks` that are not loaded."""
        self._current = loaded
        self.inserts: dict[str, Promise] = {}
        self.updates: dict[str, Promise] = {}
        self.changes: list[StateChange] = []
        self._callbacks: dict[str, list[Callback]] = {}
        for callback in callbacks:
            self._callbacks.setdefault(callback.promise_id, []).append(callback)
        self._tasks: dict[str, Task] = {t.id: t for t in tasks}
        self._active: dict[str, str] = {
            t.root_promise_id: t.id for t in tasks if t.state is not TaskState.COMPLETED
        }
        self.task_inserts: dict[str, Task] = {}
        self.task_updates: dict[str, Task] = {}
        self.new_callbacks: list[Callback] = []
        self.fired: set[str] = set()
        """Promises whose callbacks fired (and are dropped)."""
        self.finished_roots: set[str] = set()
        """Roots that settled: their remaining callbacks are dropped."""
        self._children: dict[str, list[str]] | None = None
        """Loaded promises by parent_id, built when a workflow root first settles."""

    # -- promises ---------------------------------------------------------------------

    def get(self, promise_id: str) -> Promise | None:
        found = self._current.get(promise_id)
        if found is not None and domain.is_expired(found, self.now):
            # Persist the timeout now rather than waiting for the sweeper, so
            # watchers hear of it and the row matches what we answer.
            self.settle(found, domain.expire(found))
            found = self._current[promise_id]
        return found

    def expire_if_due(self, promise_id: str, now: int) -> bool:
        found = self._current.get(promise_id)
        if found is None or not domain.is_expired(found, now):
            return False
        self.settle(found, domain.expire(found))
        return True

    def add(self, promise: Promise, principal: str | None = None) -> None:
        self._current[promise.id] = promise
        self.inserts[promise.id] = promise
        if self._children is not None and promise.parent_id is not None:
            self._children.setdefault(promise.parent_id, []).append(promise.id)
        self.changes.append(StateChange(promise, None, principal))
        group = promise.tags.get(INVOKE_TAG)
        if group:
            # Starting a workflow is creating its root: its INVOKE task comes with it.
            invoke = tasks.create(
                _task_id(), promise.id, group, TaskKind.INVOKE, workflow=workflow_name(promise.tags)
            )
            self.put_task(invoke)

    def settle(self, old: Promise, new: Promise) -> None:
        self._current[new.id] = new
        if new.id in self.inserts:
            self.inserts[new.id] = new
        else:
            self.updates[new.id] = new
        self.changes.append(StateChange(new, old.state, new.settled_by))
        if INVOKE_TAG in new.tags:
            self.finished_roots.add(new.id)
        for callback in self._callbacks.pop(new.id, ()):
            self.fired.add(new.id)
            self._resume(callback)
        if INVOKE_TAG in new.tags and new.is_settled and not old.is_settled:
            self._end_steps(new)
            if new.state is domain.PromiseState.REJECTED_CANCELED:
                self._hurry(new.id)

    def _hurry(self, root_id: str) -> None:
        """A cancelled workflow whose task waits out a retry backoff (loaded by
        `Keys.roots`) hears of it now: the task is claimable at once."""
        active = self.active_task(root_id)
        if active is not None:
            hurried = tasks.hurry(active)
            if hurried is not active:
                self.put_task(hurried)

    def _end_steps(self, root: Promise) -> None:
        """A workflow root settled: its steps still PENDING (loaded by `Keys.steps_of`)
        are cancelled with it, a child workflow's root and so its steps too (§4.11)."""
        if self._children is None:
            self._children = {}
            for promise in self._current.values():
                if promise.parent_id is not None:
                    self._children.setdefault(promise.parent_id, []).append(promise.id)
        for step_id in self._children.get(root.id, ()):
            step = self.get(step_id)
            if step is not None and not step.is_settled:
                self.settle(step, steps.ended(step, root, self.now))

    def rewrite(self, promise: Promise) -> None:
        """Store a change that is not a settlement (no watcher or callback hears of it)."""
        self._current[promise.id] = promise
        if promise.id in self.inserts:
            self.inserts[promise.id] = promise
        else:
            self.updates[promise.id] = promise

    # -- tasks ------------------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def active_task(self, root_id: str) -> Task | None:
        task_id = self._active.get(root_id)
        return None if task_id is None else self._tasks[task_id]

    def put_task(self, task: Task) -> None:
        known = task.id in self._tasks and task.id not in self.task_inserts
        self._tasks[task.id] = task
        (self.task_updates if known else self.task_inserts)[task.id] = task
        if task.state is TaskState.COMPLETED:
            if self._active.get(task.root_promise_id) == task.id:
                del self._active[task.root_promise_id]
        else:
            self._active[task.root_promise_id] = task.id

    def pending_in(self, group: str, limit: int, route: Route = ANY) -> list[Task]:
        """Loaded PENDING tasks of `group` that `route` accepts and that are past any
        retry backoff, in the order they were read (preferred first)."""
        found = [t for t in self._tasks.values() if t.group == group]
        return [
            t
            for t in found
            if t.claimable(self.now) and route.accepts(t.workflow, t.workflow_version)
        ][:limit]

    def workflow_of(self, root_id: str) -> tuple[str | None, str | None]:
        """The root's workflow name and recorded version (None for what it lacks)."""
        root = self._current.get(root_id)
        if root is None:
            return self._root_workflows.get(root_id, (None, None))
        return workflow_name(root.tags), root.workflow_version or None

    def claimed_by(self, worker_id: str | None) -> list[Task]:
        """Loaded CLAIMED tasks of the worker (of anyone, for None)."""
        return [
            t
            for t in self._tasks.values()
            if t.state is TaskState.CLAIMED and (worker_id is None or t.worker_id == worker_id)
        ]

    def new_task_id(self) -> str:
        return _task_id()

    def add_callback(self, callback: Callback) -> None:
        self._callbacks.setdefault(callback.promise_id, []).append(callback)
        self.new_callbacks.append(callback)

    def _resume(self, callback: Callback) -> None:
        active = self.active_task(callback.root_promise_id)
        workflow, version = self.workflow_of(callback.root_promise_id)
        updated, created = tasks.resume(
            active, _task_id(), callback.root_promise_id, callback.group, callback.worker_id,
            workflow=workflow, workflow_version=version,
        )  # fmt: skip
        if updated is not None and updated is not active:
            self.put_task(updated)
        if created is not None:
            self.put_task(created)


def _task_id() -> str:
    return uuid.uuid4().hex


def claim_in(
    batch: Batch,
    task: Task,
    worker_id: str,
    lease_ms: int,
    principal: str | None,
    route: Route,
) -> tuple[Task, Promise | None]:
    """Lease the task to the worker in this batch, and return it with its root.

    The first worker to take a root records its code version on the root and
    the task, in the claim's transaction: from then on only that code (or code
    declared compatible with it) gets the root's tasks."""
    batch.put_task(tasks.claim(task, worker_id, batch.now, lease_ms, principal))
    root = batch.get(task.root_promise_id)
    # Re-read: reading the root may have expired it, and its settle touched tasks.
    claimed = batch.task(task.id)
    assert claimed is not None
    pinned, root = _pin(batch, claimed, root, route)
    batch.put_task(pinned)
    return pinned, root


def _pin(
    batch: Batch, task: Task, root: Promise | None, route: Route
) -> tuple[Task, Promise | None]:
    if task.workflow_version is not None:
        return task, root
    if root is not None and root.workflow_version:
        # Tasks copy their root's version when created; should one lack it, the
        # root's record still wins (a worker not running it gives the task back).
        return tasks.pin(task, root.workflow_version), root
    version = route.version_for(task.workflow)
    if version is None:
        return task, root  # a worker from before versions, or one not running it
    if root is not None and not root.is_settled:
        root = replace(root, workflow_version=version)
        batch.rewrite(root)
    return tasks.pin(task, version), root


def _lease_new(
    batch: Batch, lessor: Lessor, reserved: list[tuple[Lessee, str]] | None
) -> list[Leased]:
    """Lease the tasks this batch creates PENDING to streams the lessor picks
    (appending each slot it holds to `reserved`)."""
    leases: list[Leased] = []
    reserved = [] if reserved is None else reserved
    freed = [t.id for t in batch.task_updates.values() if t.state is TaskState.COMPLETED]
    for task in list(batch.task_inserts.values()):
        if not task.claimable(batch.now):
            continue
        lessee = lessor.reserve(task, freed)
        if lessee is None:
            continue
        reserved.append((lessee, task.id))
        claimed, root = claim_in(
            batch, task, lessee.worker_id, lessee.lease_ms, lessee.principal, lessee.route
        )
        new_root = task.kind is TaskKind.INVOKE and task.root_promise_id in batch.inserts
        leases.append(Leased(claimed, lessee, root, new_root))
    return leases


class WriteOp(Protocol[R_co]):
    """One request's write: what it touches, and what it does to it."""

    def keys(self, tx: WriteTx, now: int) -> Keys: ...

    def apply(self, batch: Batch) -> R_co:
        """Read and stage changes through `batch`; raise DomainError to refuse."""


class _Item(Generic[R]):
    """One queued request, answered from the writer thread by `answer`."""

    __slots__ = ("ok", "op", "value")

    def __init__(self, op: WriteOp[R]) -> None:
        self.op = op
        self.ok = False
        self.value: Any = None

    def answer(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value

    def result(self) -> R:
        if self.ok:
            return cast("R", self.value)
        raise self.value


class _BlockingItem(_Item[R]):
    """Waited on by a thread. Its lock is held until the answer is in: a bare lock
    is the cheapest hand-off CPython has, and this is paid once per request."""

    __slots__ = ("_done",)

    def __init__(self, op: WriteOp[R]) -> None:
        super().__init__(op)
        self._done = threading.Lock()
        self._done.acquire()

    def answer(self, ok: bool, value: Any) -> None:
        super().answer(ok, value)
        self._done.release()

    def wait(self) -> R:
        self._done.acquire()
        return self.result()


class _AsyncItem(_Item[R]):
    """Awaited on an event loop; answered in one loop callback per batch."""

    __slots__ = ("future", "loop")

    def __init__(self, op: WriteOp[R], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(op)
        self.loop = loop
        self.future: asyncio.Future[R] = loop.create_future()


def _settle_futures(items: list[_AsyncItem[Any]]) -> None:
    for item in items:
        if item.future.done():  # the caller went away (RPC cancelled)
            continue
        if item.ok:
            item.future.set_result(item.value)
        else:
            item.future.set_exception(item.value)


@dataclass(slots=True)
class CommitStats:
    commits: int = 0
    requests: int = 0
    largest_batch: int = 0
    refused: int = 0
    """Write requests refused because `max_queued` were already waiting."""


MAX_QUEUED_FLAG = "max-queued-writes"


def drain_estimate_ms(queued: int, max_batch: int, commit_ms: float) -> int:
    """How long a queue of `queued` writes takes to commit, `max_batch` per commit of
    `commit_ms` each: the delay a refused write is asked to wait (20 ms to 2 s)."""
    commits = math.ceil(queued / max_batch) + 1
    return max(20, min(2000, round(commits * commit_ms)))


class GroupCommitter:
    """Owns the store's single write path; `start()` and `stop()` bound its thread."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], int],
        on_commit: Callable[[list[StateChange]], None],
        *,
        max_batch: int = 512,
        on_pending_tasks: Callable[[set[str]], None] | None = None,
        on_store_error: Callable[[], None] | None = None,
        max_queued: int | None = None,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self._store = store
        self._on_batch = on_batch
        """Each committed batch: its size and how long it took, in seconds (the metrics)."""
        self._transaction_time = transaction_clock(clock)
        """The store's clock (`troth_server.clock`): read once per transaction, inside it."""
        self._on_store_error = on_store_error
        self._on_commit = on_commit
        self._on_pending_tasks = on_pending_tasks
        self._max_batch = max_batch
        self._max_queued = max_queued
        self._queued = 0
        """Requests handed to the writer and not yet taken by it (under `_submit_lock`)."""
        self._commit_ms = 5.0
        """A moving average of how long one batch takes: what a refusal's delay is made of."""
        # Each entry is a group of requests: one from a thread, or all those an
        # event loop received in one iteration (fewer hand-offs, fuller batches).
        self._queue: queue.SimpleQueue[list[_Item[Any]] | None] = queue.SimpleQueue()
        self._loop_groups: dict[asyncio.AbstractEventLoop, list[_Item[Any]]] = {}
        self._thread = threading.Thread(target=self._loop, name="troth-group-commit", daemon=True)
        self._closed = False
        # Orders submits against stop(), so that no request is queued behind the stop.
        self._submit_lock = threading.Lock()
        self._lessor: Lessor | None = None
        self.stats = CommitStats()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Commit everything already queued, then stop; later submits are refused."""
        with self._submit_lock:
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def busy(self) -> bool:
        """Whether requests are queued for the writer right now."""
        return not self._queue.empty() or bool(self._loop_groups)

    @property
    def queued(self) -> int:
        """Write requests waiting for the writer now (not those in the batch it commits)."""
        return self._queued + sum(len(g) for g in self._loop_groups.values())

    def submit(self, op: WriteOp[R]) -> R:
        """Queue `op`, wait until its batch is committed, and return its result."""
        item = _BlockingItem(op)
        self._enqueue([item])
        return item.wait()

    async def submit_async(self, op: WriteOp[R]) -> R:
        """`submit` for an event loop: the loop runs on while the batch commits."""
        loop = asyncio.get_running_loop()
        group = self._loop_groups.get(loop)
        if self._max_queued is not None:
            # An unlocked read: off by the odd request at worst, which a limit can afford.
            waiting = self._queued + (len(group) if group is not None else 0)
            if waiting >= self._max_queued:
                self.stats.refused += 1
                raise Overloaded(
                    MAX_QUEUED_FLAG,
                    self._max_queued,
                    f"{waiting} writes are already queued for the store",
                    drain_estimate_ms(waiting, self._max_batch, self._commit_ms),
                )
        item = _AsyncItem(op, loop)
        if group is None:
            group = self._loop_groups[loop] = []
            # Runs after every callback already ready in this loop iteration.
            loop.call_soon(self._send_loop_group, loop)
        group.append(item)
        return await item.future

    def _send_loop_group(self, loop: asyncio.AbstractEventLoop) -> None:
        group = self._loop_groups.pop(loop)
        try:
            self._enqueue(group)
        except ShuttingDown as exc:
            for item in group:
                item.answer(False, exc)
            _settle_futures([i for i in group if isinstance(i, _AsyncItem)])

    def _enqueue(self, group: list[_Item[Any]]) -> None:
        with self._submit_lock:
            if self._closed:
                raise ShuttingDown()
            self._queued += len(group)
            self._queue.put(group)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            stopping = first is None
            items: list[_Item[Any]] = [] if first is None else list(first)
            while len(items) < self._max_batch:
                try:
                    group = self._queue.get_nowait()
                except queue.Empty:
                    break
                if group is None:
                    stopping = True
                    continue
                items.extend(group)
            if items:
                with self._submit_lock:
                    self._queued -= len(items)
                started = time.perf_counter()
                self._run(items)
                elapsed_ms = (time.perf_counter() - started) * 1000
                self._commit_ms += (elapsed_ms - self._commit_ms) / 8
            if stopping:
                self._refuse_queued()
                return

    def _refuse_queued(self) -> None:
        while True:
            try:
                group = self._queue.get_nowait()
            except queue.Empty:
                return
            with self._submit_lock:
                self._queued -= len(group or ())
            for item in group or ():
                item.answer(False, ShuttingDown())
            _wake_loops(group or [])

    def lease_on_commit(self, lessor: Lessor) -> None:
        """From now on, lease the tasks each transaction creates to the streams
        `lessor` picks, in that transaction (set once, before `start`)."""
        self._lessor = lessor

    def _run(self, items: list[_Item[Any]]) -> None:
        reserved: list[tuple[Lessee, str]] = []
        """Every slot a fold held, over the store's retries of the transaction."""

        def work(tx: WriteTx) -> _Folded:
            # One clock read per transaction: the whole batch decides at that time.
            return _fold(tx, items, self._transaction_time(tx), self._lessor, reserved)

        started = time.perf_counter()
        try:
            outcomes, changes, pending_groups, leases = self._store.write(work)
        except StoreError as exc:
            self._unreserve(reserved)
            if isinstance(exc, StoreUnavailable) and self._on_store_error is not None:
                self._on_store_error()
            if len(items) > 1:
                # One bad request must not fail its neighbours: retry each alone.
                for item in items:
                    self._run([item])
                return
            log.error("store.write_failed", error=str(exc))
            failure = exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(str(exc))
            items[0].answer(False, failure)
            _wake_loops(items)
            return
        except BaseException as exc:  # a bug in the fold: answer, never hang a request
            self._unreserve(reserved)
            log.exception("group_commit.batch_crashed")
            for item in items:
                item.answer(False, exc)
            _wake_loops(items)
            return
        if len(reserved) > len(leases):  # the store retried: earlier folds' slots
            kept = {lease.task.id for lease in leases}
            self._unreserve([r for r in reserved if r[1] not in kept])
        self.stats.commits += 1
        self.stats.requests += len(items)
        self.stats.largest_batch = max(self.stats.largest_batch, len(items))
        if self._on_batch is not None:
            self._on_batch(len(items), time.perf_counter() - started)
        for item, (ok, value) in zip(items, outcomes, strict=True):
            item.answer(ok, value)
        _wake_loops(items)
        if leases and self._lessor is not None:
            self._lessor.leased(leases)
        if changes:
            self._on_commit(changes)
        if pending_groups and self._on_pending_tasks is not None:
            self._on_pending_tasks(pending_groups)

    def _unreserve(self, reserved: list[tuple[Lessee, str]]) -> None:
        if reserved and self._lessor is not None:
            self._lessor.unreserve(reserved)


def _wake_loops(items: list[_Item[Any]]) -> None:
    """One thread-safe callback per event loop per batch, not one per request."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_AsyncItem[Any]]] = {}
    for item in items:
        if isinstance(item, _AsyncItem):
            by_loop.setdefault(item.loop, []).append(item)
    for loop, waiting in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_futures, waiting)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


_Folded = tuple[list[tuple[bool, Any]], list[StateChange], set[str], list["Leased"]]
"""What a fold answers: each item's outcome, the state changes, the groups left with
PENDING tasks, and the tasks leased as they were created."""


def _fold(
    tx: WriteTx,
    items: list[_Item[Any]],
    now: int,
    lessor: Lessor | None = None,
    reserved: list[tuple[Lessee, str]] | None = None,
) -> _Folded:
    promise_ids: set[str] = set()
    root_ids: set[str] = set()
    task_ids: set[str] = set()
    queried: list[Task] = []
    unlocked: dict[str, Task] = {}
    settling: set[str] = set()
    settling_tasks: set[str] = set()
    for item in items:
        keys = item.op.keys(tx, now)
        promise_ids.update(keys.promises)
        root_ids.update(keys.roots)
        task_ids.update(keys.task_ids)
        queried.extend(keys.tasks)
        unlocked.update((t.id, t) for t in keys.unlocked)
        settling.update(keys.steps_of)
        if keys.steps_of_task_roots:
            settling_tasks.update(keys.task_ids)
    loaded = {t.id: t for t in queried}
    wanted = task_ids - loaded.keys() - unlocked.keys()
    # One lock order for every write, promises before tasks, so that replicas
    # writing the same workflow queue up instead of deadlocking: learn the
    # tasks' roots unlocked, lock the promises, then lock and re-read the tasks.
    # (Claims and lease sweeps take their tasks first, but with SKIP LOCKED.)
    peeked = tx.get_tasks(wanted, lock=False) if tx.row_locks else tx.get_tasks(wanted)
    for known in (peeked, unlocked, loaded):  # the roots of the tasks loaded by id
        promise_ids.update(known[t].root_promise_id for t in task_ids if t in known)
    promises = tx.get_promises(promise_ids)
    for known in (peeked, unlocked, loaded):
        settling.update(known[t].root_promise_id for t in settling_tasks if t in known)
    _load_steps(tx, promises, settling, now)
    if tx.row_locks:
        loaded.update(tx.get_tasks(peeked.keys() | unlocked.keys()))
    else:
        loaded.update({**unlocked, **peeked})
    # Only a promise that exists can have callbacks: a batch of creates asks nothing.
    callbacks = tx.get_callbacks(promises.keys())
    root_ids.update(c.root_promise_id for c in callbacks)
    loaded.update({t.id: t for t in tx.get_active_tasks(root_ids).values()})
    # The RESUME tasks these callbacks may create carry their roots' versions.
    workflows = tx.root_workflows({c.root_promise_id for c in callbacks} - promises.keys())
    batch = Batch(promises, now, callbacks, loaded.values(), workflows)
    outcomes: list[tuple[bool, Any]] = []
    for item in items:
        try:
            outcomes.append((True, item.op.apply(batch)))
        except DomainError as exc:
            outcomes.append((False, exc))
        except Exception as exc:
            # A bug in one op: answer it (INTERNAL) and keep its neighbours. Ops
            # stage changes only after their domain call returned, so none leaked.
            log.exception("group_commit.op_crashed", op=type(item.op).__name__)
            outcomes.append((False, exc))
    leases = [] if lessor is None else _lease_new(batch, lessor, reserved)
    # The groups where a task is left PENDING (not leased at commit): the dispatcher's.
    pending_groups = {
        t.group
        for t in (*batch.task_inserts.values(), *batch.task_updates.values())
        if t.state is TaskState.PENDING
    }
    tx.insert_promises(list(batch.inserts.values()))
    tx.update_promises(list(batch.updates.values()))
    # Updates first: a task completing and its root's next RESUME share the
    # one-active-task-per-root index.
    tx.update_tasks(list(batch.task_updates.values()), now)
    tx.insert_tasks(list(batch.task_inserts.values()), now)
    tx.delete_callbacks(batch.fired, batch.finished_roots)
    tx.insert_callbacks([c for c in batch.new_callbacks if c.promise_id not in batch.fired], now)
    settled = [c.promise.id for c in batch.changes if c.promise.is_settled]
    tx.announce(pending_groups, settled, created_ids=list(batch.inserts))
    return outcomes, batch.changes, pending_groups, leases


def _load_steps(tx: WriteTx, promises: dict[str, Promise], settling: set[str], now: int) -> None:
    """Load (and lock) the PENDING steps of the workflow roots this batch may settle:
    those its ops name, and those already past their expire_time. Each level is read
    after its parents are locked, so that a step created meanwhile is either seen
    here or created after the settle (and then refused: WORKFLOW_SETTLED)."""
    frontier = [
        p.id
        for p in promises.values()
        if INVOKE_TAG in p.tags
        and not p.is_settled
        and (p.id in settling or domain.is_expired(p, now))
    ]
    while frontier:
        found = tx.get_promises(set(tx.pending_step_ids(frontier)) - promises.keys())
        promises.update(found)
        frontier = [p.id for p in found.values() if INVOKE_TAG in p.tags]
