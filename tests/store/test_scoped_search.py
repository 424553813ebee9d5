"""A scoped principal's search (`PromiseQuery.id_prefixes`) on SQLite and PostgreSQL: its
ids' ranges of the id index, exact for any prefix (LIKE's wildcards, the backslash, the
last code point), in creation order either way, page after page; a small tenant's rows
sorted, a big one's walked in seq order (`_reads.SORT_TENANT_ROWS`), the same pages."""

from __future__ import annotations

import pytest

from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.store import PromiseOrder, PromiseQuery, Store, _reads

T0 = 1_767_225_600_000
TOP = chr(0x10FFFF)

IDS = [
    "acme/1", "acme%/2", "acme_/3", "acmeX/4", "acme/5", "acme\\/6", "acme/7", "acm/8",
    "acme", "acme0", f"a{TOP}/9", f"a{TOP}", "b/10", f"a{TOP}{TOP}", "acme/11",
]  # fmt: skip


def _ids(store: Store, prefixes: tuple[str, ...], order: PromiseOrder) -> list[str]:
    found: list[str] = []
    after = 0
    while True:
        query = PromiseQuery("", frozenset(), {}, after, 2, order=order, id_prefixes=prefixes)
        rows = store.search_promises(query, T0)
        found += [r.promise.id for r in rows]
        if len(rows) < 2:
            return found
        after = rows[-1].seq


@pytest.mark.parametrize("tenant_rows", [_reads.SORT_TENANT_ROWS, 1], ids=["sorted", "walked"])
def test_a_scoped_search_finds_exactly_its_prefixes_in_creation_order(
    store: Store, monkeypatch: pytest.MonkeyPatch, tenant_rows: int
) -> None:
    monkeypatch.setattr(_reads, "SORT_TENANT_ROWS", tenant_rows)
    store.write(
        lambda tx: tx.insert_promises(
            [
                Promise(
                    id=i,
                    state=PromiseState.PENDING,
                    param=EMPTY,
                    value=EMPTY,
                    tags={},
                    create_time=T0,
                )
                for i in IDS
            ]
        )
    )
    for prefixes in [
        ("acme/",),
        ("acme%",),
        ("acme_",),
        ("acme\\",),
        ("acme",),
        (f"a{TOP}",),
        (f"a{TOP}", "b/"),
        ("acme/", "acm/"),
        ("",),
        ("zzz",),
    ]:
        expected = [i for i in IDS if i.startswith(prefixes)]
        assert _ids(store, prefixes, PromiseOrder.CREATED_ASC) == expected, prefixes
        assert _ids(store, prefixes, PromiseOrder.CREATED_DESC) == expected[::-1], prefixes


def test_the_end_of_a_prefixs_range() -> None:
    after = _reads._after_prefix
    assert after("acme/") == "acme0"
    assert after("a\ud7ff") == "a\ue000"
    assert after(f"a{TOP}") == "b"
    assert after(f"{TOP}{TOP}") is None
    assert after("") is None
