"""The `Store` conformance suite: every dialect must pass every test here.

Each test gets a fresh database from the `store_url` fixture: a SQLite file,
or a new schema of the machine's PostgreSQL. A new dialect is one more entry in
`BACKENDS` (a context manager from the test's tmp_path to a database URL).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from _pg import admin, fresh_schema

from troth_server.domain import promise as domain
from troth_server.domain.promise import TIMEOUT_PRINCIPAL, Payload, Promise, PromiseState
from troth_server.store import (
    CommitOutcomeUnknown,
    PromiseQuery,
    Store,
    StoreError,
    WriteTx,
    open_store,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms
TIMER = {"troth:timer": "true"}
ALL_STATES = frozenset(PromiseState)


def _sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/t.db"


@contextmanager
def _sqlite_file(tmp_path: Path) -> Iterator[str]:
    yield _sqlite(tmp_path)


@contextmanager
def _postgres_schema(tmp_path: Path) -> Iterator[str]:
    with fresh_schema() as url:
        yield url


BACKENDS: list[object] = [
    pytest.param(_sqlite_file, id="sqlite"),
    pytest.param(_postgres_schema, id="postgres"),
]


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    make_url: Callable[[Path], AbstractContextManager[str]] = request.param
    with make_url(tmp_path) as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


def make(
    promise_id: str,
    *,
    state: PromiseState = PromiseState.PENDING,
    tags: dict[str, str] | None = None,
    expire_time: int | None = None,
    create_time: int = T0,
) -> Promise:
    """A promise as the domain would hand it to the store (settled ones fully filled in)."""
    pending = Promise(
        id=promise_id,
        state=PromiseState.PENDING,
        param=Payload(),
        value=Payload(),
        tags=tags or {},
        create_time=create_time,
        expire_time=expire_time,
    )
    if state is PromiseState.PENDING:
        return pending
    return replace(pending, state=state, settle_time=create_time + 1, settled_by="tester")


def insert(store: Store, *promises: Promise) -> None:
    store.write(lambda tx: tx.insert_promises(list(promises)))


def search(
    store: Store,
    id_glob: str = "*",
    *,
    states: frozenset[PromiseState] = frozenset(),
    tags: dict[str, str] | None = None,
    after_seq: int = 0,
    limit: int = 100,
    now: int = T0,
) -> list[str]:
    query = PromiseQuery(id_glob, states, tags or {}, after_seq=after_seq, limit=limit)
    return [row.promise.id for row in store.search_promises(query, now)]


# -- write, read back ----------------------------------------------------------------

FULL = Promise(
    id="wf/order-1.2",
    state=PromiseState.REJECTED,
    param=Payload({"content-type": "application/json", "x-trace": "é"}, b'{"a": [1, 2]}'),
    value=Payload({"content-type": "application/octet-stream"}, bytes(range(256))),
    tags={"troth:invoke": "orders", "troth:func": "ship", "note": "üñí ☃"},
    create_time=T0,
    settle_time=T0 + 5,
    expire_time=T0 + 60_000,
    idempotency_key_for_create="create-key",
    idempotency_key_for_settle="settle-key",
    settled_by="alice",
)

MINIMAL = Promise(
    id="bare",
    state=PromiseState.PENDING,
    param=Payload(),
    value=Payload(),
    tags={},
    create_time=0,
)


def test_insert_round_trips_every_field(store: Store) -> None:
    insert(store, FULL, MINIMAL)
    assert store.get_promise(FULL.id) == FULL
    got = store.get_promise(MINIMAL.id)
    assert got == MINIMAL
    assert got is not None
    assert got.settle_time is None and got.expire_time is None
    assert got.idempotency_key_for_create is None and got.settled_by is None
    assert type(got.param.data) is bytes and got.param.data == b""


def test_update_rewrites_all_but_the_id_and_times(store: Store) -> None:
    pending = replace(
        FULL,
        state=PromiseState.PENDING,
        value=Payload(),
        settle_time=None,
        idempotency_key_for_settle=None,
        settled_by=None,
    )
    insert(store, pending)
    settled = replace(
        pending,
        state=PromiseState.RESOLVED,
        value=Payload({"h": "v"}, b"\x00done"),
        settle_time=T0 + 7,
        idempotency_key_for_settle="k",
        settled_by="bob",
    )
    store.write(lambda tx: tx.update_promises([settled]))
    assert store.get_promise(pending.id) == settled

    # An update also carries rewrites (an early settle adopted by its creator, a
    # root's workflow version), but never moves the id, create or expire time.
    adopted = replace(
        settled,
        param=Payload(),
        tags={"troth:kind": "promise"},
        schema='{"type": "boolean"}',
        title="Publish?",
        message="Post 7",
        requested_by="workflow w",
        workflow_version="abc",
        idempotency_key_for_create="c",
    )
    store.write(lambda tx: tx.update_promises([replace(adopted, create_time=1, expire_time=None)]))
    assert store.get_promise(pending.id) == adopted


def test_write_returns_the_work_result_and_sees_its_own_rows(store: Store) -> None:
    insert(store, MINIMAL)

    def work(tx: WriteTx) -> dict[str, Promise]:
        tx.insert_promises([FULL])
        assert tx.get_promises([]) == {}
        return tx.get_promises([FULL.id, MINIMAL.id, "missing"])

    assert store.write(work) == {FULL.id: FULL, MINIMAL.id: MINIMAL}


def test_get_of_a_missing_id_is_none(store: Store) -> None:
    assert store.get_promise("nope") is None
    insert(store, MINIMAL)
    assert store.get_promise("nope") is None
    assert store.get_promise("BARE") is None


def test_failed_work_commits_nothing(store: Store) -> None:
    def work(tx: WriteTx) -> None:
        tx.insert_promises([MINIMAL])
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        store.write(work)
    assert store.get_promise(MINIMAL.id) is None


def test_duplicate_id_is_a_store_error_and_commits_nothing(store: Store) -> None:
    insert(store, MINIMAL)
    with pytest.raises(StoreError):
        insert(store, FULL, MINIMAL)
    assert store.get_promise(FULL.id) is None
    assert store.get_promise(MINIMAL.id) == MINIMAL


def test_a_conflict_in_a_pipeline_is_the_same_store_error_and_commits_nothing(
    store: Store,
) -> None:
    """On PostgreSQL the pipeline's error comes at its sync, outside SQLAlchemy's
    execution: it must still reach the store's retry rules as the DBAPIError
    SQLAlchemy raises, and end as the StoreError an unpipelined write ends with."""
    insert(store, MINIMAL)

    def work(tx: WriteTx) -> None:
        with tx.final_writes():
            tx.insert_promises([FULL, MINIMAL])

    with pytest.raises(StoreError, match="write conflict persisted"):
        store.write(work)
    assert store.get_promise(FULL.id) is None
    assert store.get_promise(MINIMAL.id) == MINIMAL


def test_final_writes_keep_working_after_a_rolled_back_transaction(store: Store) -> None:
    """The final writes run statements prepared once per connection. A rollback on
    that connection (here a conflict, after the writer ran other statements often
    enough that a driver would prepare them too) must not leave the next final
    writes naming statements the database no longer has."""
    insert(store, MINIMAL)
    for n in range(8):
        store.write(lambda tx: tx.pending_tasks("no-such-group", "w", 10, now=T0))

        def write_one(tx: WriteTx, n: int = n) -> None:
            with tx.final_writes():
                tx.insert_promises([make(f"before-{n}")])

        store.write(write_one)

    def conflict(tx: WriteTx) -> None:
        with tx.final_writes():
            tx.insert_promises([MINIMAL])

    with pytest.raises(StoreError, match="write conflict persisted"):
        store.write(conflict)

    def after(tx: WriteTx) -> None:
        assert tx.get_promises({MINIMAL.id}) == {MINIMAL.id: MINIMAL}
        with tx.final_writes():
            tx.insert_promises([make("after")])
            tx.update_promises([replace(make("before-0"), state=PromiseState.RESOLVED)])

    store.write(after)
    assert store.get_promise("after") == make("after")
    assert store.get_promise("before-0") == replace(make("before-0"), state=PromiseState.RESOLVED)


def test_final_writes_larger_than_the_socket_takes_are_all_committed(store: Store) -> None:
    """Tens of megabytes of rows in one transaction's final writes: the pipeline sends
    more than the socket's buffers hold while the database answers, and must read as
    it writes rather than wait on a full socket forever."""
    big = Payload({"content-type": "application/octet-stream"}, bytes(range(256)) * 256)
    rows = [replace(make(f"big-{n:03}"), param=big) for n in range(300)]

    def work(tx: WriteTx) -> None:
        with tx.final_writes():
            tx.insert_promises(rows)

    store.write(work)
    assert store.get_promise("big-299") == rows[-1]
    assert len(search(store, "big-*", limit=1000)) == len(rows)


def test_a_connection_lost_after_the_final_writes_went_is_an_unknown_outcome(
    tmp_path: Path,
) -> None:
    """The final writes go with the COMMIT: a connection lost once they went may have
    committed them, so the store says so (CommitOutcomeUnknown) rather than running
    the transaction again. The writes here wait on a row the test holds; the test
    then ends the writer's backend, as a database restart would."""
    with _postgres_schema(tmp_path) as url, admin() as holder, admin() as killer:
        store = open_store(url)
        try:
            insert(store, MINIMAL)
            schema = url.rsplit("search_path%3D", 1)[1]
            holder.execute("BEGIN")
            holder.execute(f'SELECT id FROM "{schema}".promises WHERE id = %s FOR UPDATE',
                           (MINIMAL.id,))  # fmt: skip

            def work(tx: WriteTx) -> None:
                with tx.final_writes():
                    tx.update_promises([replace(MINIMAL, state=PromiseState.RESOLVED)])

            with ThreadPoolExecutor(1) as pool:
                writing = pool.submit(store.write, work)
                waiting: list[object] = []
                deadline = time.monotonic() + 10
                while not waiting and time.monotonic() < deadline:
                    waiting = killer.execute(
                        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                        (holder.info.backend_pid,),
                    ).fetchall()
                    time.sleep(0.02)
                assert waiting, "the final writes never waited on the held row"
                killer.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
                with pytest.raises(CommitOutcomeUnknown):
                    writing.result(timeout=10)
            holder.execute("ROLLBACK")
            assert store.get_promise(MINIMAL.id) == MINIMAL
        finally:
            store.close()


