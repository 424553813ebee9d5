"""Races between two replicas on one PostgreSQL schema, made certain rather than likely.

Each test holds row locks in a transaction of its own on the rows both
replicas need, fires the competing requests (or lets both replicas' periodic
work run), and waits until pg_stat_activity shows the replicas' write
backends waiting on a Lock (polling the database with a deadline, never a
fixed sleep). Only then does it release, so the interleaving it checks is the
one that happened, every run:

- two settles of one promise, one through each replica: both wait on the
  test's lock, exactly one applies, the other is told ALREADY_SETTLED (or,
  with the winner's idempotency key, success with applied=false);
- two replicas delivering one task: while the test holds the task row, both
  replicas' claims skip it; then one replica's claim takes the task and waits
  on the root row the test still holds, while the other keeps skipping; on
  release the task reaches exactly one Poll stream;
- two replicas sweeping the same expired promises: each replica's sweep locks
  a different expired step and waits on the root's task row the test holds;
  on release every step times out exactly once and the root gets one RESUME;
- two replicas resuming one suspended workflow (no task row to lock): the
  test's uncommitted task for the root holds the one-active-task-per-root
  index, both replicas' sweeps wait to insert their RESUME; on release one
  insert wins, the other transaction fails on the index and runs again;
- a completion and a cancel of one workflow on two replicas: they lock the
  task and the root in opposite orders, so once both hold their first row
  they deadlock; PostgreSQL aborts one, it runs again, one outcome stands.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import grpc
import psycopg
import pytest
from _pg import admin_url, fresh_schema
from _support import ServerProcess, error_info, start_server
from google.protobuf.duration_pb2 import Duration

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types

T = TypeVar("T")
DEADLINE = 10.0
"""Longest wait for anything expected to happen (lock waits, deliveries)."""
QUIET = 0.5
"""How long "nothing happens" is watched: ten sweep ticks of either replica."""
RPC_TIMEOUT = 20.0
FLAGS = ("--sweep-interval", "50ms", "--sweep-batch", "1")
"""Sweeps every 50 ms, one promise per transaction (and so per lock)."""


# -- replicas and the database ------------------------------------------------------------


@dataclass
class Replica:
    name: str
    server: ServerProcess
    channel: grpc.Channel

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    @property
    def promises(self) -> promises_pb2_grpc.PromiseServiceStub:
        return promises_pb2_grpc.PromiseServiceStub(self.channel)

    @property
    def tasks(self) -> tasks_pb2_grpc.TaskServiceStub:
        return tasks_pb2_grpc.TaskServiceStub(self.channel)

    def events(self, event: str) -> list[dict[str, Any]]:
        found = []
        for line in self.server.log().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == event:
                found.append(record)
        return found


@dataclass
class Cluster:
    db_url: str
    a: Replica
    b: Replica

    @property
    def replicas(self) -> tuple[Replica, Replica]:
        return self.a, self.b

    def named(self, name: str) -> Replica:
        return {"a": self.a, "b": self.b}[name]

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of the test's own to the replicas' schema."""
        options = parse_qs(urlsplit(self.db_url).query)["options"][0]
        return psycopg.connect(admin_url(), options=options, autocommit=autocommit)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two replicas on one fresh schema, sweeping every 50 ms one promise at a time."""
    with ExitStack() as stack:
        url = stack.enter_context(fresh_schema())
        with ThreadPoolExecutor(2) as pool:  # their start-ups overlap
            starting = {
                name: pool.submit(
                    start_server, tmp_path_factory.mktemp(f"replica-{name}"), *FLAGS, db_url=url
                )
                for name in ("a", "b")
            }
        # Every replica that started is stopped, both at once.
        stack.callback(_stop_all, [f.result() for f in starting.values() if not f.exception()])
        replicas = []
        for name, started in starting.items():
            server = started.result()  # raises if it failed to start
            replicas.append(Replica(name, server, stack.enter_context(server.channel())))
        yield Cluster(url, *replicas)


def _stop_all(servers: list[ServerProcess]) -> None:
    for server in servers:  # SIGTERM to all first: their graceful shutdowns overlap
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
    unclean = []
    for server in servers:
        try:  # not stop(): a second SIGTERM late in the shutdown would kill it
            if server.proc.wait(20) != 0:
                unclean.append(server.log()[-3000:])
        except subprocess.TimeoutExpired:
            server.kill()
            unclean.append(server.log()[-3000:])
    assert not unclean, "unclean shutdown:\n" + "\n".join(unclean)


@pytest.fixture(scope="module")
def activity() -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """Autocommit, so every look at pg_stat_activity is a fresh snapshot."""
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def locks(cluster: Cluster) -> Iterator[Callable[[], psycopg.Connection[tuple[Any, ...]]]]:
    """Transactions of the test's own, always rolled back (releasing the replicas)."""
    opened: list[psycopg.Connection[tuple[Any, ...]]] = []

    def open_one() -> psycopg.Connection[tuple[Any, ...]]:
        conn = cluster.connect()
        opened.append(conn)
        return conn

    yield open_one
    for conn in opened:
        conn.rollback()
        conn.close()


