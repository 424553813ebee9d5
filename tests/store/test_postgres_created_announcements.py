"""PostgreSQL: a commit announces the promises it created, as it does those it settled:
in one payload, compressed if need be, or as few as carry them."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterator

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


@pytest.mark.parametrize(
    "id_of, payloads",
    [
        pytest.param(lambda i, kind: f"{kind}-{i:04d}-" + "x" * 40, 1, id="one payload"),
        # Random ids compress to about half: 3000 of them outgrow one payload.
        pytest.param(lambda i, kind: str(uuid.uuid4()), 2, id="as few as carry them"),
    ],
)
def test_created_ids_reach_the_other_replica_in_one_payload_or_as_few_as_carry_them(
    replicas: tuple[Store, Store], id_of: Callable[[int, str], str], payloads: int
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

    count = 300 if payloads == 1 else 1500
    created = [id_of(i, "created") for i in range(count)]
    settled = [id_of(i, "settled") for i in range(count)]
    a.write(lambda tx: tx.announce({"orders"}, settled, created))
    events = [heard.get(timeout=5)]
    while sum(len(e.created_ids) + len(e.settled_ids) for e in events) < 2 * count:
        events.append(heard.get(timeout=5))
    assert len(events) >= payloads
    assert [i for e in events for i in e.created_ids] == created
    assert [i for e in events for i in e.settled_ids] == settled
    assert [g for e in events for g in e.groups] == ["orders"]
    assert heard.empty()
