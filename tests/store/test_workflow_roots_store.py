"""Workflow roots in the store (revision 0012), on SQLite and PostgreSQL: the upgrade
copies each root's group and name out of its tags, and a promise written afterwards
gets them at create; nothing else has them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from _pg import fresh_schema
from alembic import command

from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.store import WorkflowQuery, open_store
from troth_server.store._migrate import alembic_config

T0 = 1_767_225_600_000


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
    else:
        with fresh_schema(migrate=False) as url:
            yield url


def _insert(conn: sa.Connection, promise_id: str, tags: str) -> None:
    conn.execute(
        sa.text(
            "INSERT INTO promises (id, state, param_headers, param_data, value_headers,"
            " value_data, tags, timer, create_time) VALUES (:id, 'PENDING', '{}', :b, '{}', :b,"
            " :tags, false, 1)"
        ),
        {"id": promise_id, "tags": tags, "b": b""},
    )


def test_the_upgrade_copies_each_roots_group_and_name(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    long_name = "f" * 300
    try:
        with engine.begin() as conn:
            config = alembic_config(conn)
            command.upgrade(config, "0011")
            _insert(conn, "wf", '{"troth:invoke": "billing", "troth:func": "publish"}')
            _insert(conn, "wf.0", '{"troth:kind": "run", "troth:func": "send"}')
            _insert(conn, "nameless", '{"troth:invoke": "billing"}')
            _insert(conn, "long", '{"troth:invoke": "g", "troth:func": "' + long_name + '"}')
            _insert(conn, "plain", '{"team": "a"}')
            command.upgrade(config, "head")
            rows = conn.execute(
                sa.text("SELECT id, workflow_group, workflow_name FROM promises")
            ).all()
    finally:
        engine.dispose()
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        "wf": ("billing", "publish"),
        "wf.0": (None, None),
        "nameless": ("billing", None),
        "long": ("g", None),  # longer than a workflow name may be (tasks.workflow too)
        "plain": (None, None),
    }


def test_a_root_written_now_is_listed_and_nothing_else_is(db_url: str) -> None:
    store = open_store(db_url, migrate=True)
    try:

        def promise(promise_id: str, tags: dict[str, str], parent: str | None = None) -> Promise:
            return Promise(
                id=promise_id, state=PromiseState.PENDING, param=EMPTY, value=EMPTY,
                tags=tags, create_time=T0, root_id=parent, parent_id=parent,
            )  # fmt: skip

        store.write(
            lambda tx: tx.insert_promises(
                [
                    promise("a", {"troth:invoke": "g1", "troth:func": "publish"}),
                    promise("a.0", {"troth:kind": "promise"}, "a"),
                    promise("b", {"troth:invoke": "g2", "troth:func": "review"}),
                    promise("alone", {}),
                ]
            )
        )
        listed = store.search_workflows(WorkflowQuery(limit=10), T0)
        assert [r.promise.id for r in listed] == ["b", "a"]
        by_group = store.search_workflows(WorkflowQuery(limit=10, groups=("g1",)), T0)
        assert [r.promise.id for r in by_group] == ["a"]
        by_name = store.search_workflows(WorkflowQuery(limit=10, workflow="review"), T0)
        assert [r.promise.id for r in by_name] == ["b"]
        human = store.search_workflows(WorkflowQuery(limit=10, waiting_for_human=True), T0)
        assert [r.promise.id for r in human] == ["a"]
        assert [p.id for p in store.pending_steps(["a", "b"])] == ["a.0"]
    finally:
        store.close()
