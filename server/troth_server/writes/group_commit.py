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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

import structlog

from troth.errors import Reason
from troth_server.clock import transaction_clock
from troth_server.domain import promise as domain
from troth_server.domain.errors import DomainError, Overloaded
from troth_server.domain.steps import INVOKE_TAG as INVOKE_TAG
from troth_server.domain.task import Task, TaskState
from troth_server.store import Store, StoreError, StoreUnavailable, WriteTx
from troth_server.writes.batch import (
    Batch,
    Keys,
    Leased,
    Lessee,
    Lessor,
    StateChange,
    lease_new,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from opentelemetry.trace import Span, SpanContext, Tracer

    from troth_server.domain.promise import Promise

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

log = structlog.get_logger("troth.commit")


class ShuttingDown(DomainError):
    reason = Reason.SHUTTING_DOWN

    def __init__(self) -> None:
        super().__init__("the server is shutting down; retry against another server or later")


class CommitTracing(Protocol):
    """The spans of the commits (the server's `_tracing` module, handed in by the app):
    a commit carrying a traced RPC's write is a span linked to that RPC's."""

    def tracer(self) -> Tracer | None: ...

    def current_span_context(self) -> SpanContext | None: ...

    def commit_span(self, tracer: Tracer, size: int, carried: Sequence[SpanContext]) -> Span: ...

    def end_failed(self, span: Span, error: BaseException) -> None: ...


class _Untraced:
    """No spans (no tracing handed in)."""

    def tracer(self) -> Tracer | None:
        return None

    def current_span_context(self) -> SpanContext | None:
        return None

    def commit_span(self, tracer: Tracer, size: int, carried: Sequence[SpanContext]) -> Span:
        raise AssertionError("no tracer, no commit span")

    def end_failed(self, span: Span, error: BaseException) -> None:
        span.end()


class WriteOp(Protocol[R_co]):
    """One request's write: what it touches, and what it does to it."""

    def keys(self, tx: WriteTx, now: int) -> Keys: ...

    def apply(self, batch: Batch) -> R_co:
        """Read and stage changes through `batch`; raise DomainError to refuse."""


class _Item(Generic[R]):
    """One queued request, answered from the writer thread by `answer`."""

    __slots__ = ("ok", "op", "span", "value")

    def __init__(self, op: WriteOp[R]) -> None:
        self.op = op
        self.ok = False
        self.value: Any = None
        self.span: SpanContext | None = None
        """The span of the RPC that queued it, when tracing: its commit's span links to it."""

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
        tracing: CommitTracing | None = None,
    ) -> None:
        self._store = store
        self._tracing: CommitTracing = _Untraced() if tracing is None else tracing
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
        if self._tracing.tracer() is not None:
            item.span = self._tracing.current_span_context()
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
        span = self._commit_span(items)
        try:
            outcomes, changes, pending_groups, leases = self._store.write(work)
        except StoreError as exc:
            if span is not None:
                self._tracing.end_failed(span, exc)
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
            if span is not None:
                self._tracing.end_failed(span, exc)
            self._unreserve(reserved)
            log.exception("group_commit.batch_crashed")
            for item in items:
                item.answer(False, exc)
            _wake_loops(items)
            return
        if len(reserved) > len(leases):  # the store retried: earlier folds' slots
            kept = {lease.task.id for lease in leases}
            self._unreserve([r for r in reserved if r[1] not in kept])
        if span is not None:
            span.end()
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

    def _commit_span(self, items: list[_Item[Any]]) -> Span | None:
        """The span of this commit, when it carries the write of at least one traced
        RPC (linked to each): the server's own writes (sweeps, expiries) make none."""
        carried = [item.span for item in items if item.span is not None]
        tracer = self._tracing.tracer() if carried else None
        return None if tracer is None else self._tracing.commit_span(tracer, len(items), carried)

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
    parents_of: set[str] = set()
    state_keys: set[tuple[str, str]] = set()
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
        parents_of.update(keys.parents_of)
        state_keys.update(keys.states)
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
    root_ids.update(p.parent_id for p in map(promises.get, parents_of) if p and p.parent_id)
    loaded.update({t.id: t for t in tx.get_active_tasks(root_ids).values()})
    # The RESUME tasks these callbacks may create carry their roots' versions.
    workflows = tx.root_workflows({c.root_promise_id for c in callbacks} - promises.keys())
    # Workflow state slots, read once their roots are locked (a slot is written only
    # under its root's lock: the version a compare-and-swap compares is current).
    states = tx.get_states(state_keys) if state_keys else {}
    batch = Batch(
        promises, now, callbacks, loaded.values(), workflows, states, active_read=root_ids
    )
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
    leases = [] if lessor is None else lease_new(batch, lessor, reserved)
    # The groups where a task is left PENDING (not leased at commit): the dispatcher's.
    pending_groups = {
        t.group
        for t in (*batch.task_inserts.values(), *batch.task_updates.values())
        if t.state is TaskState.PENDING
    }
    settled = [c.promise.id for c in batch.changes if c.promise.is_settled]
    with tx.final_writes():  # the writes need no answer but "done": sent with the COMMIT
        tx.insert_promises(list(batch.inserts.values()))
        tx.update_promises(list(batch.updates.values()))
        # Updates first: a task completing and its root's next RESUME share the
        # one-active-task-per-root index.
        tx.update_tasks(list(batch.task_updates.values()), now)
        tx.insert_tasks(list(batch.task_inserts.values()), now)
        tx.delete_callbacks(batch.fired, batch.finished_roots)
        new_callbacks = [c for c in batch.new_callbacks if c.promise_id not in batch.fired]
        tx.insert_callbacks(new_callbacks, now)
        tx.put_states(list(batch.state_writes.values()))
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


__all__ = ["CommitTracing", "GroupCommitter", "ShuttingDown", "WriteOp", "drain_estimate_ms"]
