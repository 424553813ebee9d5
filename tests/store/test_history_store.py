"""History does not accumulate: completed tasks are deleted, settled promises pruned.

Both dialects (the `store` fixture of the conformance suite). Retention keys on
settle time; a workflow goes whole (root and every step, child workflows
included) or not at all, and only once it is over.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import test_store
from test_store import T0, insert, make

from troth_server.domain.promise import PromiseState
from troth_server.domain.task import Callback, Task, TaskKind, TaskState
from troth_server.store import PruneBatch, Store, open_store

store_url = test_store.store_url  # the conformance suite's databases: both dialects


@pytest.fixture
def db(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


INVOKE = {"troth:invoke": "g", "troth:func": "wf"}
DAY = 86_400_000


def _settled(promise_id: str, settle_time: int, **links: Any) -> Any:
    promise = make(promise_id, state=PromiseState.RESOLVED, tags=links.pop("tags", None))
    return replace(promise, settle_time=settle_time, **links)


def _step(promise_id: str, root: str, settle_time: int | None, parent: str | None = None) -> Any:
    if settle_time is None:
        return replace(make(promise_id), root_id=root, parent_id=parent or root)
    return _settled(promise_id, settle_time, root_id=root, parent_id=parent or root)


def _ids(store: Store) -> set[str]:
    return {p.id for p in store.get_promises([f"{n}" for n in _ALL])}


_ALL = [
    "alone-old", "alone-new", "alone-pending",
    "wf-done", "wf-done.0", "wf-done.1", "wf-done.1.0",
    "wf-late", "wf-late.0",
    "wf-running", "wf-running.0",
    "wf-open", "wf-open.0",
]  # fmt: skip


def _fill(store: Store) -> None:
    old, new = T0, T0 + 10 * DAY
    insert(
        store,
        _settled("alone-old", old),
        _settled("alone-new", new),
        make("alone-pending"),
        # A finished workflow with a child workflow (`.1`, whose step is `.1.0`).
        _settled("wf-done", old, tags=INVOKE),
        _step("wf-done.0", "wf-done", old),
        replace(_step("wf-done.1", "wf-done", old), tags=INVOKE),
        _step("wf-done.1.0", "wf-done", old, parent="wf-done.1"),
        # Its root settled long ago, but a compensation step was recorded later.
        _settled("wf-late", old, tags=INVOKE),
        _step("wf-late.0", "wf-late", new),
        # Cancelled long ago, still running compensation (its task is CLAIMED).
        _settled("wf-running", old, tags=INVOKE),
        _step("wf-running.0", "wf-running", old),
        # A root settled, a step still pending (never happens, but never a half tree).
        _settled("wf-open", old, tags=INVOKE),
        _step("wf-open.0", "wf-open", None),
    )
    running = Task("t-running", "wf-running", "g", TaskKind.RESUME, TaskState.CLAIMED, 1, "w", T0)
    store.write(lambda tx: tx.insert_tasks([running], T0))
    store.write(lambda tx: tx.insert_callbacks([Callback("alone-old", "wf-done", "g")], T0))


def test_retention_prunes_finished_workflows_whole_and_settled_standalone_promises(
    db: Store,
) -> None:
    _fill(db)
    cutoff = T0 + DAY
    counted = db.write(lambda tx: tx.prune_settled(cutoff, None, 100, delete=False))
    assert counted == PruneBatch(promises=5, workflows=1, standalone=1, after=None)
    assert _ids(db) == set(_ALL)  # a dry run deletes nothing

    pruned = db.write(lambda tx: tx.prune_settled(cutoff, None, 100, delete=True))
    assert pruned == counted
    assert _ids(db) == set(_ALL) - {
        "alone-old", "wf-done", "wf-done.0", "wf-done.1", "wf-done.1.0",
    }  # fmt: skip
    assert db.write(lambda tx: tx.get_callbacks(["alone-old"])) == []
    # What was kept back is kept until it qualifies: the late step's time passes.
    later = db.write(lambda tx: tx.prune_settled(T0 + 11 * DAY, None, 100, delete=True))
    assert later.workflows == 1 and later.standalone == 1  # wf-late, alone-new
    assert _ids(db) == {"alone-pending", "wf-running", "wf-running.0", "wf-open", "wf-open.0"}


def test_retention_batches_follow_settle_time_with_a_cursor(db: Store) -> None:
    insert(db, *[_settled(f"p{n}", T0 + n) for n in range(7)])
    seen, after = 0, None
    batches = 0
    while True:
        batch = db.write(lambda tx, at=after: tx.prune_settled(T0 + 100, at, 3, delete=False))
        seen += batch.standalone
        batches += 1
        if batch.after is None:
            break
        after = batch.after
    assert (seen, batches) == (7, 3)
    # Nothing settled after the cutoff is a candidate.
    assert db.write(lambda tx: tx.prune_settled(T0 + 2, None, 10, delete=True)).standalone == 3


def test_completed_tasks_are_deleted_once_their_keeping_is_over(db: Store) -> None:
    insert(db, make("r1", tags=INVOKE), make("r2", tags=INVOKE))
    t1 = Task("t1", "r1", "g", TaskKind.INVOKE, TaskState.CLAIMED, 1, "w", T0 + 9)
    t2 = Task("t2", "r2", "g", TaskKind.INVOKE, TaskState.CLAIMED, 1, "w", T0 + 9)
    db.write(lambda tx: tx.insert_tasks([t1, t2], T0))
    done = replace(t1, state=TaskState.COMPLETED, lease_expire_time=None)
    db.write(lambda tx: tx.update_tasks([done], T0 + 5))
    # A repeat of the completion (a lost reply) keeps the first completion's time.
    again = db.write(lambda tx: tx.get_tasks(["t1"]))["t1"]
    assert again.complete_time == T0 + 5
    db.write(lambda tx: tx.update_tasks([again], T0 + 50))
    assert db.write(lambda tx: tx.get_tasks(["t1"]))["t1"].complete_time == T0 + 5

    assert db.write(lambda tx: tx.delete_completed_tasks(T0 + 4, 10)) == 0
    assert db.write(lambda tx: tx.delete_completed_tasks(T0 + 5, 10)) == 1
    assert set(db.write(lambda tx: tx.get_tasks(["t1", "t2"]))) == {"t2"}  # CLAIMED stays