def lock_waits(
    activity: psycopg.Connection[tuple[Any, ...]], replica: Replica
) -> list[tuple[int, list[int]]]:
    """The replica's backends now waiting on a heavyweight lock, with who blocks each."""
    rows = activity.execute(
        "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity"
        " WHERE application_name LIKE %s AND wait_event_type = 'Lock'",
        (f"troth-server % pid {replica.pid}",),
    ).fetchall()
    return [(pid, list(blockers)) for pid, blockers in rows]


def queued_on(waits: dict[str, list[tuple[int, list[int]]]], holder_pid: int) -> str:
    """Both replicas wait for a row the test holds: one on the test's transaction,
    the other queued behind it (on the row's tuple lock). Returns the first one."""
    assert all(len(found) == 1 for found in waits.values()), waits
    first = [name for name, ((_, blockers),) in waits.items() if blockers == [holder_pid]]
    assert len(first) == 1, waits
    first_pid = waits[first[0]][0][0]
    for name, ((_, blockers),) in waits.items():
        assert name == first[0] or blockers == [first_pid], waits
    return first[0]


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = DEADLINE) -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def stays_true(what: str, check: Callable[[], bool], seconds: float = QUIET) -> None:
    """A bounded negative check: `check` holds at every look for `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), what
        time.sleep(0.01)


def settled_changes(replica: Replica, promise_id: str) -> list[dict[str, Any]]:
    """The replica's log lines for `promise_id` leaving PENDING."""
    return [
        r
        for r in replica.events("promise.state_changed")
        if r.get("promise_id") == promise_id and r.get("old_state") == "PENDING"
    ]


def rpc_lines(replica: Replica, promise_id: str, *methods: str) -> list[dict[str, Any]]:
    return [
        r
        for r in replica.events("rpc")
        if r.get("promise_id") == promise_id and str(r.get("method", "")).startswith(methods)
    ]


def write_retries(cluster: Cluster, reason: str) -> int:
    return sum(
        r.get("reason") == reason
        for replica in cluster.replicas
        for r in replica.events("store.write_retry")
    )


