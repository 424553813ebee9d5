"""`Leases`: the tasks leased to one worker, fenced by the server's lease, and the
heartbeat thread that extends them.

The server's lease is what counts. Each delivery carries the server's
`lease_expire_time`; it is mapped once, on arrival, onto this process's
monotonic clock through the offset the heartbeats measure
(`HeartbeatResponse.server_time` minus the monotonic time the heartbeat was
*sent*, so the round trip is the margin and the mapped expiry is never later
than the server's). A delivery already past that expiry when it is read (it
sat in a socket buffer while this process was frozen) is dropped unrun: the
server has moved it on, so nothing is released.

A step function starts only on a lease the server confirmed (by a delivery
or a heartbeat listing the task at its counter) within the last `FRESH`
fraction of the lease; otherwise `confirm` heartbeats first, and a task the
answer no longer lists is dropped.

One task per root at a time: the table is keyed by root as well as by task.
A second delivery of a root whose older task still runs here marks the older
one lost (the server re-leased it) and waits until it stops (`Held.after`);
what the older one wrote meanwhile (`Held.written`) joins its history.

Heartbeats. One thread extends every lease every `lease / 3` (and at once at
start and when the stream reconnects, to learn the clock offset and which
tasks are still ours; every `RETRY_BEAT_S` while heartbeats fail), holding
tasks or not (holding none, every `IDLE_BEAT_S`, or lease / 3 if longer): an idle worker's
heartbeat is its liveness on the server (its "last heartbeat" in `troth workers
list`), which only its own calls give. A lease no heartbeat got through for is
dropped (`expire`); tasks dropped or abandoned that the server still counts as
ours are released when a heartbeat names them.

Tasks never received. A task the heartbeats name that this worker never read
is either still on its way (claimed, its delivery in flight or unread in a
socket: heartbeats can follow each other within milliseconds, and a frozen
process reads nothing) or will never come (a replica claimed it for our stream
and died before delivering it). Still unread `ORPHAN_AFTER` of a lease after
a heartbeat's answer first named it at that counter, it is given back, or our
heartbeats would keep it leased for as long as we hold anything else. Once
given back, its lease is not ours whatever the delivery says: if the delivery
is read after all, it is dropped unrun (the server moved the task on, maybe to
another worker, which would run its step functions beside ours).

Busy tasks. A task whose runner is inside a step function, or holds a
finished result (a step's, or the workflow's own) that is not recorded yet
(`Leases.busy`), is never dropped for want of a heartbeat, nor given back:
an outage alone must not move a task whose result waits, or another worker
would run the step again. It stays held however long no heartbeat gets
through; the first that does (the server takes no lease for one lease length
after it is back, DESIGN §2) keeps it, unless the server says it moved on
(then it is lost, and the result is recorded all the same: a finished result
is accepted at any counter the task had, first writer wins).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from troth.errors import (
    DeadlineExceededError,
    LeaseLostError,
    NotFoundError,
    RpcError,
    UnavailableError,
)
from troth.v1 import types_pb2

if TYPE_CHECKING:
    from google.protobuf.timestamp_pb2 import Timestamp

    from troth._promise import Promise
    from troth._tasks import TaskCalls
    from troth.v1 import tasks_pb2

__all__ = ["FRESH", "IDLE_BEAT_S", "ORPHAN_AFTER", "RETRY_BEAT_S", "Held", "Leases", "Lost"]

_log = logging.getLogger("troth.worker")

FRESH = 0.5
"""A step function starts only if the server confirmed its lease within this fraction of it."""

ORPHAN_AFTER = FRESH
"""A task the heartbeats name that this worker still has not received this fraction of
the lease after an answer first named it (at that counter) is given back. Not less
than `FRESH`: it was leased before that answer, so its delivery, read after it was
given back, no longer looks fresh (and is dropped unrun anyway: `Leases.accept`).
With heartbeats every lease / 3, the third naming it gives it back."""

RETRY_BEAT_S = 0.25
"""While heartbeats fail, the next is tried this soon (not a third of the lease later):
a server back from an outage keeps a lease only for one lease length."""

IDLE_BEAT_S = 10.0
"""A worker holding no task heartbeats this often (or every lease / 3, if that is
longer): each heartbeat is a transaction on the server's writer, and an idle
fleet's would be most of them; often enough that its "last heartbeat" never looks
stalled."""

UNANSWERED = (UnavailableError, DeadlineExceededError)
"""Heartbeat failures that say the server was away (not a refusal)."""

_QUIET_S = 30.0
"""While heartbeats keep failing, their warning is logged at most this often."""

_MAX_DROPPED = 1024


class Lost(Exception):
    """The lease is gone (the server moved the task on): drop the task."""


@dataclass(eq=False, slots=True)
class Held:
    """A task leased to this worker, as this worker knows it."""

    task_id: str
    counter: int
    root_id: str
    expires: float = 0.0
    """The monotonic time its lease surely ends by, unless a heartbeat extends it."""
    confirmed: float = -math.inf
    """The monotonic time the server last surely held the lease for us (a lower bound)."""
    lost: bool = False
    """The server moved it on (stale counter, missing from a heartbeat, lease ran out)."""
    abandoned: bool = False
    """Its runner gave up on it but could not release it yet; the heartbeater retries."""
    busy: int = 0
    """Inside a step function, or holding a result not recorded yet (`Leases.busy`):
    never dropped for want of a heartbeat, never given back."""
    after: Held | None = None
    """An older task of the same root still running here: this one waits until it stops."""
    written: list[Promise] = field(default_factory=list)
    """The step promises its runner created or settled, as the server answered: a
    newer task of the root that waited for it (`after`) adds them to its history."""
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set once its runner is done with it."""

    def fence(self, worker_id: str) -> types_pb2.TaskFence:
        """What every step write made under this task carries."""
        return types_pb2.TaskFence(task_id=self.task_id, counter=self.counter, worker_id=worker_id)


