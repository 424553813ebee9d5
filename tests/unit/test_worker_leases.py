"""The worker's own view of its leases, without a server (connecting is lazy).

A broken stream does not drop tasks (the integration tests show leases
outliving a dead server); what does is no heartbeat getting through for a
whole lease.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from troth import Client
from troth._leases import Held, Leases
from troth._tasks import TaskCalls
from troth.client import connection
from troth.v1 import tasks_pb2


@pytest.fixture
def leases() -> Iterator[Leases]:
    with Client("127.0.0.1:1") as client:  # never contacted
        yield Leases(TaskCalls(connection(client), "w1"), timedelta(seconds=3))


def test_a_lease_that_ran_out_unheard_is_dropped_and_remembered(leases: Leases) -> None:
    now = time.monotonic()
    lapsed = Held("t1", 1, "root-1", expires=now - 0.1)
    alive = Held("t2", 1, "root-2", expires=now + 2.0)
    leases._held.update({"t1": lapsed, "t2": alive})

    leases.expire(now)

    assert lapsed.lost
    assert not alive.lost
    assert leases._held == {"t2": alive}
    # Given back if a later heartbeat shows the server still counts it as ours.
    assert leases._dropped == {"t1": lapsed}


def test_nothing_is_dropped_while_leases_last(leases: Leases) -> None:
    now = time.monotonic()
    held = Held("t1", 1, "root-1", expires=now + 1.0)
    leases._held["t1"] = held
    leases.expire(now)
    assert leases._held == {"t1": held}
    assert not held.lost
    assert not leases._dropped


def _task(task_id: str, counter: int, root: str, server_expiry: float) -> tasks_pb2.Task:
    task = tasks_pb2.Task(id=task_id, counter=counter, root_promise_id=root)
    task.lease_expire_time.FromNanoseconds(int(server_expiry * 1e9))
    return task


def test_a_delivery_is_timed_by_the_servers_lease_and_dropped_if_stale_on_arrival(
    leases: Leases,
) -> None:
    leases._skew = 1_000_000.0  # the server's wall clock minus our monotonic clock
    now = time.monotonic()
    fresh = leases.accept(_task("t1", 1, "root-1", 1_000_000.0 + now + 2.5))
    assert fresh is not None
    # Mapped onto our clock: the server's expiry, not the arrival plus a lease.
    assert fresh.expires == pytest.approx(now + 2.5, abs=0.05)
    assert fresh.confirmed == pytest.approx(now - 0.5, abs=0.05)  # granted 3 s before expiry
    assert leases.is_fresh(fresh)
    # Sat in the socket buffer past its lease (a frozen process): dropped, not run.
    assert leases.accept(_task("t2", 1, "root-2", 1_000_000.0 + now - 0.1)) is None
    assert "t2" not in {h.task_id for h in leases.held()}
    assert "t2" in leases._dropped  # given back only if a heartbeat says it is still ours


def test_a_second_delivery_of_a_root_waits_for_the_first_which_is_lost(leases: Leases) -> None:
    first = leases.accept(tasks_pb2.Task(id="t1", counter=1, root_promise_id="root-1"))
    again = leases.accept(tasks_pb2.Task(id="t1", counter=2, root_promise_id="root-1"))
    assert first is not None and again is not None
    assert first.lost and again.after is first
    assert leases.held() == [again]
    leases.finished(first)
    assert first.stopped.is_set()
    other = leases.accept(tasks_pb2.Task(id="t2", counter=1, root_promise_id="root-2"))
    assert other is not None and other.after is None


def test_a_heartbeat_listing_a_task_at_another_counter_loses_it(leases: Leases) -> None:
    held = leases.accept(tasks_pb2.Task(id="t1", counter=1, root_promise_id="root-1"))
    assert held is not None
    response = tasks_pb2.HeartbeatResponse(task_ids=["t1"], counters={"t1": 2})
    leases._apply({"t1": held}, response, time.monotonic())
    assert held.lost
    assert leases.held() == []


def test_a_busy_task_is_kept_however_long_no_heartbeat_gets_through(leases: Leases) -> None:
    """Inside a step function, or holding its result: an outage of any length does not
    drop it (nor, then, give it back); the server's answer decides."""
    now = time.monotonic()
    held = Held("t1", 1, "root-1", expires=now - 3600.0)  # an hour past its lease
    leases._held["t1"] = held
    with leases.busy(held):
        leases.expire(now)
        assert leases.held() == [held]
        assert not held.lost
        assert not leases._dropped
        # The first heartbeat that gets through still lists it: kept, extended.
        response = tasks_pb2.HeartbeatResponse(task_ids=["t1"], counters={"t1": 1})
        assert leases._apply({"t1": held}, response, now) == []
        assert held.expires == pytest.approx(now + 3.0)
        assert leases.is_fresh(held)
    leases.expire(now + 10.0)  # no longer busy: dropped like any other
    assert held.lost


def test_a_busy_task_the_server_moved_on_is_lost_and_not_given_back(leases: Leases) -> None:
    now = time.monotonic()
    held = Held("t1", 1, "root-1", expires=now - 60.0)
    leases._held["t1"] = held
    with leases.busy(held):
        response = tasks_pb2.HeartbeatResponse(task_ids=["t1"], counters={"t1": 2})
        assert leases._apply({"t1": held}, response, now) == []
        assert held.lost
        assert leases.held() == []


