"""PostgreSQL: a commit announces the promises it created, as it does those it settled."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest
from _pg import fresh_schema

from troth_server.store import Store, StoreEvent, open_store


@pytest.fixture
def replicas() -> Iterator[tuple[Store, Store]]:
    with fresh_schema() as url:
        a, b = open_store(url), open_store(url)
        yield a, b
        a.close()
        b.close()


def test_created_ids_reach_the_other_replica_in_as_many_payloads_as_needed(
    replicas: tuple[Store, Store],
) -> None:
    a, b = replicas
    heard: queue.SimpleQueue[StoreEvent] = queue.SimpleQueue()
    b.listen(heard.put)
    # The listener subscribes asynchronously: announce until B hears something.
    for _ in range(50):
        a.write(lambda tx: tx.announce((), (), ["warmup"]))
        try:
            heard.get(timeout=0.1)
            break
        except queue.Empty:
            continue
    while not heard.empty():
        heard.get()

    created = [f"created-{i:04d}-" + "x" * 40 for i in range(300)]
    settled = [f"settled-{i:04d}-" + "y" * 40 for i in range(300)]
    a.write(lambda tx: tx.announce({"orders"}, settled, created))
    events = [heard.get(timeout=5)]
    while sum(len(e.created_ids) + len(e.settled_ids) for e in events) < 600:
        events.append(heard.get(timeout=5))
    assert len(events) > 1, "more than one payload's worth"
    assert [i for e in events for i in e.created_ids] == created
    assert [i for e in events for i in e.settled_ids] == settled
    assert [g for e in events for g in e.groups] == ["orders"]
    assert heard.empty()
