"""The Poll streams open on this server, and what it knows of their workers.

`PollStreams` is the dispatcher's table (`troth_server.dispatch.Dispatcher` owns it and
the lock that guards it): the open streams by group, each worker's last task call
here and the principals of its streams (`alive`), the streams stalled because a
lease of their worker ran out (`stall`, `lost`, `reconcile`), and the routes the
group's streams take (`domain/routing.py`). It answers what operators and the
metrics are shown of them (`views`, `waiting_for`, `absent_versions`); it claims and
delivers nothing. A change that gives a group's streams room answers with the
groups to wake, and the dispatcher wakes them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troth_server.domain import routing
from troth_server.domain.routing import Candidate, Deployments, Registration, Route
from troth_server.domain.workers import StreamView

if TYPE_CHECKING:
    import threading
    from collections.abc import Iterable

    from troth_server.domain.promise import Promise
    from troth_server.domain.task import Task
    from troth_server.store import Store

__all__ = ["Delivery", "PollStream", "PollStreams", "Waiting", "wall_ms"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a PENDING task waits (`Dispatcher.waiting_for`)."""

    words: str
    absence: routing.Absence | None
    """For a task whose version no worker connected here runs: since when."""


@dataclass(frozen=True, slots=True)
class Delivery:
    task: Task
    root: Promise | None
    history: list[Promise]


@dataclass(eq=False)
class PollStream:
    """One worker's Poll stream: where its tasks go, and how many it may hold."""

    group: str
    worker_id: str
    capacity: int
    lease_ms: int
    loop: asyncio.AbstractEventLoop
    """The event loop of the gRPC server, where the stream's coroutine waits."""
    registration: Registration = field(default_factory=Registration)
    """The workflow versions its worker runs (none listed: any task)."""
    principal: str | None = None
    """The authenticated principal that opened it (None with authentication off): the
    tasks it claims are leased to it, and only they go back when it breaks."""
    held: set[str] = field(default_factory=set)
    reserved: set[str] = field(default_factory=set)
    """Tasks leased to it by a transaction still committing (`Dispatcher.reserve`)."""
    closed: bool = False
    stalled: bool = False
    """A lease of this worker ran out: it is frozen or cut off, though its
    connection looks open. It gets nothing more until it heartbeats again."""

    connected_ms: int = field(default_factory=lambda: wall_ms())
    """When it connected, by this server's wall clock (for operators, never decisions)."""

    def __post_init__(self) -> None:
        self._async: asyncio.Queue[Delivery | None] = asyncio.Queue()

    @property
    def room(self) -> int:
        if self.closed or self.stalled:
            return 0
        return self.capacity - len(self.held) - len(self.reserved)

    def deliver(self, delivery: Delivery | None) -> None:
        """From any thread; None ends the stream."""
        try:
            self.loop.call_soon_threadsafe(self._async.put_nowait, delivery)
        except RuntimeError:  # the loop is closed: the stream is gone
            pass

    async def next_async(self) -> Delivery | None:
        return await self._async.get()

    def take_ready(self) -> list[Delivery | None]:
        """The deliveries queued already, without waiting (a None: the stream ends there)."""
        ready: list[Delivery | None] = []
        while not self._async.empty():
            ready.append(self._async.get_nowait())
        return ready


def wall_ms() -> int:
    """This server's wall clock in ms: what operators are shown (connect, last seen)."""
    return time.time_ns() // 1_000_000


