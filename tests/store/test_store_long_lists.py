"""Lists longer than a statement can bind, on SQLite and PostgreSQL.

PostgreSQL takes at most 65,535 parameters per statement (and SQLite a build-time
maximum, 32,766 by default): every store method that takes a collection of ids
splits it into statements of at most `MAX_BOUND_IDS`. Before, 70,000 ids were a
"store unavailable" error on PostgreSQL, though nothing was unavailable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from test_store import BACKENDS, T0, make

from troth_server.domain.task import Callback, Task, TaskKind, TaskState
from troth_server.store import Store, StoreError, WriteTx, open_store
from troth_server.store._bind import MAX_BOUND_IDS, check_sqlite_variables

N = 70_000
"""Ids bound per call: more than PostgreSQL's 65,535 parameters."""
STORED = 5_000
"""Of which rows exist (more than one statement's MAX_BOUND_IDS; few enough to be quick)."""
ROOT = "root"


@pytest.fixture(params=BACKENDS, scope="module")
def long_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """One store per back end holding a root and STORED pending promises."""
    make_url: Any = request.param
    context: AbstractContextManager[str] = make_url(tmp_path_factory.mktemp("long"))
    with context as url:
        store = open_store(url)
        promises = [make(ROOT), *(make(pid) for pid in IDS[:STORED])]
        store.write(lambda tx: tx.insert_promises(promises))
        yield store
        store.close()


IDS = [f"p{i:05}" for i in range(N)]


def test_the_limit_is_below_both_databases_parameter_limits() -> None:
    assert 2 * MAX_BOUND_IDS < 32_766 < 65_535  # delete_callbacks binds two lists


def test_promises_by_many_ids_are_read_and_locked(long_store: Store) -> None:
    found = long_store.write(lambda tx: tx.get_promises(set(IDS)))
    assert sorted(found) == IDS[:STORED] and found["p00000"].id == "p00000"
    assert len(long_store.get_promises(IDS)) == STORED


def test_callbacks_of_many_promises(long_store: Store) -> None:
    callbacks = [Callback(pid, ROOT, "g", "w") for pid in IDS[:STORED]]

    def register(tx: WriteTx) -> list[Callback]:
        tx.insert_callbacks(callbacks, T0)
        return tx.get_callbacks(IDS)

    assert len(long_store.write(register)) == STORED

    def drop(tx: WriteTx) -> list[Callback]:
        kept = IDS[STORED - 1]
        tx.delete_callbacks([i for i in IDS if i != kept], [f"other-root-{i}" for i in range(N)])
        return tx.get_callbacks(IDS)

    assert [c.promise_id for c in long_store.write(drop)] == [IDS[STORED - 1]]
    long_store.write(lambda tx: tx.delete_callbacks([], [ROOT]))
    assert long_store.write(lambda tx: tx.get_callbacks(IDS)) == []


def test_tasks_and_steps_by_many_ids(long_store: Store) -> None:
    task = Task("t1", ROOT, "g", TaskKind.INVOKE, TaskState.PENDING, 1)

    def read(tx: WriteTx) -> tuple[Any, ...]:
        tx.insert_tasks([task], T0)
        many = ["t1", *(f"t-{i}" for i in range(N))]
        roots = [ROOT, *IDS]
        return (
            tx.get_tasks(many),
            tx.get_tasks(many, lock=False),
            tx.get_active_tasks(roots),
            tx.root_workflows(roots),
            tx.pending_step_ids(roots),
        )

    tasks, peeked, active, workflows, steps = long_store.write(read)
    assert set(tasks) == set(peeked) == {"t1"}
    assert set(active) == {ROOT}
    assert len(workflows) == STORED + 1
    assert steps == []
    assert long_store.claimed_task_ids([f"w{i}" for i in range(N)]) == set()


def test_a_sqlite_that_binds_too_few_parameters_is_refused() -> None:
    conn = sqlite3.connect(":memory:")
    try:
        check_sqlite_variables(conn)  # this build's limit suffices
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # the default before 3.32
        with pytest.raises(StoreError, match="binds at most 999 parameters"):
            check_sqlite_variables(conn)
    finally:
        conn.close()