class Call:
    """A unary call run on a thread: its reply, or the RpcError it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        self.outcome: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.outcome = self._fn()
        except grpc.RpcError as exc:
            self.outcome = exc

    def result(self) -> Any:
        self._thread.join(RPC_TIMEOUT + 5)
        assert not self._thread.is_alive(), "the call never returned"
        return self.outcome


class Poller:
    """A Poll stream read on a thread, so the test can wait with a deadline."""

    def __init__(self, replica: Replica, group: str, worker: str, capacity: int = 4) -> None:
        self.replica = replica
        self.worker = worker
        request = tasks_pb2.PollRequest(
            group=group, worker_id=worker, capacity=capacity, lease=Duration(seconds=60)
        )
        self._call = replica.tasks.Poll(request)
        self._got: queue.Queue[tasks_pb2.PollResponse | Exception] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(
            f"{worker}'s stream to connect to replica {replica.name}",
            lambda: any(r.get("worker_id") == worker for r in replica.events("worker.connected")),
        )

    def _read(self) -> None:
        try:
            for response in self._call:
                self._got.put(response)
        except grpc.RpcError as exc:
            self._got.put(exc)

    def next(self) -> tasks_pb2.PollResponse:
        got = self._got.get(timeout=DEADLINE)
        assert isinstance(got, tasks_pb2.PollResponse), got
        return got

    def empty(self) -> bool:
        return self._got.empty()

    def cancel(self) -> None:
        self._call.cancel()


@pytest.fixture
def pollers() -> Iterator[list[Poller]]:
    made: list[Poller] = []
    yield made
    for poller in made:
        poller.cancel()


def sweeps_wait(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    steps: list[str],
    what: str,
) -> dict[str, list[tuple[int, list[int]]]]:
    """Both replicas' sweeps blocked on `what`, which the test holds; the steps must
    not have expired before the test took hold of it, or the race was not forced."""
    with closing(cluster.connect(autocommit=True)) as probe:
        pending = probe.execute(
            "SELECT count(*) FROM promises WHERE id = ANY(%s) AND state = 'PENDING'"
            " AND expire_time > %s",
            (steps, int(time.time() * 1000)),
        ).fetchone()
    assert pending == (len(steps),), f"the steps expired before the test held {what}"
    return {
        r.name: wait_until(
            f"replica {r.name}'s sweep to wait on {what}",
            lambda r=r: lock_waits(activity, r),
        )
        for r in cluster.replicas
    }


def start_workflow(replica: Replica, root: str, group: str) -> str:
    """Create the root promise that starts a workflow (with its PENDING INVOKE task)."""
    replica.promises.CreatePromise(
        pb.CreatePromiseRequest(
            id=root,
            param=types.Payload(data=b"[]"),
            tags={"troth:invoke": group, "troth:func": "race"},
        ),
        timeout=RPC_TIMEOUT,
    )
    return root


# -- two settles of one promise -------------------------------------------------------------


@pytest.mark.parametrize("keys", ["none", "different", "same"])
def test_two_replicas_settle_the_same_promise(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    locks: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    keys: str,
) -> None:
    promise_id = f"settle-{uuid.uuid4().hex[:8]}"
    cluster.a.promises.CreatePromise(pb.CreatePromiseRequest(id=promise_id), timeout=RPC_TIMEOUT)
    holder = locks()
    holder.execute("SELECT id FROM promises WHERE id = %s FOR UPDATE", (promise_id,))
    holder_pid = holder.info.backend_pid

    def settle(replica: Replica) -> Call:
        key = {"none": "", "different": f"key-{replica.name}", "same": "key"}[keys]
        value = types.Payload(data=f'"from {replica.name}"'.encode())
        metadata = (("troth-principal", f"caller-{replica.name}"),)
        if replica is cluster.b and keys == "none":  # different final states, too
            request = pb.RejectPromiseRequest(id=promise_id, value=value)
            return Call(lambda: replica.promises.RejectPromise(
                request, metadata=metadata, timeout=RPC_TIMEOUT))  # fmt: skip
        resolve = pb.ResolvePromiseRequest(id=promise_id, value=value, idempotency_key=key)
        return Call(lambda: replica.promises.ResolvePromise(
            resolve, metadata=metadata, timeout=RPC_TIMEOUT))  # fmt: skip

    calls = {replica.name: settle(replica) for replica in cluster.replicas}
    # Both replicas' transactions are in the race: each waits on the row we hold
    # (directly, or behind the other replica, which queued first).
    waits = {
        replica.name: wait_until(
            f"replica {replica.name}'s settle to wait on the row lock",
            lambda replica=replica: lock_waits(activity, replica),
        )
        for replica in cluster.replicas
    }
    first = queued_on(waits, holder_pid)

    holder.rollback()  # release: the replica queued first takes the row, then the other

    outcomes = {name: call.result() for name, call in calls.items()}
    winners = [
        name
        for name, got in outcomes.items()
        if isinstance(got, (pb.ResolvePromiseResponse, pb.RejectPromiseResponse)) and got.applied
    ]
    assert winners == [first], outcomes
    winner = winners[0]
    (loser,) = set(outcomes) - {winner}
    lost = outcomes[loser]
    if keys == "same":
        # A repeat carrying the winner's idempotency key: success, nothing changed.
        assert isinstance(lost, (pb.ResolvePromiseResponse, pb.RejectPromiseResponse)), lost
        assert not lost.applied
        assert lost.promise.value.data == f'"from {winner}"'.encode()
    else:
        assert isinstance(lost, grpc.RpcError), lost
        assert lost.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(lost).reason == "ALREADY_SETTLED"
        assert f"caller-{winner}" in (lost.details() or "")

    stored = cluster.b.promises.GetPromise(pb.GetPromiseRequest(id=promise_id)).promise
    assert stored.value.data == f'"from {winner}"'.encode()
    assert stored.settled_by == f"caller-{winner}"
    assert stored.state == (
        types.PROMISE_STATE_REJECTED
        if (winner, keys) == ("b", "none")
        else types.PROMISE_STATE_RESOLVED
    )
    # Log lines are flushed every 0.2 s: wait for the loser's own rpc line (logged
    # after its answer, as a state change would be) before counting state changes.
    wait_until(
        "both replicas' settle lines in their logs",
        lambda: (
            settled_changes(cluster.named(winner), promise_id)
            and rpc_lines(cluster.named(loser), promise_id, "Resolve", "Reject")
        ),
    )
    changes = {r.name: settled_changes(r, promise_id) for r in cluster.replicas}
    assert len(changes[winner]) == 1 and changes[loser] == [], changes


# -- two replicas delivering one task ---------------------------------------------------------


def test_two_replicas_deliver_a_task_exactly_once(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    locks: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    pollers: list[Poller],
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    root = start_workflow(cluster.a, f"deliver-{uuid.uuid4().hex[:8]}", group)
    with closing(cluster.connect(autocommit=True)) as probe:

        def task_row() -> tuple[Any, ...]:
            row = probe.execute(
                "SELECT id, state, counter, worker_id, lease_expire_time FROM tasks"
                " WHERE root_promise_id = %s",
                (root,),
            ).fetchall()
            assert len(row) == 1, row
            return row[0]

        task_id, state, counter, _, _ = task_row()
        assert (state, counter) == ("PENDING", 0)  # nobody polls the group yet

        # The root row first (the claim reads it FOR UPDATE once it holds the task),
        # then the task row (the claim's candidates are chosen with SKIP LOCKED).
        root_lock = locks()
        root_lock.execute("SELECT id FROM promises WHERE id = %s FOR UPDATE", (root,))
        task_lock = locks()
        task_lock.execute("SELECT id FROM tasks WHERE id = %s FOR UPDATE", (task_id,))

        by_replica = {
            r.name: Poller(r, group, f"worker-{r.name}-{uuid.uuid4().hex[:4]}")
            for r in cluster.replicas
        }
        pollers.extend(by_replica.values())

        # 1. The task row is ours: every claim of either replica (one per sweep
        # tick, and one on each stream's connect) skips it instead of waiting.
        stays_true(
            "no claim may wait or deliver while the test holds the task row",
            lambda: (
                all(p.empty() for p in by_replica.values())
                and not any(lock_waits(activity, r) for r in cluster.replicas)
            ),
        )
        assert task_row()[1:3] == ("PENDING", 0)

        # 2. Release the task row only: the first replica whose claim runs takes
        # it and then waits on the root row; the other's claims now skip a task
        # that a claim in flight holds.
        task_lock.rollback()
        blocked = wait_until(
            "one replica's claim to wait on the root row",
            lambda: [r for r in cluster.replicas if lock_waits(activity, r)],
        )
        assert len(blocked) == 1, blocked
        (claimer,) = blocked
        (other,) = [r for r in cluster.replicas if r is not claimer]
        ((_, blockers),) = lock_waits(activity, claimer)
        assert blockers == [root_lock.info.backend_pid]
        with pytest.raises(psycopg.errors.LockNotAvailable):  # the claimer holds the task
            probe.execute("SELECT id FROM tasks WHERE id = %s FOR UPDATE NOWAIT", (task_id,))
        stays_true(
            f"replica {other.name} must skip the task held by {claimer.name}'s claim",
            lambda: (
                all(p.empty() for p in by_replica.values())
                and not lock_waits(activity, other)
                and len(lock_waits(activity, claimer)) == 1
            ),
        )

        # 3. Release the root: the claim completes, on the claimer's stream only.
        root_lock.rollback()
        delivered = by_replica[claimer.name].next()
        worker = by_replica[claimer.name].worker
        assert delivered.task.id == task_id and delivered.root.id == root
        assert (delivered.task.state, delivered.task.counter) == (tasks_pb2.TASK_STATE_CLAIMED, 1)
        stays_true(
            f"the task must not reach replica {other.name}'s stream as well",
            lambda: by_replica[other.name].empty() and by_replica[claimer.name].empty(),
            seconds=2 * QUIET,
        )
        _, state, counter, holder, lease_expire = task_row()
        assert (state, counter, holder) == ("CLAIMED", 1, worker)
        assert lease_expire > time.time() * 1000 + 30_000  # the 60 s lease asked for
        # The one delivery is the lease the worker holds, through either replica.
        beat = other.tasks.Heartbeat(tasks_pb2.HeartbeatRequest(worker_id=worker))
        assert list(beat.task_ids) == [task_id]


# -- two replicas sweeping the same expired promises ------------------------------------------


def test_two_replicas_sweep_the_same_expired_promises(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    locks: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    pollers: list[Poller],
) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    root = start_workflow(cluster.a, f"sweep-{uuid.uuid4().hex[:8]}", group)
    poller = Poller(cluster.a, group, f"worker-{uuid.uuid4().hex[:4]}")
    pollers.append(poller)
    invoke = poller.next().task
    held = {"task_id": invoke.id, "counter": invoke.counter, "worker_id": poller.worker}

    # Two steps the workflow waits on, expiring in a second; the sweepers run
    # every 50 ms, one promise per transaction (--sweep-batch 1).
    steps = [f"{root}.{n}" for n in range(2)]
    for step in steps:
        cluster.a.promises.CreatePromise(
            pb.CreatePromiseRequest(
                id=step, ttl=Duration(seconds=1), fence=types.TaskFence(**held)
            ),
            timeout=RPC_TIMEOUT,
        )
    registered = cluster.b.tasks.RegisterCallbacks(
        tasks_pb2.RegisterCallbacksRequest(**held, promise_ids=steps), timeout=RPC_TIMEOUT
    )
    assert list(registered.settled) == []  # callbacks registered; the task stays CLAIMED

    # A sweep locks the expired promise it chose, then the active task of the
    # root whose callbacks it fires: that task row is ours.
    task_lock = locks()
    task_lock.execute("SELECT id FROM tasks WHERE id = %s FOR UPDATE", (invoke.id,))
    # Each replica's sweep takes an expired step (SKIP LOCKED: not the one the
    # other replica holds) and waits on the task row; only we block them.
    waits = sweeps_wait(cluster, activity, steps, "the task row")
    queued_on(waits, task_lock.info.backend_pid)
    with closing(cluster.connect(autocommit=True)) as probe:
        # Both steps are held, one by each replica's sweep.
        free = probe.execute(
            "SELECT id FROM promises WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED", (steps,)
        ).fetchall()
        assert free == []

        task_lock.rollback()

        def all_timed_out() -> bool:
            rows = probe.execute(
                "SELECT state, settled_by FROM promises WHERE id = ANY(%s)", (steps,)
            ).fetchall()
            return rows == [("REJECTED_TIMEDOUT", "troth:timeout")] * 2

        wait_until("both steps to be recorded as timed out", all_timed_out)

        def step_changes() -> dict[str, dict[str, int]]:
            return {
                r.name: {s: len(settled_changes(r, s)) for s in steps} for r in cluster.replicas
            }

        # Each replica settled the step it held, and nothing was settled twice
        # (log lines reach the file within 0.2 s).
        wait_until(
            "both timeouts in the logs",
            lambda: all(any(c[s] for c in step_changes().values()) for s in steps),
        )

        # Both expiries fired their callbacks into the one active task: still the
        # CLAIMED invoke, now marked for a resume; no second task, no callbacks left.
        tasks_now = probe.execute(
            "SELECT id, kind, state, counter, resume_pending FROM tasks WHERE root_promise_id = %s",
            (root,),
        ).fetchall()
        assert tasks_now == [(invoke.id, "INVOKE", "CLAIMED", 1, True)]
        left = probe.execute("SELECT count(*) FROM callbacks WHERE root_promise_id = %s", (root,))
        assert left.fetchone() == (0,)

        # Completing the invoke (through the other replica) yields exactly one RESUME,
        # delivered to the stream that suspended the workflow, with both timeouts.
        done = cluster.b.tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(**held), timeout=RPC_TIMEOUT
        )
        assert done.task.state == tasks_pb2.TASK_STATE_COMPLETED
        resume = poller.next()
        assert (
            resume.task.kind == tasks_pb2.TASK_KIND_RESUME and resume.task.root_promise_id == root
        )
        assert [(p.id, p.state) for p in resume.history] == [
            (s, types.PROMISE_STATE_REJECTED_TIMEDOUT) for s in steps
        ]
        kinds = probe.execute(
            "SELECT kind, state FROM tasks WHERE root_promise_id = %s ORDER BY create_time, kind",
            (root,),
        ).fetchall()
        assert kinds == [("INVOKE", "COMPLETED"), ("RESUME", "CLAIMED")]
        by_replica = step_changes()
        per_step = {s: sum(counts[s] for counts in by_replica.values()) for s in steps}
        assert per_step == dict.fromkeys(steps, 1), by_replica
        assert all(sum(counts.values()) == 1 for counts in by_replica.values()), by_replica


def test_two_replicas_resume_the_same_suspended_workflow(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    locks: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    pollers: list[Poller],
) -> None:
    """The root has no active task (it suspended), so there is no task row to lock:
    each replica's sweep settles a step and inserts the root's RESUME. The test's
    own uncommitted PENDING task for the root makes both inserts wait on the
    one-active-task-per-root index; on release one insert wins, the other
    replica's transaction fails on the index and runs again, resuming nothing twice."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    root = start_workflow(cluster.a, f"resume-{uuid.uuid4().hex[:8]}", group)
    poller = Poller(cluster.a, group, f"worker-{uuid.uuid4().hex[:4]}")
    pollers.append(poller)
    invoke = poller.next().task
    fence = types.TaskFence(task_id=invoke.id, counter=invoke.counter, worker_id=poller.worker)
    steps = [f"{root}.{n}" for n in range(2)]
    for step in steps:
        cluster.a.promises.CreatePromise(
            pb.CreatePromiseRequest(id=step, ttl=Duration(seconds=1), fence=fence),
            timeout=RPC_TIMEOUT,
        )
    suspended = cluster.b.tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(
            task_id=invoke.id, counter=invoke.counter, worker_id=poller.worker, suspend_on=steps
        ),
        timeout=RPC_TIMEOUT,
    )
    assert suspended.task.state == tasks_pb2.TASK_STATE_COMPLETED and list(suspended.settled) == []
    poller.cancel()  # nobody polls the group: the RESUME stays PENDING, for the record
    wait_until(
        "the stream's end on replica a",
        lambda: any(
            r.get("worker_id") == poller.worker for r in cluster.a.events("worker.disconnected")
        ),
    )

    blocker = locks()
    blocker.execute(
        'INSERT INTO tasks (id, root_promise_id, "group", kind, state, counter,'
        " resume_pending, create_time) VALUES (%s, %s, %s, 'RESUME', 'PENDING', 0, false, 0)",
        (f"test-{uuid.uuid4().hex}", root, group),
    )
    waits = sweeps_wait(cluster, activity, steps, "the active-task index")
    with closing(cluster.connect(autocommit=True)) as probe:
        for found in waits.values():  # both inserts wait for our transaction's outcome
            assert [blockers for _, blockers in found] == [[blocker.info.backend_pid]], waits
        free = probe.execute(
            "SELECT id FROM promises WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED", (steps,)
        ).fetchall()
        assert free == []  # each replica's sweep holds one step

        retried_before = write_retries(cluster, "conflict")
        blocker.rollback()

        def settled() -> list[tuple[Any, ...]]:
            return probe.execute(
                "SELECT state, settled_by FROM promises WHERE id = ANY(%s)", (steps,)
            ).fetchall()

        wait_until(
            "both steps to be recorded as timed out",
            lambda: settled() == [("REJECTED_TIMEDOUT", "troth:timeout")] * 2,
        )
        tasks_now = probe.execute(
            "SELECT kind, state, counter, resume_pending FROM tasks"
            " WHERE root_promise_id = %s ORDER BY create_time",
            (root,),
        ).fetchall()
        assert tasks_now == [("INVOKE", "COMPLETED", 1, False), ("RESUME", "PENDING", 0, False)]
        left = probe.execute("SELECT count(*) FROM callbacks WHERE root_promise_id = %s", (root,))
        assert left.fetchone() == (0,)

    # The insert that lost failed on the index: its transaction ran again, found the
    # winner's RESUME, and (if its step was still due) only settled the step.
    wait_until(
        "the losing insert's retry in the logs",
        lambda: write_retries(cluster, "conflict") > retried_before,
    )

    def step_changes() -> dict[str, int]:
        return {s: sum(len(settled_changes(r, s)) for r in cluster.replicas) for s in steps}

    wait_until("both timeouts in the logs", lambda: all(step_changes().values()))
    assert write_retries(cluster, "conflict") == retried_before + 1
    assert step_changes() == dict.fromkeys(steps, 1)