class PollStreams:
    """The open Poll streams by group and their workers' liveness, guarded by the
    dispatcher's `lock` (shared: the dispatcher's own state is guarded by it too).

    Methods that say "under the lock" expect the caller to hold it; the others take it.
    """

    def __init__(self, lock: threading.Condition, store: Store) -> None:
        self._lock = lock
        self._store = store
        self._by_group: dict[str, list[PollStream]] = {}
        self._stalled_workers: set[str] = set()
        self._last_seen: dict[str, int] = {}
        """worker id -> its last task call here (wall ms); dropped with its last stream."""
        self._expired_from: dict[str, list[PollStream]] = {}
        """task id -> the streams `stall` found holding it, for `lost` to take it off."""
        self._owners: dict[str, frozenset[str | None]] = {}
        """worker id -> the principals of its open streams here (None: authentication
        off): whose task calls count as the worker's (`alive`). Replaced, never
        changed in place, so that `alive` reads it without the lock."""
        self._deployments = Deployments()
        self._absences = routing.Absences(wall_ms())

    # -- the table, under the lock --------------------------------------------------------

    def __contains__(self, group: object) -> bool:
        """Whether a stream of `group` ever connected here (under the lock)."""
        return group in self._by_group

    def groups(self) -> list[str]:
        """The groups a stream ever connected here for (under the lock)."""
        return list(self._by_group)

    def of(self, group: str) -> list[PollStream]:
        """The group's streams, closed ones not yet removed among them (under the lock)."""
        return self._by_group.get(group, [])

    def open(self, group: str) -> list[PollStream]:
        """The group's streams that are not closed (under the lock)."""
        return [s for s in self._by_group.get(group, []) if not s.closed]

    def every(self) -> list[PollStream]:
        """Every stream of every group (under the lock)."""
        return [s for group in self._by_group.values() for s in group]

    def routes(self, group: str, streams: list[PollStream]) -> list[Route]:
        """The route each of these streams of `group` takes (under the lock)."""
        return routing.routes(group, [s.registration for s in streams], self._deployments)

    def freed(self, worker_id: str, task_id: str) -> list[str]:
        """The task left the worker: off the streams of the worker that held it, and the
        group of each such stream, which has room again (under the lock)."""
        groups = []
        for group, streams in self._by_group.items():
            for stream in streams:
                if stream.worker_id == worker_id and task_id in stream.held:
                    stream.held.discard(task_id)
                    groups.append(group)
        return groups

    # -- streams coming and going ---------------------------------------------------------

    def add(self, stream: PollStream) -> None:
        with self._lock:
            self._deployments.register(stream.group, stream.registration)
            self._by_group.setdefault(stream.group, []).append(stream)
            self._last_seen.setdefault(stream.worker_id, stream.connected_ms)
            self._owners[stream.worker_id] = self._owners.get(stream.worker_id, frozenset()) | {
                stream.principal
            }

    def remove(self, stream: PollStream) -> bool:
        """Take the stream off; whether its worker, by the same principal, has another
        stream of the group open (its tasks of the group then stay leased)."""
        with self._lock:
            group = self._by_group.get(stream.group, [])
            if stream in group:
                group.remove(stream)
                self._absences.ended(stream.group, stream.registration, wall_ms())
            others = any(
                s.worker_id == stream.worker_id and s.principal == stream.principal for s in group
            )
            owners = frozenset(
                s.principal
                for ss in self._by_group.values()
                for s in ss
                if s.worker_id == stream.worker_id
            )
            if owners:
                self._owners[stream.worker_id] = owners
            else:
                self._owners.pop(stream.worker_id, None)
                self._last_seen.pop(stream.worker_id, None)
        return others

    # -- what operators and the metrics see -----------------------------------------------

    def views(self) -> list[StreamView]:
        """Every open Poll stream, by group then worker id."""
        with self._lock:
            views = [
                StreamView(
                    worker_id=s.worker_id,
                    group=s.group,
                    principal=s.principal,
                    workflows=tuple(sorted(s.registration.accepted)),
                    capacity=s.capacity,
                    held=tuple(sorted(s.held)),
                    connected_ms=s.connected_ms,
                    last_seen_ms=max(s.connected_ms, self._last_seen.get(s.worker_id, 0)),
                    stalled=s.stalled,
                )
                for group in self._by_group.values()
                for s in group
                if not s.closed
            ]
        return sorted(views, key=lambda v: (v.group, v.worker_id, v.connected_ms))

    def waiting_for(self, tasks: Iterable[Task]) -> dict[str, Waiting]:
        """Why each of these PENDING tasks is not delivered, as this server sees it, and,
        for one whose version no worker connected here runs, since when."""
        tasks = list(tasks)
        with self._lock:
            by_group = {
                group: self._candidates(group) for group in {t.group for t in tasks}
            }  # fmt: skip
        found: dict[str, Waiting] = {}
        for t in tasks:
            streams = by_group[t.group]
            absence: routing.Absence | None = None
            if routing.version_absent(t, streams):
                absence = self._absences.of(t.group, t.workflow or "", t.workflow_version or "")
            words = routing.waiting_for(t, t.group, streams, absence)
            found[t.id] = Waiting(words, absence)
        return found

    def absent_versions(
        self, keys: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], routing.Absence]:
        """Of these (group, workflow, version), those no open stream here accepts, with
        since when (the metrics' tasks waiting for a version)."""
        absent: dict[tuple[str, str, str], routing.Absence] = {}
        with self._lock:
            candidates: dict[str, list[Candidate]] = {}
            for group, workflow, version in keys:
                streams = candidates.get(group)
                if streams is None:
                    streams = candidates[group] = self._candidates(group)
                if not any(s.route.accepts(workflow, version) for s in streams):
                    absent[(group, workflow, version)] = self._absences.of(group, workflow, version)
        return absent

    def _candidates(self, group: str) -> list[Candidate]:
        """The group's open streams as routing sees them (under the lock)."""
        streams = self.open(group)
        routes = self.routes(group, streams)
        return [Candidate(s.worker_id, routes[i], s.room) for i, s in enumerate(streams)]

    # -- workers' liveness: leases run out, task calls seen ------------------------------

    def stall(self, expired: Iterable[Task]) -> None:
        """Tasks whose lease ran out (from the writer, before the commit that gives them
        back): the streams that held them are stalled first, so that the wake-up of that
        commit cannot hand a task straight back to a frozen worker."""
        with self._lock:
            for task in expired:
                for stream in self._by_group.get(task.group, []):
                    if task.id in stream.held:
                        stream.stalled = True
                        self._stalled_workers.add(stream.worker_id)
                        self._expired_from.setdefault(task.id, []).append(stream)

    def lost(self, lost_tasks: Iterable[Task]) -> set[str]:
        """Tasks whose lease expired, after the commit that gave them back: off the
        streams that held them (stalled by `stall` before that commit); their groups,
        to offer them to others. A stream that took one again meanwhile is not stalled
        and keeps it."""
        groups = set()
        with self._lock:
            for task in lost_tasks:
                groups.add(task.group)
                for stream in self._expired_from.pop(task.id, ()):
                    stream.held.discard(task.id)
        return groups

    def alive(self, worker_id: str, principal: str | None) -> set[str] | None:
        """A task call of `worker_id` by `principal` succeeded: its streams opened by that
        principal are seen, and may take tasks again if they were stalled (their groups,
        to wake; None: nothing was stalled). Another principal naming the same worker id
        changes nothing and fakes no last-seen time. Cheap when nothing is stalled: every
        task call runs it."""
        if principal not in self._owners.get(worker_id, ()):
            return None  # no stream of this worker id opened by this principal
        self._last_seen[worker_id] = wall_ms()  # one dict write (GIL-atomic), no lock
        if worker_id not in self._stalled_workers:
            return None
        groups = set()
        with self._lock:
            still = False
            for group, streams in self._by_group.items():
                for stream in streams:
                    if stream.worker_id != worker_id or not stream.stalled:
                        continue
                    if stream.principal == principal:
                        stream.stalled = False
                        groups.add(group)
                    else:
                        still = True
            if not still:
                self._stalled_workers.discard(worker_id)
        return groups

    def reconcile(self) -> set[str] | None:
        """Forget held tasks the database no longer shows as the stream's worker's; the
        groups of the streams that forgot one (None: no stream held any).

        With replicas, a task delivered here may be completed or released through
        another replica, which cannot tell this one; the stream would count it
        against its capacity for good. Run on the sweeper's beat."""
        # Only what was held before the read counts: a task is claimed (committed)
        # before it is held, so one held now and missing from the read has moved on.
        with self._lock:
            before = [
                (stream, set(stream.held))
                for group in self._by_group.values()
                for stream in group
                if stream.held
            ]
        if not before:
            return None
        claimed = self._store.claimed_task_ids({stream.worker_id for stream, _ in before})
        groups = set()
        now = wall_ms()
        with self._lock:
            for stream, held in before:
                gone = {t for t in held if (stream.worker_id, t) not in claimed}
                if gone & stream.held:
                    stream.held -= gone
                    groups.add(stream.group)
                    if now - self._last_seen.get(stream.worker_id, now) >= stream.lease_ms:
                        # Not heard from for a lease: another replica (or server process)
                        # took its leases back as they ran out, which `stall` cannot tell
                        # this one. A frozen worker must not be handed new tasks into its
                        # socket meanwhile (it would run them when thawed, beside the
                        # worker they moved on to): stalled until it calls again (`alive`).
                        stream.stalled = True
                        self._stalled_workers.add(stream.worker_id)
        return groups
