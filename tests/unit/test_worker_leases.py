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