def test_readers_see_only_committed_rows_and_are_not_blocked(store: Store) -> None:
    insert(store, MINIMAL)

    def work(tx: WriteTx) -> None:
        tx.insert_promises([FULL])
        tx.update_promises([replace(MINIMAL, state=PromiseState.RESOLVED, settle_time=1)])
        # A read on another connection while the write transaction is open.
        assert store.get_promise(FULL.id) is None
        assert store.get_promise(MINIMAL.id) == MINIMAL
        assert search(store) == [MINIMAL.id]

    store.write(work)
    assert search(store) == [MINIMAL.id, FULL.id]


# -- search ---------------------------------------------------------------------------

GLOB_IDS = ["a_b", "axb", "a%b", "a%%b", "aXXb", "a\\b", "ab", "xa_b", "a_b.1"]


@pytest.mark.parametrize(
    ("glob", "expected"),
    [
        ("*", GLOB_IDS),
        ("", GLOB_IDS),
        ("a_b", ["a_b"]),
        ("a%b", ["a%b"]),
        ("a\\b", ["a\\b"]),
        ("a*b", ["a_b", "axb", "a%b", "a%%b", "aXXb", "a\\b", "ab"]),
        ("a_*", ["a_b", "a_b.1"]),
        ("a%*", ["a%b", "a%%b"]),
        ("*_b", ["a_b", "xa_b"]),
        ("*%*", ["a%b", "a%%b"]),
        ("a?b", []),
        ("A_B", []),
        ("ax*", ["axb"]),
    ],
)
def test_search_by_id_glob_treats_like_wildcards_literally(
    store: Store, glob: str, expected: list[str]
) -> None:
    insert(store, *(make(i) for i in GLOB_IDS))
    assert search(store, glob) == expected


