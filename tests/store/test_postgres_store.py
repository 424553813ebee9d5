"""PostgreSQL specifics of the store: announcements between replicas, and row locks.

Two `Store`s opened on one schema stand for two replicas.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from _pg import fresh_schema
from test_store import T0, insert, make

from troth_server.store import Store, StoreEvent, open_store


@pytest.fixture
def replicas() -> Iterator[tuple[Store, Store]]:
    with fresh_schema() as url:
        a, b = open_store(url), open_store(url)
        yield a, b
        a.close()
        b.close()


def test_postgres_stores_are_shared_and_sqlite_is_not(
    replicas: tuple[Store, Store], tmp_path: object
) -> None:
    assert replicas[0].shared
    sqlite = open_store(f"sqlite:///{tmp_path}/t.db")
    assert not sqlite.shared
    sqlite.close()


def test_an_announcement_reaches_the_other_replica_only_after_commit(
    replicas: tuple[Store, Store],
) -> None:
    a, b = replicas
    heard_a: queue.SimpleQueue[StoreEvent] = queue.SimpleQueue()
    heard_b: queue.SimpleQueue[StoreEvent] = queue.SimpleQueue()
    a.listen(heard_a.put)
    b.listen(heard_b.put)
    # The listeners subscribe asynchronously: announce until B hears something.
    for _ in range(50):
        a.write(lambda tx: tx.announce({"warmup"}, ()))
        try:
            heard_b.get(timeout=0.1)
            break
        except queue.Empty:
            continue
    while not heard_b.empty():
        heard_b.get()

    class Abort(Exception):
        pass

    def announce_then_fail(tx: object) -> None:
        tx.announce({"never"}, ["never"])  # type: ignore[attr-defined]
        raise Abort

    with pytest.raises(Abort):
        a.write(announce_then_fail)
    many = [f"settled-{i:04d}-" + "x" * 40 for i in range(400)]  # more than one payload
    a.write(lambda tx: tx.announce({"orders", "billing"}, many))

    events = [heard_b.get(timeout=5)]
    while sum(len(e.settled_ids) for e in events) < len(many):
        events.append(heard_b.get(timeout=5))
    assert {g for e in events for g in e.groups} == {"orders", "billing"}
    assert [i for e in events for i in e.settled_ids] == many
    assert not any(e.resync for e in events)
    # A rolled-back announcement is never heard; a replica ignores its own.
    assert heard_b.empty()
    assert heard_a.empty()


def test_a_sweep_skips_expired_promises_another_transaction_holds(
    replicas: tuple[Store, Store],
) -> None:
    a, b = replicas
    insert(a, *(make(f"e{i}", expire_time=T0 + i) for i in range(1, 5)))
    holding = threading.Event()
    release = threading.Event()
    held: list[str] = []

    def hold(tx: object) -> None:
        held.extend(tx.expired_promise_ids(T0 + 10, 2))  # type: ignore[attr-defined]
        holding.set()
        release.wait(10)

    holder = threading.Thread(target=a.write, args=(hold,))
    holder.start()
    try:
        assert holding.wait(10)
        # B does not wait for A's rows: it takes the others at once.
        other = b.write(lambda tx: tx.expired_promise_ids(T0 + 10, 10))
    finally:
        release.set()
        holder.join()
    assert held == ["e1", "e2"]
    assert other == ["e3", "e4"]


def test_writes_never_plan_a_sequential_scan(replicas: tuple[Store, Store]) -> None:
    """A young table that grew faster than autovacuum analyzes it must not turn each
    batch's id lookup into a sequential scan (it halved throughput in bench/sweep.py)."""
    a, _ = replicas
    ids = ", ".join(f"'new-{n}'" for n in range(256))  # a batch's worth of creates
    lookup = f"EXPLAIN SELECT * FROM promises WHERE id = ANY(ARRAY[{ids}]) ORDER BY id FOR UPDATE"
    a.write(
        lambda tx: tx._conn.exec_driver_sql(  # type: ignore[attr-defined]
            "INSERT INTO promises (id, state, param_headers, param_data, value_headers,"
            " value_data, tags, timer, create_time) SELECT 'bulk-' || g, 'PENDING', '{}',"
            " '', '{}', '', '{}', false, 1 FROM generate_series(1, 60000) g"
        )
    )

    def plan(conn: Any) -> str:
        return "\n".join(row[0] for row in conn.exec_driver_sql(lookup).all())

    with a._engines.read.connect() as conn:  # type: ignore[attr-defined]
        assert "Seq Scan" in plan(conn)  # the planner, left to itself, on this table
    written = a.write(lambda tx: plan(tx._conn))  # type: ignore[attr-defined]
    assert "Seq Scan" not in written, written


def test_a_heartbeat_and_a_completion_of_one_worker_share_a_batch() -> None:
    """On PostgreSQL a heartbeat reads its worker's tasks unlocked and locks them after
    the promises; a completion of one of them in the same batch still finds its root."""
    from troth_server.domain.promise import EMPTY, CreateRequest, Payload, PromiseState
    from troth_server.domain.promise import SettleRequest as Settle
    from troth_server.writes.group_commit import _fold, _Item
    from troth_server.writes.ops.complete import CompleteOp
    from troth_server.writes.ops.create import CreateOp
    from troth_server.writes.ops.leases import ClaimOp, HeartbeatOp

    with fresh_schema() as url:
        store = open_store(url)
        try:
            now = T0

            def run(*ops: Any) -> list[tuple[bool, Any]]:
                items = [_Item(op) for op in ops]
                return store.write(lambda tx: _fold(tx, items, now))[0]

            tags = {"troth:invoke": "g", "troth:func": "f"}
            run(CreateOp(CreateRequest("wf", Payload({}, b"[]"), tags), None))
            [(claim_ok, claimed)] = run(ClaimOp("g", "w1", 1, 10_000))
            assert claim_ok, claimed
            task = claimed[0].task
            done = Settle("wf", PromiseState.RESOLVED, EMPTY)
            (beat_ok, beat), (done_ok, completed) = run(
                HeartbeatOp("w1", 10_000), CompleteOp(task.id, task.counter, "w1", done)
            )
            assert beat_ok and [t.id for t in beat.tasks] == [task.id]
            assert done_ok, completed
            _, root = completed
            assert root is not None and root.state is PromiseState.RESOLVED
        finally:
            store.close()
