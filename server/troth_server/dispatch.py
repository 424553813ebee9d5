"""Pushes PENDING tasks to the connected workers of their group (Poll streams).

Each Poll stream is a `PollStream` with a capacity and the set of tasks it
holds; `troth_server._poll_streams.PollStreams` is the table of them and of their
workers' liveness, which the `Dispatcher` owns and guards with its lock. One
dispatcher thread claims tasks for streams with room (a claim is a
write through the group committer, so a delivered task is already leased) and
hands them to the stream's mailbox, with the root and its whole history read
once. It wakes when a commit created PENDING tasks in a group, when a stream
connects or makes room, and on every sweeper tick (so a missed wake-up only
delays a task, never loses it).

Each stream claims only the tasks its route accepts (`domain/routing.py`: the
workflow versions its worker registered, among the group's streams on this
server), so a task no connected worker may run stays PENDING without holding
up the tasks behind it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

import structlog

from troth_server._poll_streams import Delivery, PollStream, PollStreams, Waiting, wall_ms
from troth_server.domain.errors import DomainError
from troth_server.domain.task import TaskState, first_run
from troth_server.domain.workers import StreamView
from troth_server.store import StoreError
from troth_server.writes.batch import Leased, Lessee

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable

    from troth_server.domain import routing
    from troth_server.domain.promise import Promise
    from troth_server.domain.routing import Route
    from troth_server.domain.task import Task
    from troth_server.store import Store
    from troth_server.task_service import TaskService

log = structlog.get_logger("troth.dispatch")


class Dispatcher:
    """Owns the Poll streams (`PollStreams`, under its lock) and the dispatch thread;
    `start()`/`stop()` bound it."""

    def __init__(self, tasks: TaskService, store: Store) -> None:
        self._tasks = tasks
        self._store = store
        self._lock = threading.Condition()
        self._streams = PollStreams(self._lock, store)
        self._wanted: set[str] = set()
        self._gone: list[PollStream] = []
        self._backlog: set[str] = set()
        """Groups whose PENDING tasks wait for room: a wake-up for them while every
        stream is full or a dispatch pass that found streams full says so, and a pass
        that found nothing more to take says otherwise. A new task of a group without
        one is leased as it is created (`reserve`), so it does not overtake those
        that wait; room made in one is offered to them (`done`). A wake-up with room
        to spare (a sweep's tick, tasks given back) only asks for a pass: that pass
        claims them, and a new task meanwhile may be leased before them."""
        self._leased: list[Leased] = []
        """Tasks leased on commit, for the dispatch thread to deliver."""
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="troth-dispatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def end_streams(self) -> None:
        """Server shutdown: end every Poll stream. Workers keep their leases and
        reconnect (to another replica, or to this server when it is back)."""
        with self._lock:
            self._stopping = True
            streams = self._streams.every()
            self._lock.notify_all()
        for stream in streams:
            stream.closed = True
            stream.deliver(None)

    def stop(self) -> None:
        self.end_streams()
        self._thread.join()

    # -- streams --------------------------------------------------------------------------

    def connect(self, stream: PollStream) -> None:
        self._streams.add(stream)
        workflows = sorted(f"{n}@{v}" for n, v in stream.registration.accepted)
        log.info("worker.connected", group=stream.group, worker_id=stream.worker_id,
                 capacity=stream.capacity, workflows=workflows or "any")  # fmt: skip
        self.wake([stream.group])

    def streams(self) -> list[StreamView]:
        """Every open Poll stream, by group then worker id."""
        return self._streams.views()

    def waiting_for(self, tasks: Iterable[Task]) -> dict[str, Waiting]:
        """Why each of these PENDING tasks is not delivered, as this server sees it, and,
        for one whose version no worker connected here runs, since when."""
        return self._streams.waiting_for(tasks)

    def absent_versions(
        self, keys: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], routing.Absence]:
        """Of these (group, workflow, version), those no open stream here accepts, with
        since when (the metrics' tasks waiting for a version)."""
        return self._streams.absent_versions(keys)

    def disconnect_later(self, stream: PollStream) -> None:
        """From any thread or loop, without blocking: the dispatch thread does the rest."""
        stream.closed = True
        with self._lock:
            self._gone.append(stream)
            self._lock.notify_all()

    def disconnect(self, stream: PollStream) -> None:
        """The stream ended or broke: unless the worker has another stream of the
        group, its tasks of the group go back to it at once (those of its other
        groups stay with their own streams)."""
        stream.closed = True
        others = self._streams.remove(stream)
        if others or self._stopping:
            return
        try:
            returned = self._tasks.worker_gone(stream.worker_id, stream.group, stream.principal)
        except StoreError as exc:  # leases expire on their own if this fails
            log.warning("dispatch.release_failed", worker_id=stream.worker_id, error=str(exc))
            return
        log.info("worker.disconnected", group=stream.group, worker_id=stream.worker_id,
                 released=len(returned))  # fmt: skip
        self.wake({t.group for t in returned})

    def done(self, worker_id: str, task_id: str) -> None:
        """A task left the worker (completed, released, lost): its stream has room again,
        for the tasks of its group that wait, if any do."""
        with self._lock:
            for group in self._streams.freed(worker_id, task_id):
                if group in self._backlog:
                    self._wanted.add(group)
            if self._wanted:
                self._lock.notify_all()

    def stall(self, expired: Iterable[Task]) -> None:
        """Tasks whose lease ran out (from the writer, before the commit that gives them
        back): the streams that held them are stalled first, so that the wake-up of that
        commit cannot hand a task straight back to a frozen worker."""
        self._streams.stall(expired)

    def lost(self, lost_tasks: Iterable[Task]) -> None:
        """Tasks whose lease expired, after the commit that gave them back: off the
        streams that held them (stalled by `stall` before that commit), and offered to
        others. A stream that took one again meanwhile is not stalled and keeps it."""
        self.wake(self._streams.lost(lost_tasks))

    def alive(self, worker_id: str, principal: str | None) -> None:
        """A task call of `worker_id` by `principal` succeeded: its streams opened by that
        principal are seen, and may take tasks again if they were stalled. Another
        principal naming the same worker id wakes nothing and fakes no last-seen time.
        Cheap when nothing is stalled: every task call runs it."""
        groups = self._streams.alive(worker_id, principal)
        if groups is not None:
            self.wake(groups)

    def reconcile(self) -> None:
        """Forget held tasks the database no longer shows as the stream's worker's.

        With replicas, a task delivered here may be completed or released through
        another replica, which cannot tell this one; the stream would count it
        against its capacity for good. Run on the sweeper's beat."""
        groups = self._streams.reconcile()
        if groups is not None:
            self.wake(groups)

    # -- dispatching ----------------------------------------------------------------------

    def wake(self, groups: Iterable[str]) -> None:
        """Tasks of these groups may be PENDING: claim them for streams with room."""
        with self._lock:
            wanted = [g for g in groups if g in self._streams]
            for group in wanted:
                if not any(s.room > 0 for s in self._streams.of(group)):
                    # They wait for room: tasks after them must not overtake them.
                    self._backlog.add(group)
            self._wanted.update(wanted)
            if self._wanted:
                self._lock.notify_all()

    def wake_all(self) -> None:
        with self._lock:
            self._wanted.update(self._streams.groups())
            self._lock.notify_all()

    # -- leases on commit (`batch.Lessor`) -----------------------------------------

    def reserve(self, task: Task, freed: Collection[str]) -> Lessee | None:
        """From the writer thread: a stream of the task's group with room whose route
        takes it (the worker that suspended the root first), unless tasks wait there."""
        with self._lock:
            if task.group in self._backlog or self._stopping:
                return None
            streams = self._streams.open(task.group)
            routes = self._streams.routes(task.group, streams)
            best: tuple[int, PollStream, Route] | None = None
            for stream, route in zip(streams, routes, strict=True):
                room = stream.room + len(stream.held.intersection(freed))
                if room <= 0 or not route.accepts(task.workflow, task.workflow_version):
                    continue
                rank = 1 << 30 if stream.worker_id == task.preferred_worker_id else room
                if best is None or rank > best[0]:
                    best = (rank, stream, route)
            if best is None:
                return None
            _, stream, route = best
            stream.reserved.add(task.id)
        return Lessee(stream, stream.worker_id, stream.lease_ms, stream.principal, route)

    def unreserve(self, lessees: list[tuple[Lessee, str]]) -> None:
        with self._lock:
            for lessee, task_id in lessees:
                cast("PollStream", lessee.stream).reserved.discard(task_id)

    def leased(self, leases: list[Leased]) -> None:
        """After the commit: the dispatch thread delivers them (reading their history)."""
        with self._lock:
            for lease in leases:
                stream = cast("PollStream", lease.lessee.stream)
                stream.reserved.discard(lease.task.id)
                stream.held.add(lease.task.id)
            self._leased.extend(leases)
            self._lock.notify_all()

    def _deliver_leased(self, leases: list[Leased]) -> None:
        self._deliver(
            [(cast("PollStream", lease.lessee.stream), lease.task, lease.root) for lease in leases]
        )

    def _deliver(self, leased: list[tuple[PollStream, Task, Promise | None]]) -> None:
        """Deliver tasks leased to these streams, each with its root and history: read
        here, unless the task is its workflow's first run (no steps: `first_run`),
        which goes with the root its claim read. Every history is read before the
        first is delivered, so those of one pass reach a worker together (in one
        message, if it reads batches). What a closed stream or a failed read leaves
        undelivered goes back to its group; the read's error is raised after."""
        ready: list[tuple[PollStream, Delivery]] = []
        failed: StoreError | None = None
        for n, (stream, task, claimed_root) in enumerate(leased):
            if claimed_root is not None and first_run(task):
                ready.append((stream, Delivery(task, claimed_root, [])))
                continue
            try:
                root, history = self._store.promise_tree(task.root_promise_id)
            except StoreError as exc:
                failed = exc
                for rest_stream, rest, _ in leased[n:]:
                    self._undelivered(rest_stream, rest)
                break
            ready.append((stream, Delivery(task, root, history)))
        for stream, delivery in ready:
            if stream.closed:
                self._undelivered(stream, delivery.task)
                continue
            with self._lock:
                stream.held.add(delivery.task.id)
            stream.deliver(delivery)
        if failed is not None:
            raise failed

    def _undelivered(self, stream: PollStream, task: Task) -> None:
        with self._lock:
            stream.held.discard(task.id)
        self._give_back([task], stream.worker_id)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while (
                    not self._wanted and not self._gone and not self._leased and not self._stopping
                ):
                    self._lock.wait()
                if self._stopping:
                    return
                groups, self._wanted = self._wanted, set()
                gone, self._gone = self._gone, []
                leased, self._leased = self._leased, []
            if leased:
                try:
                    self._deliver_leased(leased)
                except StoreError as exc:
                    log.warning("dispatch.store_unavailable", error=str(exc))
            for stream in gone:
                try:
                    self.disconnect(stream)
                except Exception:
                    log.exception("dispatch.disconnect_failed", worker_id=stream.worker_id)
            with self._lock:
                groups |= self._wanted
                self._wanted = set()
            for group in groups:
                try:
                    self._dispatch(group)
                except StoreError as exc:
                    log.warning("dispatch.store_unavailable", group=group, error=str(exc))
                except Exception:
                    log.exception("dispatch.failed", group=group)

    def _dispatch(self, group: str) -> None:
        drained: set[Route] = set()
        while True:
            with self._lock:
                streams = self._streams.open(group)
                routes = dict(
                    zip(map(id, streams), self._streams.routes(group, streams), strict=True)
                )
                candidates = [s for s in streams if s.room > 0]
            candidates = [s for s in candidates if routes[id(s)] not in drained]
            if not candidates:
                with self._lock:
                    if all(routes[id(s)] in drained for s in streams):
                        # Every stream's route found nothing left to take (those it
                        # did not ask for have no room, and room made asks again).
                        # New tasks may be leased as they commit again, even if a
                        # commit meanwhile left some PENDING behind the backlog:
                        # those are wanted, and the next pass claims them (else,
                        # under steady load, the backlog fed itself and most tasks
                        # took a claim of their own).
                        self._backlog.discard(group)
                    else:
                        # Streams without room: what waits must not be overtaken,
                        # and room made asks again.
                        self._backlog.add(group)
                return
            for stream in sorted(candidates, key=lambda s: -s.room):
                wanted, route = stream.room, routes[id(stream)]
                if wanted <= 0 or route in drained:
                    continue
                claimed = self._tasks.claim(
                    group, stream.worker_id, wanted, stream.lease_ms, route, stream.principal
                )
                # Leased but undeliverable (the stream went away, the store failed):
                # given back, rather than left to the worker's heartbeats.
                self._deliver([(stream, item.task, item.root) for item in claimed])
                if len(claimed) < wanted:
                    # Fewer PENDING tasks it may take than room: drained for this
                    # stream for now (another claim would be an empty write
                    # transaction), though others may still take other tasks.
                    drained.add(route)

    def _give_back(self, undelivered: list[Task], worker_id: str) -> None:
        for task in undelivered:
            try:
                self._tasks.release(task.id, task.counter, worker_id)
            except StoreError:
                return  # the worker releases what it never received, or the lease runs out
            except DomainError:
                continue  # it moved on already (its lease ran out meanwhile)


__all__ = [
    "Delivery",
    "Dispatcher",
    "PollStream",
    "StreamView",
    "TaskState",
    "Waiting",
    "wall_ms",
]
