"""`Store.search_promises` orders, cursors and cut-off: the same answers on every dialect."""

from __future__ import annotations

import pytest

from troth_server.domain.promise import Payload, Promise, PromiseState
from troth_server.store import PromiseOrder, PromiseQuery, Store

T0 = 1_767_225_600_000
NONE = frozenset[PromiseState]()


def make(promise_id: str, create_time: int, expire_time: int | None) -> Promise:
    return Promise(
        id=promise_id,
        state=PromiseState.PENDING,
        param=Payload(),
        value=Payload(),
        tags={},
        create_time=create_time,
        expire_time=expire_time,
    )


# Inserted in this order (so seq follows it): (id, create_time, expire_time).
ROWS = [
    ("n1", T0, None),
    ("e5", T0 + 1, T0 + 5_000),
    ("e2a", T0 + 2, T0 + 2_000),
    ("n2", T0 + 3, None),
    ("e2b", T0 + 4, T0 + 2_000),
    ("e9", T0 + 5, T0 + 9_000),
]


@pytest.fixture
def filled(store: Store) -> Store:
    store.write(lambda tx: tx.insert_promises([make(*row) for row in ROWS]))
    return store


def pages(
    store: Store, order: PromiseOrder, size: int, created_before: int | None = None
) -> list[str]:
    """Every id, paging `size` at a time with the cursor of each page's last row."""
    seen: list[str] = []
    after_seq, after_expire = 0, None
    while True:
        query = PromiseQuery(
            "*",
            NONE,
            {},
            after_seq=after_seq,
            limit=size,
            order=order,
            after_expire_time=after_expire,
            created_before=created_before,
        )
        rows = store.search_promises(query, T0)
        seen += [r.promise.id for r in rows]
        if len(rows) < size:
            return seen
        after_seq, after_expire = rows[-1].seq, rows[-1].promise.expire_time


@pytest.mark.parametrize("size", [1, 2, 4, 10])
def test_orders_page_without_gaps_or_repeats(filled: Store, size: int) -> None:
    ids = [row[0] for row in ROWS]
    assert pages(filled, PromiseOrder.CREATED_ASC, size) == ids
    assert pages(filled, PromiseOrder.CREATED_DESC, size) == ids[::-1]
    assert pages(filled, PromiseOrder.EXPIRE_TIME_ASC, size) == [
        "e2a",
        "e2b",
        "e5",
        "e9",
        "n1",
        "n2",
    ]


def test_created_before_cuts_off_in_every_order(filled: Store) -> None:
    cut = T0 + 4  # n1, e5, e2a, n2
    assert pages(filled, PromiseOrder.CREATED_ASC, 2, cut) == ["n1", "e5", "e2a", "n2"]
    assert pages(filled, PromiseOrder.CREATED_DESC, 2, cut) == ["n2", "e2a", "e5", "n1"]
    assert pages(filled, PromiseOrder.EXPIRE_TIME_ASC, 3, cut) == ["e2a", "e5", "n1", "n2"]
    assert pages(filled, PromiseOrder.CREATED_ASC, 2, T0) == []
