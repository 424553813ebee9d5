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
