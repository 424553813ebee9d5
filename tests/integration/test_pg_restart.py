"""PostgreSQL goes away under a running server: calls answer UNAVAILABLE
(STORE_UNAVAILABLE) meanwhile, the same server carries on by itself once the
database is back, and nothing it acknowledged is lost.

The database is a private cluster (initdb into a temporary directory, its own
port and socket directory), never the machine's shared PostgreSQL: these
tests stop and start it.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from _pg import skip_without_binaries
from _pg_cluster import Cluster, ClusterUnavailable
from _procs import Cleanup
from _support import LoadClients, ServerProcess, error_info, start_server

from troth.v1 import promises_pb2 as pb
from troth.v1 import promises_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from troth.v1 import types_pb2 as types
from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.store import open_store

RECOVERY_SECONDS = 5.0
"""How soon after the database is back the same server must answer again."""


# --- a private PostgreSQL cluster ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    try:
        made = Cluster.create()
    except ClusterUnavailable as exc:
        skip_without_binaries(str(exc))
    watchdog = Cleanup(made.stop_command(), remove=made.root)  # if this run is killed
    try:
        made.start_on_a_free_port()
        yield made
    finally:
        made.destroy()
        watchdog.cancel()


@pytest.fixture
def db_url(cluster: Cluster) -> str:
    return cluster.new_database()


# --- helpers --------------------------------------------------------------------------------


def assert_store_unavailable(error: grpc.RpcError) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert error_info(error).reason == "STORE_UNAVAILABLE"
    details = error.details() or ""
    assert "store is unavailable" in details and "retry later" in details, details


CRASH_MARKERS = ('"exception"', "Traceback", "crashed")
"""Log lines of a bug: a traceback logged, as opposed to a store failure the server
expects and handles (`store.write_failed`, `listen.disconnected`...)."""


def assert_no_crash(server: ServerProcess) -> None:
    assert server.proc.poll() is None, f"the server died:\n{server.log()[-3000:]}"
    log = server.log()
    crashes = [line for line in log.splitlines() if any(m in line for m in CRASH_MARKERS)]
    assert crashes == [], "\n".join(crashes[:10])


def wait_until_answering(stub: promises_pb2_grpc.PromiseServiceStub, timeout: float) -> float:
    """Seconds until a create succeeds again (each failure must be STORE_UNAVAILABLE)."""
    started = time.monotonic()
    while True:
        try:
            stub.CreatePromise(pb.CreatePromiseRequest(id=f"probe-{uuid.uuid4().hex}"), timeout=10)
            return time.monotonic() - started
        except grpc.RpcError as exc:
            assert_store_unavailable(exc)
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"still unavailable after {timeout} s: {exc.details()}"
                ) from exc
            time.sleep(0.05)


@dataclass
class Outcome:
    started: float
    ended: float
    method: str
    code: grpc.StatusCode
    reason: str | None = None
    details: str = ""


@dataclass
class Load(LoadClients):
    """Clients creating and resolving promises with unique ids, no retries."""

    address: str
    clients: int = 6
    acknowledged: dict[str, int] = field(default_factory=dict)
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def successes_after(self, moment: float) -> list[Outcome]:
        """Successful calls started after `moment`, in the order they ended."""
        with self.lock:
            ok = [o for o in self.outcomes if o.code == grpc.StatusCode.OK and o.started > moment]
        return sorted(ok, key=lambda o: o.ended)

    def _call(self, method: str, rpc: Callable[..., object], request: object) -> bool:
        started = time.monotonic()
        try:
            rpc(request, timeout=15)
        except grpc.RpcError as exc:
            try:
                reason: str | None = error_info(exc).reason
            except AssertionError:  # no rich status: not an answer of the troth server
                reason = None
            outcome = Outcome(
                started, time.monotonic(), method, exc.code(), reason, exc.details() or ""
            )
            with self.lock:
                self.outcomes.append(outcome)
            time.sleep(0.02)  # failures are immediate while the database is down
            return False
        with self.lock:
            self.outcomes.append(Outcome(started, time.monotonic(), method, grpc.StatusCode.OK))
        return True

    def _run(self, client: int) -> None:
        run = uuid.uuid4().hex[:6]
        with grpc.insecure_channel(self.address) as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            n = 0
            while not self.stop.is_set():
                pid = f"load-{run}-c{client}-{n}"
                n += 1
                if not self._call("create", stub.CreatePromise, pb.CreatePromiseRequest(id=pid)):
                    continue
                with self.lock:
                    self.acknowledged[pid] = types.PROMISE_STATE_PENDING
                # With an idempotency key, a settle the store committed but whose
                # reply was lost is recognised when the group committer runs it again.
                resolve = pb.ResolvePromiseRequest(
                    id=pid, value=types.Payload(data=pid.encode()), idempotency_key=pid
                )
                if self._call("resolve", stub.ResolvePromise, resolve):
                    with self.lock:
                        self.acknowledged[pid] = types.PROMISE_STATE_RESOLVED


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Seconds until `condition` holds (fails the test after `timeout`)."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


# --- the tests -------------------------------------------------------------------------------


def test_restart_under_load_loses_nothing_acknowledged(
    cluster: Cluster, db_url: str, tmp_path: Path
) -> None:
    server = start_server(tmp_path, "--migrate", db_url=db_url)
    load = Load(server.address)
    try:
        load.start()
        wait_for(lambda: len(load.acknowledged) >= 200, 15, "the load to get going")

        down = time.monotonic()
        cluster.stop("immediate")  # every connection cut, mid-transaction or mid-commit
        wait_for(
            lambda: any(o.code != grpc.StatusCode.OK and o.started > down for o in load.outcomes),
            10,
            "a call to fail while the database is down",
        )
        time.sleep(0.5)  # on purpose: the outage lasts a while, calls failing meanwhile
        cluster.start()
        up = time.monotonic()
        wait_for(lambda: bool(load.successes_after(up)), RECOVERY_SECONDS, "a call to succeed")
        recovered = load.successes_after(up)[0].ended
        recovery = recovered - up
        wait_for(lambda: len(load.successes_after(recovered)) >= 200, 15, "the load to carry on")
        load.finish()

        failures = [o for o in load.outcomes if o.code != grpc.StatusCode.OK]
        assert failures, "no call failed: the restart was not observed"
        early = [o for o in failures if o.ended < down]
        assert early == [], f"failures before the database went down: {early[:5]}"
        wrong = [o for o in failures if (o.code, o.reason) != (grpc.StatusCode.UNAVAILABLE,
                                                              "STORE_UNAVAILABLE")]  # fmt: skip
        assert wrong == [], f"failures other than UNAVAILABLE/STORE_UNAVAILABLE: {wrong[:5]}"
        # Two documented answers: nothing was changed ("retry later"), or the store went
        # away mid-commit and the outcome is unknown ("retry the same call"): both say
        # what to do, and both are UNAVAILABLE/STORE_UNAVAILABLE (checked above).
        unexplained = [
            o for o in failures if "retry later" not in o.details
            and "retry the same call" not in o.details
        ]  # fmt: skip
        assert unexplained == [], f"failures that do not say how to retry: {unexplained[:5]}"
        # Once calls succeed again they keep succeeding: no stale connection left over.
        late = [o for o in failures if o.started > recovered]
        assert late == [], f"failures after recovery: {late[:5]}"
        slowest = max(o.ended - o.started for o in failures)
        assert slowest < 5, f"a failing call took {slowest:.1f} s: it should fail fast"
        unavailable_for = max(o.ended for o in failures) - min(o.started for o in failures)
        print(
            f"\nfailed calls: {len(failures)} over {unavailable_for:.2f} s (slowest "
            f"{slowest:.2f} s); database down for {up - down:.2f} s; answering again "
            f"{recovery:.2f} s after it was back; acknowledged: {len(load.acknowledged)}"
        )
        assert_no_crash(server)

        # Every acknowledged write, asked of the same server that lived through it.
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            missing, wrong_state = [], []
            for pid, state in load.acknowledged.items():
                try:
                    got = stub.GetPromise(pb.GetPromiseRequest(id=pid), timeout=10).promise
                except grpc.RpcError as exc:
                    missing.append((pid, exc.code()))
                    continue
                if state == types.PROMISE_STATE_RESOLVED and (
                    got.state != types.PROMISE_STATE_RESOLVED or got.value.data != pid.encode()
                ):
                    wrong_state.append(pid)
            assert missing == [] and wrong_state == []
    finally:
        load.stop.set()
        server.stop()


class Poller:
    """A Poll stream read on a thread."""

    def __init__(self, stub: tasks_pb2_grpc.TaskServiceStub, group: str, worker: str) -> None:
        self._call = stub.Poll(tasks_pb2.PollRequest(group=group, worker_id=worker, capacity=4))
        self.got: queue.Queue[tasks_pb2.PollResponse | Exception] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self._call:
                self.got.put(response)
        except grpc.RpcError as exc:
            self.got.put(exc)

    def next(self, timeout: float) -> tasks_pb2.PollResponse:
        got = self.got.get(timeout=timeout)
        assert isinstance(got, tasks_pb2.PollResponse), got
        return got

    def cancel(self) -> None:
        self._call.cancel()


def _start_workflow(stub: promises_pb2_grpc.PromiseServiceStub, root: str, group: str) -> None:
    tags = {"troth:invoke": group, "troth:func": "f"}
    stub.CreatePromise(pb.CreatePromiseRequest(id=root, param=types.Payload(data=b"[]"), tags=tags))


def test_database_down_answers_unavailable_and_recovers_by_itself(
    cluster: Cluster, db_url: str, tmp_path: Path
) -> None:
    """Two replicas with a sweep far in the future: what reaches a replica from the
    other one after the outage can only have come through its LISTEN connection,
    reconnected on its own."""
    slow_sweep = ("--sweep-interval", "5m")
    servers: list[ServerProcess] = []
    pollers: list[Poller] = []
    try:
        open_store(db_url, migrate=True).close()
        with ThreadPoolExecutor(2) as pool:  # side by side: starting a server takes a while
            started = [pool.submit(start_server, tmp_path / n, *slow_sweep, db_url=db_url)
                       for n in ("a", "b")]  # fmt: skip
        servers += [f.result() for f in started if f.exception() is None]
        for f in started:
            f.result()  # raises the failure, if one failed, after the other is in `servers`
        a_channel, b_channel = servers[0].channel(), servers[1].channel()
        a, b = (
            promises_pb2_grpc.PromiseServiceStub(a_channel),
            promises_pb2_grpc.PromiseServiceStub(b_channel),
        )
        a_tasks = tasks_pb2_grpc.TaskServiceStub(a_channel)
        group = f"g-{uuid.uuid4().hex[:8]}"

        kept = f"kept-{uuid.uuid4().hex[:6]}"
        b.CreatePromise(pb.CreatePromiseRequest(id=kept))
        b.ResolvePromise(pb.ResolvePromiseRequest(id=kept, value=types.Payload(data=b"1")))
        watched = f"watched-{uuid.uuid4().hex[:6]}"
        b.CreatePromise(pb.CreatePromiseRequest(id=watched))
        watch = a.WatchPromise(pb.WatchPromiseRequest(id=watched), timeout=30)
        assert next(watch).promise.state == types.PROMISE_STATE_PENDING
        pollers.append(Poller(a_tasks, group, "before"))
        # The poller is connected once a task reaches it (from the other replica).
        _start_workflow(b, f"wf-{uuid.uuid4().hex[:8]}", group)
        assert pollers[0].next(10).task.kind == tasks_pb2.TASK_KIND_INVOKE

        cluster.stop("fast")
        down = time.monotonic()
        for stub in (a, b):
            with pytest.raises(grpc.RpcError) as caught:
                stub.GetPromise(pb.GetPromiseRequest(id=kept), timeout=10)
            assert_store_unavailable(caught.value)
            with pytest.raises(grpc.RpcError) as caught:
                stub.CreatePromise(pb.CreatePromiseRequest(id=f"down-{uuid.uuid4().hex}"))
            assert_store_unavailable(caught.value)
        with pytest.raises(grpc.RpcError) as caught:
            b.ResolvePromise(pb.ResolvePromiseRequest(id=watched))
        assert_store_unavailable(caught.value)
        assert time.monotonic() - down < 5, "calls hang instead of failing fast"
        for server in servers:
            assert server.proc.poll() is None, f"the server died:\n{server.log()[-3000:]}"

        cluster.start()
        recovery = [wait_until_answering(stub, RECOVERY_SECONDS) for stub in (a, b)]
        print(f"\nanswering again {max(recovery):.2f} s after the database was back")
        assert a.GetPromise(pb.GetPromiseRequest(id=kept)).promise.value.data == b"1"
        wait_for(lambda: "listen.reconnected" in servers[0].log(), 10, "A's LISTEN to reconnect")
        wait_for(lambda: "listen.reconnected" in servers[1].log(), 10, "B's LISTEN to reconnect")

        # A settle on B reaches the watch opened on A before the outage.
        b.ResolvePromise(pb.ResolvePromiseRequest(id=watched, value=types.Payload(data=b"7")))
        settled = next(watch).promise
        assert settled.state == types.PROMISE_STATE_RESOLVED and settled.value.data == b"7"

        # A workflow started on B reaches the Poll stream opened on A before the
        # outage, and one opened after it.
        _start_workflow(b, f"wf-{uuid.uuid4().hex[:8]}", group)
        assert pollers[0].next(10).task.kind == tasks_pb2.TASK_KIND_INVOKE
        pollers.append(Poller(a_tasks, f"{group}-after", "after"))
        _start_workflow(b, f"wf-{uuid.uuid4().hex[:8]}", f"{group}-after")
        assert pollers[1].next(10).task.kind == tasks_pb2.TASK_KIND_INVOKE

        for server in servers:
            assert_no_crash(server)
        a_channel.close()
        b_channel.close()
    finally:
        for poller in pollers:
            poller.cancel()
        for server in servers:  # both shut down side by side
            server.proc.send_signal(signal.SIGTERM)
        for server in servers:
            server.stop()


def test_the_first_calls_after_a_restart_need_no_retry_by_the_caller(
    cluster: Cluster, db_url: str, tmp_path: Path
) -> None:
    """The point reads' pool and the writer keep no pre-ping: every connection they
    pooled before the restart is dead, and each call that finds one must replace it
    and run again by itself, never answering STORE_UNAVAILABLE once the database is
    back."""
    server = start_server(tmp_path, "--migrate", "--sweep-interval", "5m", db_url=db_url)
    ids = [f"r-{uuid.uuid4().hex[:8]}-{n}" for n in range(8)]
    try:
        with server.channel() as channel:
            stub = promises_pb2_grpc.PromiseServiceStub(channel)
            for pid in ids:
                stub.CreatePromise(pb.CreatePromiseRequest(id=pid))
            with ThreadPoolExecutor(len(ids)) as pool:  # several pooled read connections
                for _ in range(3):
                    list(pool.map(lambda p: stub.GetPromise(pb.GetPromiseRequest(id=p)), ids))
                cluster.stop("immediate")
                cluster.start()
                found = list(pool.map(lambda p: stub.GetPromise(pb.GetPromiseRequest(id=p)), ids))
            assert [r.promise.id for r in found] == ids
            resolved = stub.ResolvePromise(
                pb.ResolvePromiseRequest(id=ids[0], value=types.Payload(data=b"1"))
            )
            assert resolved.promise.state == types.PROMISE_STATE_RESOLVED
            created = stub.CreatePromise(pb.CreatePromiseRequest(id=f"{ids[0]}-after"))
            assert created.promise.state == types.PROMISE_STATE_PENDING
        assert_no_crash(server)
    finally:
        server.stop()


def test_a_restart_drops_every_pooled_read_connection_at_once(
    db_url: str, cluster: Cluster
) -> None:
    """Several point-read connections are pooled when the database restarts: the
    first read to find one dead drops them all, so that no read after it fails on a
    neighbour of the dead one (there is no pre-ping to weed them out one by one)."""
    store = open_store(db_url, migrate=True)
    try:
        ids = [f"pooled-{n}" for n in range(6)]
        store.write(
            lambda tx: tx.insert_promises(
                [
                    Promise(id=i, state=PromiseState.PENDING, param=Payload(), value=Payload(),
                            tags={}, create_time=1)
                    for i in ids
                ]
            )
        )  # fmt: skip
        ready = threading.Barrier(len(ids))

        def read_together(promise_id: str) -> None:
            ready.wait(10)  # each thread holds a connection: the pool keeps them all
            for _ in range(20):
                assert store.get_promise(promise_id) is not None

        with ThreadPoolExecutor(len(ids)) as pool:
            list(pool.map(read_together, ids))
        cluster.stop("immediate")
        cluster.start()
        # One after the other: each would otherwise draw another dead connection.
        for promise_id in ids:
            found = store.get_promise(promise_id)
            assert found is not None and found.id == promise_id
            _, steps = store.promise_tree(promise_id)
            assert steps == []
    finally:
        store.close()