def _seconds(timestamp: Timestamp) -> float:
    return timestamp.seconds + timestamp.nanos / 1e9


class Leases:
    """The held-task table and the heartbeat thread of one worker; see the module docstring.

    Args:
        tasks: The `TaskService` calls, as this worker makes them.
        lease: The lease the worker asks for.
        clock: The monotonic clock; replaced in tests.
    """

    def __init__(
        self,
        tasks: TaskCalls,
        lease: timedelta,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tasks = tasks
        self.worker_id = tasks.worker_id
        self.lease = lease
        self._seconds = lease.total_seconds()
        self._clock = clock
        self._lock = threading.Lock()
        self._beating = threading.Lock()  # one heartbeat at a time (thread or a runner)
        self._held: dict[str, Held] = {}
        """Tasks leased to us, by task id."""
        self._roots: dict[str, Held] = {}
        """The newest task of each root this worker runs (until its runner stops)."""
        self._dropped: collections.OrderedDict[str, Held] = collections.OrderedDict()
        self._unknown: dict[str, tuple[int, float]] = {}
        """Tasks the last heartbeat named that this worker never received: their counter,
        and when an answer first named them at it (`ORPHAN_AFTER`)."""
        self._given_back: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Tasks given back unreceived, by counter: their delivery, if read after all,
        is not run."""
        self._skew: float | None = None
        """Server wall clock minus our monotonic clock, as the last heartbeat measured it
        (None until one did, or if the server sends no `server_time`)."""
        self._failing_since: float | None = None  # heartbeats fail since (None: they do not)
        self._away = False  # the last heartbeat failed for want of an answer from the server
        self._warned = -math.inf  # when a failing heartbeat was last logged
        self._stop = threading.Event()
        self._now = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the table ---------------------------------------------------------

    def accept(self, task: tasks_pb2.Task) -> Held | None:
        """Hold a delivered task; None if its lease had already run out on arrival, or
        if this worker gave the task back before it read the delivery (`_orphans`)."""
        now = self._clock()
        expires = now + self._seconds
        confirmed = -math.inf
        skew = self._skew
        if skew is not None and task.HasField("lease_expire_time"):
            mapped = _seconds(task.lease_expire_time) - skew
            expires = min(expires, mapped)
            confirmed = mapped - self._seconds  # when the server granted it, at the latest
        held = Held(task.id, task.counter, task.root_promise_id, expires, confirmed)
        with self._lock:
            given_back = self._given_back.get(held.task_id, -1) >= held.counter
            if given_back:
                # Named by heartbeats before it was read, and given back: the server
                # moved it on (if the release failed, a heartbeat retries it).
                held.lost = True
                stale = True
            elif expires <= now:
                held.lost = True
                # Released only if a heartbeat shows the server still counts it as ours.
                self._remember_dropped(held)
                stale = True
            else:
                stale = False
                older = self._roots.get(held.root_id)
                if older is not None:
                    # The server leased this root again: the older task is not ours any more.
                    older.lost = True
                    held.after = older
                    if self._held.get(older.task_id) is older:
                        del self._held[older.task_id]
                self._held[held.task_id] = held
                self._roots[held.root_id] = held
        if stale and given_back:
            _log.warning(
                "worker %s: task %s of workflow %r arrived after this worker gave it back "
                "(still unread %.1fs after a heartbeat named it); dropping it unrun",
                self.worker_id,
                held.task_id,
                held.root_id,
                self._seconds * ORPHAN_AFTER,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            return None
        if stale:
            _log.warning(
                "worker %s: task %s of workflow %r arrived %.1fs after its lease ran out; "
                "dropping it unrun",
                self.worker_id,
                held.task_id,
                held.root_id,
                now - expires,
                extra={"worker_id": self.worker_id, "workflow_id": held.root_id},
            )
            return None
        return held

    def held(self) -> list[Held]:
        """The tasks leased to us now."""
        with self._lock:
            return list(self._held.values())

    def forget(self, held: Held) -> None:
        """The task is no longer leased to us (done, lost or released)."""
        with self._lock:
            if self._held.get(held.task_id) is held:
                del self._held[held.task_id]

    def finished(self, held: Held) -> None:
        """Its runner is done with it (whether or not it is still leased to us, e.g. left
        for the release sweep of a stopping worker): a newer task of its root may run."""
        with self._lock:
            if self._roots.get(held.root_id) is held:
                del self._roots[held.root_id]
        held.stopped.set()

    def _remember_dropped(self, held: Held) -> None:
        self._dropped[held.task_id] = held
        while len(self._dropped) > _MAX_DROPPED:
            self._dropped.popitem(last=False)

    # -- fencing -----------------------------------------------------------

    @staticmethod
    def check(held: Held) -> None:
        """Raise `Lost` if the task is no longer ours."""
        if held.lost:
            raise Lost

    def is_fresh(self, held: Held) -> bool:
        """Whether the server confirmed the lease within the last `FRESH` of it."""
        return self._clock() - held.confirmed <= self._seconds * FRESH

    def confirm(self, held: Held, wait: Callable[[float], bool]) -> None:
        """Before a step function starts: make sure the lease is fresh, heartbeating
        now if it is not. Raises `Lost` once the task is surely not ours.

        Args:
            held: The task.
            wait: Waits between failed heartbeats; False if cut short (stopping),
                then `Lost` is raised too: the step does not start.
        """
        while True:
            self.check(held)
            if self.is_fresh(held):
                return
            left = held.expires - self._clock()
            if left <= 0:
                held.lost = True
                raise Lost
            beaten = self.beat(timeout=max(0.2, min(self._seconds / 3, left)))
            if not beaten and not wait(min(0.5, max(0.05, left / 4))):
                raise Lost

    @contextlib.contextmanager
    def busy(self, held: Held) -> Iterator[None]:
        """While a step function runs, or a finished result waits to be recorded: the
        task is not dropped when heartbeats fail, nor given back (see the module
        docstring). Nests."""
        with self._lock:
            held.busy += 1
        try:
            yield
        finally:
            with self._lock:
                held.busy -= 1

    # -- releasing ---------------------------------------------------------

    def release(self, held: Held) -> None:
        """Give the task back to the group; if the call fails, a later heartbeat retries."""
        try:
            self._tasks.release(held.task_id, held.counter)
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
        self.forget(held)

    # -- heartbeats --------------------------------------------------------

    def start(self, name: str) -> None:
        """Start the heartbeat thread; it heartbeats at once, to learn the clock offset."""
        self._now.set()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Heartbeat at once (the stream broke: which tasks are still ours?)."""
        self._now.set()

    def stop(self) -> None:
        self._stop.set()
        self._now.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        interval = self._seconds / 3
        last = -math.inf
        while True:
            # While the server is away, try again soon: it keeps a lease for one lease
            # length after it is back (a refusal is tried at the usual pace).
            forced = self._now.wait(min(interval, RETRY_BEAT_S) if self._away else interval)
            self._now.clear()
            if self._stop.is_set():
                return
            with self._lock:
                idle = not self._held and not self._dropped
            # Holding nothing too, but less often (`IDLE_BEAT_S`): the heartbeat is
            # what the server shows as this worker's liveness ("last heartbeat"), and
            # what lets a stream stalled while it held nothing take tasks again.
            if idle and not forced and self._clock() - last < max(interval, IDLE_BEAT_S):
                self._away = False
                continue
            last = self._clock()
            self.beat(timeout=interval)

    def beat(self, timeout: float) -> bool:
        """One heartbeat; False if it did not get through."""
        with self._beating:
            with self._lock:
                before = dict(self._held)
            sent = self._clock()
            try:
                response = self._tasks.heartbeat(self.lease, timeout)
            except RpcError as exc:
                now = self._clock()
                self._away = isinstance(exc, UNANSWERED)
                if self._failing_since is None:
                    self._failing_since = now
                if before and now - self._warned >= _QUIET_S:
                    self._warned = now
                    _log.warning(
                        "worker %s: heartbeat failed (%s), failing for %.0fs; leases expire "
                        "in %s unless one succeeds (tasks inside a step keep theirs)",
                        self.worker_id,
                        exc,
                        now - self._failing_since,
                        self.lease,
                        extra={"worker_id": self.worker_id},
                    )
                self.expire(now)
                return False
            self._away = False
            if self._failing_since is not None:
                _log.info(
                    "worker %s: a heartbeat got through again after %.1fs",
                    self.worker_id,
                    self._clock() - self._failing_since,
                    extra={"worker_id": self.worker_id},
                )
                self._failing_since, self._warned = None, -math.inf
            if response.HasField("server_time"):
                self._skew = _seconds(response.server_time) - sent
            # (An older server sends none: its leases are timed from arrival, and
            # every task heartbeats once before its first step function.)
            release = self._apply(before, response, sent)
        for held in release:
            self.release(held)
        return True

    def _apply(
        self, before: dict[str, Held], response: tasks_pb2.HeartbeatResponse, sent: float
    ) -> list[Held]:
        """Record what a heartbeat said; returns the tasks to give back."""
        still = {task_id: response.counters.get(task_id, -1) for task_id in response.task_ids}
        with self._lock:
            for task_id, held in before.items():
                if still.get(task_id) in (held.counter, -1):
                    held.expires = max(held.expires, sent + self._seconds)
                    held.confirmed = max(held.confirmed, sent)
                    continue
                held.lost = True
                if self._held.get(task_id) is held:
                    del self._held[task_id]
            abandoned = [h for h in self._held.values() if h.abandoned]
            # Tasks we dropped (their leases ran out unheard, or a release
            # failed) that the server still counts as ours: give them back,
            # or they would wait for as long as this worker heartbeats.
            stale = [
                self._dropped.pop(task_id)
                for task_id in still
                if task_id not in self._held and task_id in self._dropped
            ]
            orphans = self._orphans(still, sent)
        return [*abandoned, *stale, *orphans]

    def _orphans(self, still: dict[str, int], sent: float) -> list[Held]:
        """Tasks leased to us that we never received (see the module docstring), named
        by a heartbeat sent at `sent`: those to give back now. Under the lock."""
        now = self._clock()
        named: dict[str, tuple[int, float]] = {}
        orphans = []
        for task_id, counter in still.items():
            if task_id in self._held or task_id in self._dropped:
                continue
            first = self._unknown.get(task_id)
            if first is None or first[0] != counter:
                named[task_id] = (counter, now)
            elif sent - first[1] < self._seconds * ORPHAN_AFTER:
                # Sent too soon after the first answer naming it: maybe in flight.
                named[task_id] = first
            else:
                orphans.append(Held(task_id, max(counter, 0), root_id=""))
                # Decided here, before the release: a delivery read from now on is stale.
                self._given_back[task_id] = counter
                self._given_back.move_to_end(task_id)
                while len(self._given_back) > _MAX_DROPPED:
                    self._given_back.popitem(last=False)
        self._unknown = named
        return orphans

    def expire(self, now: float) -> None:
        """Drop the tasks whose leases ran out with no heartbeat getting through (a busy
        one stays: its result waits; the server says whether it is still ours)."""
        with self._lock:
            expired = [h for h in self._held.values() if h.expires <= now and not h.busy]
            for held in expired:
                held.lost = True
                del self._held[held.task_id]
                # If the server still counts it as ours when heartbeats get
                # through again, the heartbeater gives it back.
                self._remember_dropped(held)
        if expired:
            _log.warning(
                "worker %s: no heartbeat got through for %s; dropping %d task(s) whose "
                "leases ran out",
                self.worker_id,
                self.lease,
                len(expired),
                extra={"worker_id": self.worker_id},
            )