def test_search_by_id_glob_is_case_sensitive(store: Store) -> None:
    insert(store, make("Order-1"), make("order-2"), make("ORDER-3"))
    assert search(store, "Order-*") == ["Order-1"]
    assert search(store, "order-*") == ["order-2"]
    assert search(store, "*der-*") == ["Order-1", "order-2"]


def test_search_by_tags_is_an_exact_match_on_all_given_tags(store: Store) -> None:
    insert(
        store,
        make("p1", tags={"troth:invoke": "orders", "troth:func": "ship"}),
        make("p2", tags={"troth:invoke": "orders", "troth:func": "bill"}),
        make("p3", tags={"troth:invoke": "orders-eu"}),
        make("p4", tags={"a.b": "1", "n": "ünï ☃"}),
        make("p5", tags={}),
        make("p6", tags={"troth:invoke": "ORDERS"}),
    )
    assert search(store, tags={"troth:invoke": "orders"}) == ["p1", "p2"]
    assert search(store, tags={"troth:invoke": "orders", "troth:func": "bill"}) == ["p2"]
    assert search(store, tags={"troth:invoke": "orders", "missing": "x"}) == []
    assert search(store, tags={"troth:invoke": "order"}) == []
    assert search(store, tags={"a.b": "1"}) == ["p4"]
    assert search(store, tags={"n": "ünï ☃"}) == ["p4"]
    assert search(store, "p1*", tags={"troth:func": "ship"}) == ["p1"]
    assert search(store, "p2", tags={"troth:func": "ship"}) == []


