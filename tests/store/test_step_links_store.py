"""Step links in the store (revision 0005), on SQLite and PostgreSQL: the backfill from
the old id-prefix rule, the queries that follow parent_id, and their index plans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _pg import fresh_schema
from alembic import command

from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.store import PromiseOrder, PromiseQuery, open_store
from troth_server.store._migrate import alembic_config

T0 = 1_767_225_600_000
ROOT_TAGS = '{"troth:invoke": "g", "troth:func": "wf"}'


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
    else:
        with fresh_schema(migrate=False) as url:
            yield url


def _insert(conn: sa.Connection, promise_id: str, tags: str = "{}", state: str = "PENDING") -> None:
    conn.execute(
        sa.text(
            "INSERT INTO promises (id, state, param_headers, param_data, value_headers,"
            " value_data, tags, timer, create_time) VALUES (:id, :state, '{}', :b, '{}', :b,"
            " :tags, false, 1)"
        ),
        {"id": promise_id, "state": state, "tags": tags, "b": b""},
    )


def test_the_upgrade_backfills_steps_from_the_old_prefix_rule(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            config = alembic_config(conn)
            command.upgrade(config, "0004")
            _insert(conn, "wf", ROOT_TAGS)
            _insert(conn, "wf.0")
            _insert(conn, "wf.1", ROOT_TAGS)  # a child workflow
            _insert(conn, "wf.1.0")
            _insert(conn, "approval-x")  # an explicit id the workflow waits on
            _insert(conn, "plain")
            _insert(conn, "plain.0")  # under a promise that is no workflow
            conn.execute(
                sa.text(
                    'INSERT INTO callbacks (promise_id, root_promise_id, "group", create_time)'
                    " VALUES ('approval-x', 'wf', 'g', 1)"
                )
            )
            command.upgrade(config, "head")
            rows = conn.execute(sa.text("SELECT id, root_id, parent_id FROM promises")).all()
    finally:
        engine.dispose()
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        "wf": (None, None),
        "wf.0": ("wf", "wf"),
        "wf.1": ("wf", "wf"),
        "wf.1.0": ("wf", "wf.1"),
        "approval-x": ("wf", "wf"),
        "plain": (None, None),
        "plain.0": (None, None),
    }


def _step(
    promise_id: str, parent: str | None, state: PromiseState = PromiseState.PENDING
) -> Promise:
    return Promise(
        id=promise_id, state=state, param=EMPTY, value=EMPTY, tags={}, create_time=T0,
        root_id=parent, parent_id=parent,
    )  # fmt: skip


def test_history_and_pending_steps_follow_parent_id_not_the_prefix(db_url: str) -> None:
    store = open_store(db_url, migrate=True)
    try:
        root = _step("wf", None)
        store.write(
            lambda tx: tx.insert_promises(
                [
                    root,
                    _step("wf.0", "wf", PromiseState.RESOLVED),
                    _step("wf.1", "wf"),
                    _step("wf.invoice-42", None),  # nobody's
                    _step("elsewhere", "wf"),  # an explicit id of the workflow's
                    _step("other.0", "other"),
                ]
            )
        )
        found, history = store.promise_tree("wf")
        assert found is not None and found.id == "wf"
        assert [p.id for p in history] == ["wf.0", "wf.1", "elsewhere"]
        assert history[0].parent_id == "wf" and history[0].root_id == "wf"
        pending = store.write(lambda tx: tx.pending_step_ids(["wf", "other"]))
        assert sorted(pending) == ["elsewhere", "other.0", "wf.1"]
        assert store.write(lambda tx: tx.pending_step_ids([])) == []
    finally:
        store.close()


def test_a_search_by_parent_finds_the_steps_by_record(db_url: str) -> None:
    """`SearchPromises.parent_id` (what `troth export` reads a history with): a named
    step is found, another workflow's `<root>.<n>` is not; a child's steps are its own."""
    store = open_store(db_url, migrate=True)
    try:
        store.write(
            lambda tx: tx.insert_promises(
                [
                    _step("wf", None),
                    _step("wf.0", "wf", PromiseState.RESOLVED),
                    _step("approve-wf", "wf"),  # a step with an explicit id
                    _step("wf.1", "wf"),  # a child workflow
                    _step("wf.1.0", "wf.1"),
                    _step("wf.9", "other"),
                ]
            )
        )

        def steps(parent: str, **kwargs: Any) -> list[str]:
            query = PromiseQuery("*", frozenset(), {}, after_seq=0, limit=100, parent_id=parent,
                                 **kwargs)  # fmt: skip
            return [row.promise.id for row in store.search_promises(query, T0)]

        assert steps("wf") == ["wf.0", "approve-wf", "wf.1"]
        assert steps("wf.1") == ["wf.1.0"]
        assert steps("wf", order=PromiseOrder.CREATED_DESC) == ["wf.1", "approve-wf", "wf.0"]
        assert steps("nobody") == []
    finally:
        store.close()


def _plan(conn: Any, sql: str, dialect: str, params: Any = None) -> str:
    explain = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
    rows = conn.exec_driver_sql(explain + sql, params).all()
    return "\n".join(str(row[-1] if dialect == "sqlite" else row[0]) for row in rows)


def test_the_link_queries_use_their_indexes(db_url: str) -> None:
    """The cascade's query runs on every settle of a workflow root (once per nesting
    level), and the history's on every delivery: both must be index lookups."""
    store = open_store(db_url, migrate=True)
    try:
        dialect = "sqlite" if db_url.startswith("sqlite") else "postgresql"
        # A table with many histories, mostly settled: what a planner must see through.
        rows = [
            _step(f"wf-{n // 20}.{n % 20}", f"wf-{n // 20}", PromiseState.RESOLVED)
            for n in range(6000)
        ]
        rows += [_step(f"wf-{n}.99", f"wf-{n}") for n in range(0, 300, 7)]
        store.write(lambda tx: tx.insert_promises(rows))

        def plans(tx: Any) -> tuple[str, str]:
            conn = tx._conn
            if dialect == "postgresql":
                # As the writer's connection plans them (enable_seqscan off is its setting).
                conn.exec_driver_sql("ANALYZE promises")
            # The statement the writer sends when roots settle (on SQLite it names
            # its index: without statistics SQLite's choice between the two that fit
            # followed the order a migration left them in).
            sql, params = tx._compiled.pending_steps.bound(["a", "b"])
            pending = _plan(conn, sql, dialect, params)
            history = _plan(
                conn, "SELECT * FROM promises WHERE parent_id = 'a' ORDER BY seq", dialect
            )
            return pending, history

        pending, history = store.write(plans)
    finally:
        store.close()
    assert "ix_promises_pending_parent" in pending, pending
    assert "ix_promises_parent_seq" in history, history