class _Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def timed(clock: _Clock) -> Iterator[Leases]:
    """`Leases` (a 3 s lease) on a clock the test moves."""
    with Client("127.0.0.1:1") as client:  # never contacted
        yield Leases(TaskCalls(connection(client), "w1"), timedelta(seconds=3), clock=clock)


def _naming(task_id: str, counter: int) -> tasks_pb2.HeartbeatResponse:
    """A heartbeat's answer: the server leases `task_id` at `counter` to this worker."""
    return tasks_pb2.HeartbeatResponse(task_ids=[task_id], counters={task_id: counter})


def _beat(
    leases: Leases, clock: _Clock, at: float, answer: tasks_pb2.HeartbeatResponse
) -> list[str]:
    """A heartbeat sent at `at`, answered at once: the tasks it gives back, as `id@counter`."""
    clock.now = at
    before = {h.task_id: h for h in leases.held()}
    return [f"{h.task_id}@{h.counter}" for h in leases._apply(before, answer, at)]


def test_a_delivery_given_back_before_it_was_read_is_dropped_unrun(
    timed: Leases, clock: _Clock
) -> None:
    """The server leased t1 to this worker, and its heartbeats named it for a while
    before the delivery was read (a frozen process, a stalled socket): the worker gave
    it back (the server moved it on, counter 6, maybe to another worker). The delivery
    read after that must not run: its lease is gone, whatever `lease_expire_time` it
    carries, or a step function would run beside the worker it moved on to."""
    timed._skew = 1_000_000.0  # the server's wall clock minus our monotonic clock
    assert _beat(timed, clock, 100.0, _naming("t1", 5)) == []
    assert _beat(timed, clock, 101.5, _naming("t1", 5)) == ["t1@5"]  # never read: given back

    # Its `lease_expire_time` (leased at 100.0 for 3 s) has not passed: only having
    # given it back says it is not ours.
    late = _task("t1", 5, "root-1", 1_000_000.0 + 103.0)
    assert timed.accept(late) is None
    assert timed.held() == []
    # Nothing is left to give back again (it was), and nothing holds the root.
    assert "t1" not in timed._dropped
    assert timed._roots == {}

    # Leased to this worker again afterwards: that delivery is its own, and runs.
    again = timed.accept(tasks_pb2.Task(id="t1", counter=6, root_promise_id="root-1"))
    assert again is not None and not again.lost
    assert timed.held() == [again]


def test_a_delivery_is_dropped_if_given_back_while_the_release_is_on_its_way(
    timed: Leases, clock: _Clock
) -> None:
    """Decided on (under the lock) counts, not the release's answer: the delivery can be
    read between the heartbeat's answer and the Release call."""
    _beat(timed, clock, 100.0, _naming("t1", 5))
    assert _beat(timed, clock, 101.5, _naming("t1", 5)) == ["t1@5"]  # not released yet
    assert timed.accept(tasks_pb2.Task(id="t1", counter=5, root_promise_id="root-1")) is None


def test_heartbeats_back_to_back_do_not_give_back_a_delivery_in_flight(
    timed: Leases, clock: _Clock
) -> None:
    """Heartbeats can follow each other within milliseconds (one per runner whose lease
    is not fresh, the stream's reconnect, the heartbeat thread): two of them naming a
    task whose delivery is still on its way say nothing about it being lost. A task
    is given back only once it was not read half a lease (`ORPHAN_AFTER`) after a
    heartbeat's answer named it."""
    assert _beat(timed, clock, 100.0, _naming("t1", 5)) == []
    assert _beat(timed, clock, 100.01, _naming("t1", 5)) == []
    assert _beat(timed, clock, 100.02, _naming("t1", 5)) == []

    held = timed.accept(tasks_pb2.Task(id="t1", counter=5, root_promise_id="root-1"))
    assert held is not None
    assert _beat(timed, clock, 100.5, _naming("t1", 5)) == []
    assert not held.lost
    assert held.confirmed == 100.5  # the next heartbeat keeps it


def test_a_task_never_delivered_is_given_back_half_a_lease_after_it_was_named(
    timed: Leases, clock: _Clock
) -> None:
    """Claimed for this worker by a replica that died before delivering it: named by
    heartbeats for half a lease (1.5 s here), it is given back."""
    assert _beat(timed, clock, 100.0, _naming("t1", 5)) == []
    assert _beat(timed, clock, 101.0, _naming("t1", 5)) == []
    assert _beat(timed, clock, 101.4, _naming("t1", 5)) == []  # 1.4 s: maybe in flight
    assert _beat(timed, clock, 102.0, _naming("t1", 5)) == ["t1@5"]
    # At another counter it is another lease: its wait starts again.
    assert _beat(timed, clock, 102.5, _naming("t1", 6)) == []
    assert _beat(timed, clock, 103.0, _naming("t1", 7)) == []
    assert _beat(timed, clock, 104.0, _naming("t1", 7)) == []
    assert _beat(timed, clock, 105.0, _naming("t1", 7)) == ["t1@7"]
    # Named no more: forgotten.
    assert _beat(timed, clock, 105.5, tasks_pb2.HeartbeatResponse()) == []
    assert timed._unknown == {}