@pytest.mark.parametrize("key", ["é", 'say "hi"', "back\\slash"])
def test_search_by_any_tag_key(store: Store, key: str) -> None:
    insert(store, make("p1", tags={key: "v"}), make("p2", tags={"k": "v"}))
    assert search(store, tags={key: "v"}) == ["p1"]


NOW = T0 + 1_000

# id -> promise; the reader at NOW sees the state named by the id's prefix.
STATE_ROWS = [
    make("pending.never"),
    make("pending.later", expire_time=NOW + 1),
    make("timedout.due", expire_time=NOW),  # still PENDING in the row
    make("timedout.past", expire_time=NOW - 500, tags={"troth:timer": "false"}),
    make("resolved.timer_due", expire_time=NOW - 1, tags=TIMER),  # still PENDING in the row
    make("pending.timer_later", expire_time=NOW + 1, tags=TIMER),
    make("resolved.row", state=PromiseState.RESOLVED, expire_time=NOW - 10),
    make("rejected.row", state=PromiseState.REJECTED),
    make("canceled.row", state=PromiseState.REJECTED_CANCELED, expire_time=NOW + 10),
    domain.expire(make("timedout.swept", expire_time=NOW - 100)),
    domain.expire(make("resolved.timer_swept", expire_time=NOW - 100, tags=TIMER)),
]
PREFIX = {
    "pending": PromiseState.PENDING,
    "resolved": PromiseState.RESOLVED,
    "rejected": PromiseState.REJECTED,
    "canceled": PromiseState.REJECTED_CANCELED,
    "timedout": PromiseState.REJECTED_TIMEDOUT,
}


def _seen_as(states: frozenset[PromiseState]) -> list[str]:
    return [p.id for p in STATE_ROWS if PREFIX[p.id.split(".")[0]] in states]