# -- a completion and a cancel of one workflow ---------------------------------------------


def test_a_completion_and_a_cancel_of_one_workflow_on_two_replicas(
    cluster: Cluster,
    activity: psycopg.Connection[tuple[Any, ...]],
    locks: Callable[[], psycopg.Connection[tuple[Any, ...]]],
    pollers: list[Poller],
) -> None:
    """A cancel of the root locks the root and its steps, then (firing the steps'
    callbacks) the root's task; CompleteTask locks the root, then the task: every
    write locks promises before tasks. The test holds a step, so the cancel on
    replica b holds the root while it waits; the completion on replica a then
    waits for the root, holding nothing the cancel needs. On release they run one
    after the other, with no deadlock (which would have stalled both replicas'
    writers for PostgreSQL's deadlock_timeout), and the workflow ends cancelled."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    root = start_workflow(cluster.a, f"cancel-{uuid.uuid4().hex[:8]}", group)
    poller = Poller(cluster.a, group, f"worker-{uuid.uuid4().hex[:4]}")
    pollers.append(poller)
    invoke = poller.next().task
    held = {"task_id": invoke.id, "counter": invoke.counter, "worker_id": poller.worker}
    step = f"{root}.0"
    fence = types.TaskFence(**held)
    cluster.a.promises.CreatePromise(
        pb.CreatePromiseRequest(id=step, fence=fence), timeout=RPC_TIMEOUT
    )
    registered = cluster.a.tasks.RegisterCallbacks(
        tasks_pb2.RegisterCallbacksRequest(**held, promise_ids=[step]), timeout=RPC_TIMEOUT
    )
    assert list(registered.settled) == []

    step_lock = locks()
    step_lock.execute("SELECT id FROM promises WHERE id = %s FOR UPDATE", (step,))
    cancel = Call(
        lambda: cluster.b.promises.CancelPromise(
            pb.CancelPromiseRequest(id=root, value=types.Payload(data=b'"stop"')),
            timeout=RPC_TIMEOUT,
        )
    )
    ((canceller, blockers),) = wait_until(
        "the cancel (holding the root) to wait on the step",
        lambda: lock_waits(activity, cluster.b),
    )
    assert blockers == [step_lock.info.backend_pid]
    complete = Call(
        lambda: cluster.a.tasks.CompleteTask(
            tasks_pb2.CompleteTaskRequest(**held, resolve_root=types.Payload(data=b'"done"')),
            timeout=RPC_TIMEOUT,
        )
    )
    ((_, blockers),) = wait_until(
        "the completion to wait on the root",
        lambda: lock_waits(activity, cluster.a),
    )
    assert blockers == [canceller]
    deadlocks_before = write_retries(cluster, "deadlock")

    step_lock.rollback()

    cancelled, completed = cancel.result(), complete.result()
    assert write_retries(cluster, "deadlock") == deadlocks_before
    assert isinstance(cancelled, pb.CancelPromiseResponse), cancelled
    assert cancelled.applied
    assert isinstance(completed, tasks_pb2.CompleteTaskResponse), completed
    assert completed.task.state == tasks_pb2.TASK_STATE_COMPLETED
    assert (
        completed.root.state == types.PROMISE_STATE_REJECTED_CANCELED
    )  # the cancel is not overridden
    stored = cluster.a.promises.GetPromise(pb.GetPromiseRequest(id=root)).promise
    assert stored.state == types.PROMISE_STATE_REJECTED_CANCELED and stored.value.data == b'"stop"'
    with closing(cluster.connect(autocommit=True)) as probe:
        rows = probe.execute(
            "SELECT kind, state FROM tasks WHERE root_promise_id = %s", (root,)
        ).fetchall()
        assert rows == [("INVOKE", "COMPLETED")]  # the root finished: no RESUME
        left = probe.execute("SELECT count(*) FROM callbacks WHERE root_promise_id = %s", (root,))
        assert left.fetchone() == (0,)


# -- a task delivered by one replica, completed through the other ----------------------------


def test_a_stream_gets_its_room_back_when_its_task_is_completed_elsewhere(
    cluster: Cluster, pollers: list[Poller]
) -> None:
    """Replica a delivered the task, so a counts it against the stream's capacity;
    the completion went through b, which cannot tell a. Each sweeper tick a checks
    what the database still shows as the worker's, and the room comes back."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    poller = Poller(cluster.a, group, f"worker-{uuid.uuid4().hex[:4]}", capacity=1)
    pollers.append(poller)
    first = start_workflow(cluster.a, f"room-{uuid.uuid4().hex[:8]}", group)
    task = poller.next().task
    assert task.root_promise_id == first
    cluster.b.tasks.CompleteTask(
        tasks_pb2.CompleteTaskRequest(
            task_id=task.id, counter=task.counter, worker_id=poller.worker,
            resolve_root=types.Payload(data=b'"done"'),
        ),
        timeout=RPC_TIMEOUT,
    )  # fmt: skip
    second = start_workflow(cluster.b, f"room-{uuid.uuid4().hex[:8]}", group)
    assert poller.next().task.root_promise_id == second
