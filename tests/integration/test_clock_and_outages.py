"""One clock decides (DESIGN §4 rule 12), and an outage never takes a lease (§2 Lease).

Real server processes whose wall clock a test jumps through the injected test
clock (`TROTH_TEST_CLOCK_FILE`: a float offset in seconds the server adds to
its wall clock), workers played by raw `troth.v1` calls: a Poll stream that
takes the task, heartbeats made (or not) by the test.

- A wall clock jump forward neither takes a lease a worker heartbeated a
  second before nor expires every promise at once; a jump back keeps neither a
  dead worker's lease nor a short timeout for an hour (SQLite: intervals on the
  monotonic clock; PostgreSQL: the database's clock).
- Two PostgreSQL replicas whose clocks are 5 s apart agree: once one answered
  TIMED_OUT the other refuses a resolve, and no reader sees a settled promise
  change.
- A server frozen (SIGSTOP), killed and restarted, or cut off from its store for
  longer than a lease keeps the lease of a worker that heartbeats again right
  after it is back.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from _pg import fresh_schema
from _support import PollStream, ServerProcess, error_info, start_server, start_workflow

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

WAIT = 20.0
SWEEP = "200ms"


# -- a server with a wall clock the test moves ---------------------------------------


@dataclass
class Clocked:
    server: ServerProcess
    clock_file: Path
    channel: grpc.Channel

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)

    @property
    def tasks(self) -> tasks_pb2_grpc.TaskServiceStub:
        return tasks_pb2_grpc.TaskServiceStub(self.channel)

    def jump(self, seconds: float) -> None:
        """Set the server's wall clock `seconds` away from the machine's."""
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(repr(seconds))
        tmp.replace(self.clock_file)
        time.sleep(0.2)  # the server re-reads the file at most every 50 ms


@contextmanager
def clocked_server(
    workdir: Path, *args: str, db_url: str | None = None, offset: float = 0.0
) -> Iterator[Clocked]:
    workdir.mkdir(parents=True, exist_ok=True)
    clock_file = workdir / "clock-offset"
    clock_file.write_text(repr(offset))
    server = start_server(
        workdir, "--sweep-interval", SWEEP, *args, db_url=db_url,
        env={"TROTH_TEST_CLOCK_FILE": str(clock_file)},
    )  # fmt: skip
    try:
        with server.channel() as channel:
            yield Clocked(server, clock_file, channel)
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'troth.db'}"
    else:
        with fresh_schema() as url:
            yield url


# -- a worker played by raw calls ----------------------------------------------------


class Poller(PollStream):
    """A Poll stream read on a thread; the test heartbeats (or not) for it."""

    def __init__(self, tasks: tasks_pb2_grpc.TaskServiceStub, group: str, lease_s: int) -> None:
        self.worker = f"w-{uuid.uuid4().hex[:8]}"
        self.group = group
        self.lease_s = lease_s
        request = tasks_pb2.PollRequest(group=group, worker_id=self.worker, capacity=4)
        request.lease.seconds = lease_s
        self._tasks = tasks
        super().__init__(tasks, request, WAIT)

    def next(self) -> tasks_pb2.Task:
        return self.next_response().task

    def heartbeat(self) -> dict[str, int]:
        return heartbeat(self._tasks, self.worker, self.lease_s)


def heartbeat(tasks: tasks_pb2_grpc.TaskServiceStub, worker: str, lease_s: int) -> dict[str, int]:
    """The tasks the worker still holds, by id, with their counters."""
    request = tasks_pb2.HeartbeatRequest(worker_id=worker)
    request.lease.seconds = lease_s
    return dict(tasks.Heartbeat(request, timeout=WAIT, wait_for_ready=True).counters)


def create(promises: promises_pb2_grpc.PromiseServiceStub, ttl_s: float) -> str:
    promise_id = f"p-{uuid.uuid4().hex[:8]}"
    request = pb.CreatePromiseRequest(id=promise_id)
    request.ttl.FromMilliseconds(int(ttl_s * 1000))
    promises.CreatePromise(request)
    return promise_id


def state(promises: promises_pb2_grpc.PromiseServiceStub, promise_id: str) -> int:
    return promises.GetPromise(pb.GetPromiseRequest(id=promise_id)).promise.state


def task_state(tasks: tasks_pb2_grpc.TaskServiceStub, group: str, task_id: str) -> tasks_pb2.Task:
    found = tasks.SearchTasks(tasks_pb2.SearchTasksRequest(group=group)).tasks
    matching = [t for t in found if t.id == task_id]
    assert matching, f"task {task_id} is neither PENDING nor CLAIMED"
    return matching[0]


def wait_until(check: object, timeout: float, what: str) -> float:
    """Wait until `check()` is true; returns how long it took."""
    assert callable(check)
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def taken(poller: Poller) -> tuple[str, int]:
    group_task = poller.next()
    assert group_task.state == tasks_pb2.TASK_STATE_CLAIMED
    return group_task.id, group_task.counter


# -- wall clock jumps ----------------------------------------------------------------


def test_a_jump_forward_takes_no_lease_and_expires_nothing_early(
    tmp_path: Path, db_url: str
) -> None:
    """+60 s: the worker heartbeated a second before, its 8 s lease is still its own,
    and a promise with 30 s to go is still PENDING."""
    with clocked_server(tmp_path / "server", db_url=db_url) as s:
        group = f"g-{uuid.uuid4().hex[:6]}"
        poller = Poller(s.tasks, group, lease_s=8)
        try:
            start_workflow(s.promises, group)
            task_id, counter = taken(poller)
            waiting = create(s.promises, ttl_s=30)
            assert poller.heartbeat() == {task_id: counter}
            time.sleep(1.0)
            s.jump(+60)
            time.sleep(2.0)  # ten sweeps at the jumped clock, no heartbeat
            assert task_state(s.tasks, group, task_id).state == tasks_pb2.TASK_STATE_CLAIMED
            assert poller.heartbeat() == {task_id: counter}, "the jump took the lease"
            assert state(s.promises, waiting) == types.PROMISE_STATE_PENDING, (
                "the jump expired the promise"
            )
        finally:
            poller.cancel()


def test_a_jump_back_keeps_no_dead_lease_or_timeout_for_an_hour(
    tmp_path: Path, db_url: str
) -> None:
    """Minus 1 h: a worker that stops heartbeating (frozen, its stream still open) loses
    its 2 s lease on time, and a 3 s timeout fires on time."""
    with clocked_server(tmp_path / "server", db_url=db_url) as s:
        group = f"g-{uuid.uuid4().hex[:6]}"
        poller = Poller(s.tasks, group, lease_s=2)
        try:
            start_workflow(s.promises, group)
            task_id, counter = taken(poller)
            assert poller.heartbeat() == {task_id: counter}
            promise_id = create(s.promises, ttl_s=3)
            s.jump(-3600)
            # From now on the worker is "dead": no heartbeat. Generous margins.
            wait_until(
                lambda: task_state(s.tasks, group, task_id).state == tasks_pb2.TASK_STATE_PENDING,
                timeout=12,
                what="the dead worker's lease to expire",
            )
            wait_until(
                lambda: state(s.promises, promise_id) == types.PROMISE_STATE_REJECTED_TIMEDOUT,
                timeout=12,
                what="the 3 s promise to time out",
            )
        finally:
            poller.cancel()


# -- replicas with skewed clocks -----------------------------------------------------


@pytest.fixture
def skewed_replicas(tmp_path: Path) -> Iterator[tuple[Clocked, Clocked]]:
    """Two replicas on one PostgreSQL schema; A's wall clock 5 s ahead of B's. Their
    sweepers are slow, so that only requests decide timeouts here."""
    with ExitStack() as stack:
        url = stack.enter_context(fresh_schema())
        a = stack.enter_context(
            clocked_server(tmp_path / "a", "--sweep-interval", "1h", db_url=url, offset=5.0)
        )
        b = stack.enter_context(
            clocked_server(tmp_path / "b", "--sweep-interval", "1h", db_url=url)
        )
        yield a, b


def test_replicas_with_skewed_clocks_agree_on_a_timeout(
    skewed_replicas: tuple[Clocked, Clocked],
) -> None:
    a, b = skewed_replicas
    promise_id = create(b.promises, ttl_s=3)
    created = time.monotonic()
    wait_until(
        lambda: state(a.promises, promise_id) != types.PROMISE_STATE_PENDING,
        15,
        "A to see a timeout",
    )
    assert state(a.promises, promise_id) == types.PROMISE_STATE_REJECTED_TIMEDOUT
    late = time.monotonic() - created
    assert late > 2.0, f"A answered TIMED_OUT {late:.1f}s into a 3 s timeout"
    request = pb.ResolvePromiseRequest(id=promise_id, value=types.Payload(data=b"1"))
    with pytest.raises(grpc.RpcError) as refused:
        b.promises.ResolvePromise(request)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(refused.value).reason == "TIMED_OUT"
    assert state(b.promises, promise_id) == types.PROMISE_STATE_REJECTED_TIMEDOUT
    assert state(a.promises, promise_id) == types.PROMISE_STATE_REJECTED_TIMEDOUT


def test_racing_settles_and_reads_around_expiry_never_see_a_promise_change(
    skewed_replicas: tuple[Clocked, Clocked],
) -> None:
    """Resolves through B around each promise's expiry, reads through both replicas:
    whatever a reader was told first is what the promise stays."""
    a, b = skewed_replicas
    ttl = 2.0
    ids = [create(b.promises, ttl_s=ttl) for _ in range(12)]
    created = time.monotonic()
    seen: dict[str, list[int]] = {p: [] for p in ids}
    applied: dict[str, bool] = {}
    stop = threading.Event()

    def read(replica: Clocked) -> None:
        while not stop.is_set():
            for promise_id in ids:
                seen[promise_id].append(state(replica.promises, promise_id))

    def resolve() -> None:
        for n, promise_id in enumerate(ids):
            # Spread over the last 0.6 s before expiry and the first 0.6 s after.
            at = created + ttl - 0.6 + n * 0.1
            time.sleep(max(0.0, at - time.monotonic()))
            request = pb.ResolvePromiseRequest(id=promise_id, value=types.Payload(data=b"1"))
            try:
                b.promises.ResolvePromise(request)
                applied[promise_id] = True
            except grpc.RpcError as exc:
                assert error_info(exc).reason == "TIMED_OUT", exc
                applied[promise_id] = False

    readers = [threading.Thread(target=read, args=(r,)) for r in (a, b, a)]
    for t in readers:
        t.start()
    try:
        resolve()
        time.sleep(1.0)
    finally:
        stop.set()
        for t in readers:
            t.join()
    for promise_id in ids:
        final = state(a.promises, promise_id)
        assert state(b.promises, promise_id) == final
        assert final == (
            types.PROMISE_STATE_RESOLVED
            if applied[promise_id]
            else types.PROMISE_STATE_REJECTED_TIMEDOUT
        )
        settled = {s for s in seen[promise_id] if s != types.PROMISE_STATE_PENDING}
        assert settled <= {final}, f"{promise_id}: readers saw {settled}, it is {final}"


# -- outages -------------------------------------------------------------------------


def test_a_server_frozen_longer_than_the_lease_keeps_it_for_a_worker_back_at_once(
    tmp_path: Path,
) -> None:
    with clocked_server(tmp_path / "server") as s:
        group = f"g-{uuid.uuid4().hex[:6]}"
        poller = Poller(s.tasks, group, lease_s=2)
        try:
            start_workflow(s.promises, group)
            task_id, counter = taken(poller)
            assert poller.heartbeat() == {task_id: counter}
            s.server.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(4.0)  # twice the lease
            finally:
                s.server.proc.send_signal(signal.SIGCONT)
            time.sleep(0.5)  # the worker's next heartbeat, once the server answers again
            assert poller.heartbeat() == {task_id: counter}, "the freeze took the lease"
        finally:
            poller.cancel()


def test_a_server_restarted_after_longer_than_the_lease_keeps_it_for_a_worker_back_at_once(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "server"
    group = f"g-{uuid.uuid4().hex[:6]}"
    with clocked_server(workdir) as s:
        poller = Poller(s.tasks, group, lease_s=2)
        start_workflow(s.promises, group)
        task_id, counter = taken(poller)
        assert poller.heartbeat() == {task_id: counter}
        s.server.kill()
        poller.cancel()
    time.sleep(3.0)  # longer than the lease: nobody could heartbeat
    with clocked_server(workdir) as s:
        time.sleep(0.5)  # the worker's next heartbeat, once the server answers again
        held = heartbeat(s.tasks, poller.worker, lease_s=2)
        assert held == {task_id: counter}, "the outage took the lease"


def test_a_store_unreachable_for_longer_than_the_lease_takes_no_lease_when_it_is_back(
    tmp_path: Path,
) -> None:
    """Another process holds the SQLite write lock for 6 s: the server can write nothing
    (no heartbeat, no sweep gets through); once the lock is gone, a worker that
    heartbeats again at once keeps its 2 s lease."""
    import sqlite3

    with clocked_server(tmp_path / "server") as s:
        group = f"g-{uuid.uuid4().hex[:6]}"
        poller = Poller(s.tasks, group, lease_s=2)
        try:
            start_workflow(s.promises, group)
            task_id, counter = taken(poller)
            assert poller.heartbeat() == {task_id: counter}
            db_path = s.server.db_url.removeprefix("sqlite:///")
            blocker = sqlite3.connect(db_path, isolation_level=None)
            try:
                blocker.execute("BEGIN EXCLUSIVE")
                time.sleep(6.0)
                blocker.execute("COMMIT")
            finally:
                blocker.close()
            time.sleep(0.5)  # the worker's next heartbeat, once the store is back
            assert poller.heartbeat() == {task_id: counter}, "the store outage took the lease"
        finally:
            poller.cancel()