def test_state_rows_are_labelled_as_the_domain_sees_them() -> None:
    for p in STATE_ROWS:
        assert domain.effective(p, NOW).state is PREFIX[p.id.split(".")[0]], p.id


@pytest.mark.parametrize(
    "states",
    [
        *(frozenset({s}) for s in PromiseState),
        frozenset({PromiseState.PENDING, PromiseState.REJECTED_TIMEDOUT}),
        frozenset({PromiseState.RESOLVED, PromiseState.REJECTED_CANCELED}),
        ALL_STATES,
    ],
    ids=lambda states: "+".join(sorted(s.value for s in states)),
)
def test_search_by_state_as_a_reader_sees_it_at_now(
    store: Store, states: frozenset[PromiseState]
) -> None:
    insert(store, *STATE_ROWS)
    assert search(store, states=states, now=NOW) == _seen_as(states)


def test_search_by_state_moves_with_now(store: Store) -> None:
    insert(store, *STATE_ROWS)
    pending = frozenset({PromiseState.PENDING})
    assert search(store, states=pending, now=T0) == [
        "pending.never",
        "pending.later",
        "timedout.due",
        "timedout.past",
        "resolved.timer_due",
        "pending.timer_later",
    ]
    assert search(store, states=pending, now=NOW + 1) == ["pending.never"]
    resolved = search(store, states=frozenset({PromiseState.RESOLVED}), now=NOW + 1)
    assert resolved == [
        "resolved.timer_due",
        "pending.timer_later",
        "resolved.row",
        "resolved.timer_swept",
    ]


def test_search_returns_rows_as_stored(store: Store) -> None:
    """Rows come back as stored (with seq); applying `effective` is the caller's job."""
    insert(store, *STATE_ROWS)
    rows = store.search_promises(
        PromiseQuery("timedout.due", frozenset({PromiseState.REJECTED_TIMEDOUT}), {}, 0, 10), NOW
    )
    assert [row.promise for row in rows] == [STATE_ROWS[2]]


def test_after_seq_pages_follow_insertion_order(store: Store) -> None:
    first = [make(f"p{n}") for n in (5, 3, 9, 1, 7)]
    insert(store, *first)
    for n in (2, 8):
        insert(store, make(f"p{n}"))

    seen: list[str] = []
    seqs: list[int] = []
    after = 0
    while True:
        query = PromiseQuery("*", frozenset(), {}, after_seq=after, limit=2)
        rows = store.search_promises(query, T0)
        if not rows:
            break
        assert len(rows) <= 2
        seen += [row.promise.id for row in rows]
        seqs += [row.seq for row in rows]
        after = rows[-1].seq
        if len(seen) == 4:
            # Inserted after the first pages were read: shows up on a later page.
            insert(store, make("late"))
    assert seen == ["p5", "p3", "p9", "p1", "p7", "p2", "p8", "late"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_after_seq_combines_with_filters(store: Store) -> None:
    insert(store, *(make(f"p{n}", tags={"odd": str(n % 2)}) for n in range(10)))
    odd = {"odd": "1"}
    page1 = store.search_promises(PromiseQuery("*", frozenset(), odd, 0, 2), T0)
    assert [r.promise.id for r in page1] == ["p1", "p3"]
    assert search(store, tags=odd, after_seq=page1[-1].seq, limit=10) == ["p5", "p7", "p9"]
    assert search(store, tags=odd, limit=0) == []


# -- expiry ---------------------------------------------------------------------------


def test_expired_promise_ids_oldest_first_with_limit(store: Store) -> None:
    insert(
        store,
        make("e50", expire_time=T0 + 50),
        make("e10", expire_time=T0 + 10),
        make("never"),
        make("e30", expire_time=T0 + 30),
        make("e20-settled", state=PromiseState.RESOLVED, expire_time=T0 + 20),
        make("e25-swept", expire_time=T0 + 25),
        make("e40-timer", expire_time=T0 + 40, tags=TIMER),
        make("e51", expire_time=T0 + 51),
    )
    swept = domain.expire(make("e25-swept", expire_time=T0 + 25))
    store.write(lambda tx: tx.update_promises([swept]))

    assert store.expired_promise_ids(T0 + 50, 100) == ["e10", "e30", "e40-timer", "e50"]
    assert store.expired_promise_ids(T0 + 50, 2) == ["e10", "e30"]
    assert store.expired_promise_ids(T0 + 9, 100) == []
    assert store.expired_promise_ids(T0 + 10, 100) == ["e10"]
    assert store.expired_promise_ids(T0 + 10**9, 100)[-1] == "e51"


# -- durability -----------------------------------------------------------------------


def test_a_reopened_store_keeps_everything(store_url: str) -> None:
    first = open_store(store_url)
    insert(first, FULL, MINIMAL, *STATE_ROWS)
    settled = replace(MINIMAL, state=PromiseState.REJECTED_CANCELED, settle_time=9)
    first.write(lambda tx: tx.update_promises([settled]))
    before = first.search_promises(PromiseQuery("*", ALL_STATES, {}, 0, 100), NOW)
    first.close()

    second = open_store(store_url)
    try:
        assert second.get_promise(FULL.id) == FULL
        assert second.get_promise(MINIMAL.id) == settled
        assert second.search_promises(PromiseQuery("*", ALL_STATES, {}, 0, 100), NOW) == before
        assert second.expired_promise_ids(NOW, 100) == [
            "timedout.past",
            "resolved.timer_due",
            "timedout.due",
        ]
        # Sequence numbers keep growing after a restart: page tokens stay valid.
        insert(second, make("after-restart"))
        rows = second.search_promises(PromiseQuery("*", frozenset(), {}, before[-1].seq, 10), NOW)
        assert [r.promise.id for r in rows] == ["after-restart"]
    finally:
        second.close()


def test_timeout_principal_round_trips(store: Store) -> None:
    expired = domain.expire(make("t", expire_time=T0 + 1, tags=TIMER))
    insert(store, expired)
    got = store.get_promise("t")
    assert got == expired
    assert got is not None and got.settled_by == TIMEOUT_PRINCIPAL and got.is_timer


# -- SQLite specifics -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("mysql://u:secret@h/db", "unsupported database URL"),
    ],
)
def test_open_store_refuses_urls_it_cannot_serve(url: str, words: str) -> None:
    with pytest.raises(StoreError, match=words) as caught:
        open_store(url)
    assert "secret" not in str(caught.value)


def test_open_store_refuses_an_unknown_synchronous_mode(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="synchronous must be one of"):
        open_store(_sqlite(tmp_path), sqlite_synchronous="SOMETIMES")


def test_sqlite_file_is_in_wal_mode(tmp_path: Path) -> None:
    import sqlite3

    opened = open_store(_sqlite(tmp_path))
    opened.close()
    with sqlite3.connect(tmp_path / "t.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


# -- the store's clock -----------------------------------------------------------------


def test_the_newest_stored_time_covers_creates_and_settles(store: Store) -> None:
    assert store.newest_time() == 0
    insert(store, make("a", create_time=T0), make("b", create_time=T0 + 5))
    assert store.newest_time() == T0 + 5
    # A settle later than every create (the settle_time of make() is create_time + 1).
    insert(store, make("c", state=PromiseState.RESOLVED, create_time=T0 + 9))
    assert store.newest_time() == T0 + 10


def test_postgresql_has_a_clock_of_its_own_and_sqlite_none(store: Store, store_url: str) -> None:
    import time

    def in_tx(tx: WriteTx) -> int | None:
        return tx.database_time()

    if store_url.startswith("sqlite"):
        assert store.database_time() is None
        assert store.write(in_tx) is None
        return
    machine = time.time_ns() // 1_000_000
    read, written = store.database_time(), store.write(in_tx)
    assert read is not None and written is not None
    # The machine's PostgreSQL runs on this machine's clock.
    assert abs(read - machine) < 5_000 and abs(written - machine) < 5_000
